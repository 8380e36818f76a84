"""Each producer's sequence ids through a topic's ledgers: what cannot be legitimate is a finding, everything
Pulsar does legitimately is a statistic, and a ledger validated alone from the checkpoint finds what the
whole topic validated at once finds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from scrutiny.checks import DeepAnswer
from scrutiny.checks.sequences import (
    TXN_ABORT,
    TXN_COMMIT,
    DedupSnapshot,
    LedgerSequences,
    MessageCheckpoint,
    validate,
)
from scrutiny.errors import DataError
from scrutiny.pulsar import encode
from scrutiny.pulsar.entry import LedgerEnvelopes, read_envelope
from scrutiny.pulsar.records import Position

TOPIC = "persistent://acme/orders/created"
Entry = tuple[str, int, dict[str, object]]  # producer, first sequence id, encode.message's keywords


def ledger(lid: int, entries: Sequence[Entry], copies: int = 1, drop: int | None = None) -> LedgerSequences:
    """A ledger's sequences from `copies` bookies, each holding every `copies`-th entry (`drop`: none has it)."""
    envs = [(e, read_envelope(encode.message(p, s, **kw))) for e, (p, s, kw) in enumerate(entries)  # type: ignore
            if e != drop]
    deep = {f"b{k}:3181": DeepAnswer(np.array([e for e, _ in envs[k::copies]], dtype=np.int64),
                                     envelopes=LedgerEnvelopes.gather(envs[k::copies])) for k in range(copies)}
    return LedgerSequences.of(lid, TOPIC, len(entries) - 1, deep)


def plain(producer: str, ids: Sequence[int], **kw: object) -> list[Entry]:
    return [(producer, s, dict(kw)) for s in ids]


def run(*ledgers: LedgerSequences, checkpoint: MessageCheckpoint | None = None,
        dedup: DedupSnapshot | None = None) -> tuple[list[tuple[str, int]], MessageCheckpoint]:
    v = validate(checkpoint or MessageCheckpoint(), [led.ledger_id for led in ledgers],
                 {led.ledger_id: led for led in ledgers}, dedup)
    return [(str(x.category), x.ledger_id) for x in v.violations], v.checkpoint


def test_what_pulsar_does_legitimately_is_counted_never_reported() -> None:
    one = ledger(1, plain("p", [0, 1, 2, 7, 8]) + plain("p", [0, 1]) + plain("q", [5, 5, 5])  # gap, restart, repeats
                 + [("p", 9, {"chunk": (0, 2)}), ("p", 9, {"chunk": (1, 2)})]  # a chunked message shares its id
                 + [("m", 0, {"marker_type": 2}), ("p", 3, {"transaction": (1, 2)}),
                    ("p", 4, {"replicated_from": "west"})], copies=2)
    two = ledger(2, plain("p", [0, 1]) + plain("q", [6, 20]))  # across ledgers: p restarts, q leaps
    found, cp = run(one, two)
    assert found == []
    assert cp.position == Position(2, 3)
    assert cp.stats["sequence_gaps"] == 2 and cp.stats["producer_restarts"] == 2
    assert cp.stats["repeats"] == 3 and cp.stats["markers"] == 1
    # every entry but the marker, the chunked message once, and the transaction's (held: no outcome read yet)
    assert cp.stats["messages_validated"] == 16 and cp.transactions == {(1, 2): 1}
    assert cp.producers["q"].highest == 20 and cp.producers["p"].seen_at == Position(2, 1)


def test_a_repeat_after_the_dedup_snapshot_inside_a_ledger_is_reported_and_only_that() -> None:
    entries = [*plain("p", [10, 11, 12, 11, 13]), ("p", 13, {"chunk": (1, 2)}), *plain("q", [1, 1])]
    dedup = DedupSnapshot(Position(1, 2), {"p": 12}, horizon=1)
    found, _ = run(ledger(1, entries), dedup=dedup)
    assert found == [("PULSAR_REPEAT_UNDER_DEDUP", 1)]
    v = validate(MessageCheckpoint(), [1], {1: ledger(1, entries)}, dedup).violations[0]
    assert v.details["producers"] == [{"producer": "p", "count": 1, "entry_id": 3, "sequence_id": 11,
                                       "highest_before": 12}]  # q is not in the snapshot: not judged
    assert run(ledger(1, entries), dedup=DedupSnapshot(Position(1, 4), {"p": 13}, 1))[0] == []  # before it: not judged
    assert run(ledger(1, entries))[0] == []  # no deduplication


def test_a_repeat_across_ledgers_is_never_a_finding() -> None:
    dedup = DedupSnapshot(Position(1, 0), {"p": 10}, horizon=2)
    found, cp = run(ledger(1, plain("p", [10, 11])), ledger(2, plain("p", [5, 6])), dedup=dedup)
    assert found == [] and cp.stats["repeats"] == 1


@pytest.mark.parametrize(("entries", "expected"), [
    (plain("p", [40, 41]), [("PULSAR_DEDUP_STATE_AHEAD_OF_DATA", 2)]),  # persisted 50, the highest stored 41
    (plain("p", [49, 50]), []),
    ([("p", 45, {"payloads": [b"a"] * 16})], []),  # a batch of 45..60 covers it
])
def test_a_dedup_snapshot_ahead_of_the_data_is_reported(entries: list[Entry],
                                                        expected: list[tuple[str, int]]) -> None:
    one = ledger(1, plain("p", [1, 2]))
    two = ledger(2, entries + plain("q", [1, 2, 3]))
    three = ledger(3, plain("p", [70]))  # listed after the snapshot was read: its messages do not hide the loss
    dedup = DedupSnapshot(Position(2, len(entries)), {"p": 50, "gone": 99}, horizon=2)  # "gone" never seen: not judged
    found, _ = run(one, two, three, dedup=dedup)
    assert found == expected


def test_the_snapshot_is_not_judged_until_every_ledger_up_to_it_was_read_whole() -> None:
    dedup = DedupSnapshot(Position(2, 1), {"p": 50}, horizon=2)
    v = validate(MessageCheckpoint(), [1, 2], {1: ledger(1, plain("p", [1, 2])),
                                               2: ledger(2, plain("p", [3, 4, 5]), copies=2, drop=1)}, dedup)
    assert v.violations == () and v.ledgers == (1,) and v.stopped_at == 2
    assert v.checkpoint.position == Position(1, 1)  # the next run goes on from ledger 2
    assert v.checkpoint.waiting == dedup  # and judges the snapshot then


def test_a_ledger_validated_alone_from_the_checkpoint_finds_what_the_whole_topic_does() -> None:
    ledgers = [ledger(1, plain("p", [1, 2, 3]) + plain("q", [1])), ledger(2, plain("p", [4, 4, 5])),
               ledger(3, plain("p", [6, 3]) + plain("q", [2]))]
    dedup = DedupSnapshot(Position(2, 0), {"p": 40, "q": 1}, horizon=2)
    whole = validate(MessageCheckpoint(), [1, 2, 3], {x.ledger_id: x for x in ledgers}, dedup)
    first = validate(MessageCheckpoint(), [1, 2], {x.ledger_id: x for x in ledgers[:2]}, dedup)
    saved = MessageCheckpoint.parse(first.checkpoint.to_bytes())
    assert saved == first.checkpoint
    alone = validate(saved, [1, 2, 3], {3: ledgers[2]}, dedup)  # read again: judged again, not reported again
    assert alone.ledgers == (3,)
    assert {(str(v.category), v.ledger_id) for v in first.violations + alone.violations} == \
        {(str(v.category), v.ledger_id) for v in whole.violations}
    judged = "dedup_snapshots_judged"
    assert alone.checkpoint.stats[judged] == 2 and whole.checkpoint.stats[judged] == 1
    assert replace(alone.checkpoint, stats={**alone.checkpoint.stats, judged: 1}) == whole.checkpoint
    assert {str(v.category) for v in whole.violations} == {"PULSAR_REPEAT_UNDER_DEDUP",
                                                           "PULSAR_DEDUP_STATE_AHEAD_OF_DATA"}


def test_a_checkpoint_whose_ledger_was_trimmed_starts_again() -> None:
    cp = MessageCheckpoint(Position(1, 9), {"p": validate(MessageCheckpoint(), [1], {1: ledger(1, plain("p", [1]))},
                                                          None).checkpoint.producers["p"]})
    dedup = DedupSnapshot(Position(5, 0), {"p": 50}, horizon=5)
    v = validate(cp, [5], {5: ledger(5, plain("p", [60]))}, dedup)  # what lay between is unknown: no finding
    assert v.violations == () and v.checkpoint.stats["checkpoint_resets"] == 1


def test_an_unreadable_checkpoint_says_so() -> None:
    with pytest.raises(DataError, match="message checkpoint"):
        MessageCheckpoint.parse(b'{"position": [1]}')


def test_a_finding_stands_in_every_later_validation_while_its_ledger_is_the_topics() -> None:
    dedup = DedupSnapshot(Position(1, 1), {"p": 50}, horizon=1)
    first = validate(MessageCheckpoint(), [1], {1: ledger(1, plain("p", [1, 2]))}, dedup)
    assert [str(v.category) for v in first.violations] == ["PULSAR_DEDUP_STATE_AHEAD_OF_DATA"]
    kept = MessageCheckpoint.parse(first.checkpoint.to_bytes())
    later = validate(kept, [1, 2], {2: ledger(2, plain("p", [60]))}, DedupSnapshot(Position(2, 0), {"p": 60}, 2))
    assert [(str(v.category), v.ledger_id) for v in later.violations] == [("PULSAR_DEDUP_STATE_AHEAD_OF_DATA", 1)]
    assert later.violations[0].details == first.violations[0].details  # the verdict on the snapshot it judged
    trimmed = validate(later.checkpoint, [2, 3], {3: ledger(3, plain("p", [61]))}, None)
    assert trimmed.violations == () and trimmed.ledgers == (3,)


def txn(producer: str, ids: Sequence[int], transaction: tuple[int, int]) -> list[Entry]:
    return [(producer, s, {"transaction": transaction}) for s in ids]


def outcome(transaction: tuple[int, int], committed: bool) -> Entry:
    return ("m", 0, {"marker_type": TXN_COMMIT if committed else TXN_ABORT, "transaction": transaction})


def test_a_transactions_messages_count_once_its_outcome_is_read_and_aborted_ones_apart() -> None:
    """As a consumer receives them: a committed transaction's messages, never an aborted one's; a transaction's
    outcome may be in a later ledger than its messages, validated in a later run (the checkpoint holds them)."""
    one = ledger(1, txn("p", [1, 2, 3], (0, 7)) + txn("p", [4, 5], (0, 8)) + [outcome((0, 7), True)]
                 + plain("q", [1]) + txn("p", [6], (1, 9)), copies=2)
    found, cp = run(one)
    assert found == [] and cp.stats["messages_validated"] == 3 + 1
    assert cp.transactions == {(0, 8): 2, (1, 9): 1}
    cp = MessageCheckpoint.parse(cp.to_bytes())  # kept between runs
    two = ledger(2, [outcome((0, 8), False), outcome((1, 9), True), outcome((5, 5), False)])
    found, cp = run(one, two, checkpoint=cp)
    assert found == [] and cp.transactions == {}
    assert (cp.stats["messages_validated"], cp.stats["messages_aborted"]) == (3 + 1 + 1, 2)
    assert (cp.stats["transactions_committed"], cp.stats["transactions_aborted"]) == (2, 2)
    assert cp.stats["markers"] == 4
    # a lost ledger may have held their outcomes: nothing is known of the open ones after it
    v = validate(MessageCheckpoint(), [1, 3, 2], {1: one, 2: two}, None, lost={3})
    assert v.checkpoint.stats["messages_aborted"] == 0 and v.checkpoint.transactions == {}


def test_a_lost_ledger_is_a_hole_the_validation_starts_again_after() -> None:
    dedup = DedupSnapshot(Position(3, 0), {"p": 50}, horizon=3)
    ledgers = {1: ledger(1, plain("p", [1, 2])), 3: ledger(3, plain("p", [40, 41]))}
    v = validate(MessageCheckpoint(), [1, 2, 3], ledgers, dedup, lost={2})
    assert v.ledgers == (1, 3) and v.stopped_at is None and v.checkpoint.position == Position(3, 1)
    # after the hole p is known from ledger 3 only; its ids only grow, so the 50 persisted by 3:0 came after its
    # 40 at 3:0, in what was read whole: gone
    assert [str(x.category) for x in v.violations] == ["PULSAR_DEDUP_STATE_AHEAD_OF_DATA"]
    assert v.checkpoint.stats["restarts_after_a_lost_ledger"] == 1
    assert validate(MessageCheckpoint(), [1, 2, 3], ledgers, dedup).stopped_at == 2  # not known lost: it waits


def test_a_snapshot_holding_ids_persisted_after_its_position_is_judged_at_its_horizon() -> None:
    """A broker purging an inactive producer writes the current ids at the old mark-delete: the snapshot at 1:1
    holds q's 30, persisted in ledger 3. Judged through ledger 2 it would say q's messages are gone; it is judged
    once the horizon (the head when it was read, ledger 3) is validated, in a later run: nothing is gone."""
    purge = DedupSnapshot(Position(1, 1), {"p": 2, "q": 30}, horizon=3)
    one, two = ledger(1, plain("p", [1, 2])), ledger(2, plain("q", [10, 11]))
    first = validate(MessageCheckpoint(), [1, 2, 3], {1: one, 2: two}, purge)  # 3 is the open head
    assert first.violations == () and first.stopped_at == 3
    assert first.checkpoint.waiting == purge and "dedup_snapshots_judged" not in first.checkpoint.stats
    kept = MessageCheckpoint.parse(first.checkpoint.to_bytes())
    assert kept == first.checkpoint
    newer = DedupSnapshot(Position(3, 1), {"p": 2, "q": 31}, horizon=4)  # the next run reads a newer one: it waits
    later = validate(kept, [1, 2, 3, 4], {3: ledger(3, plain("q", [29, 30, 31]))}, newer)
    assert later.violations == () and later.checkpoint.stats["dedup_snapshots_judged"] == 1
    assert later.checkpoint.waiting == newer
    # had ledger 3 lost q's 30 and 31, the snapshot waiting would say so once judged
    lost = validate(kept, [1, 2, 3, 4], {3: ledger(3, plain("q", [29]))}, newer)
    assert [(str(v.category), v.ledger_id, v.details["horizon"]) for v in lost.violations] == \
        [("PULSAR_DEDUP_STATE_AHEAD_OF_DATA", 1, 3)]
    assert lost.violations[0].details["producers"] == [{"producer": "q", "persisted": 30, "highest_stored": 29,
                                                        "last_seen": "3:0"}]


def test_an_idle_topics_snapshot_is_judged_in_the_run_that_reads_it() -> None:
    """A topic whose last ledger is closed (unloaded): the horizon is validated in the same run."""
    dedup = DedupSnapshot(Position(2, 0), {"p": 9}, horizon=2)
    v = validate(MessageCheckpoint(), [1, 2], {1: ledger(1, plain("p", [1, 2])), 2: ledger(2, plain("p", [3]))}, dedup)
    assert [str(x.category) for x in v.violations] == ["PULSAR_DEDUP_STATE_AHEAD_OF_DATA"]
    assert v.checkpoint.waiting is None
    again = validate(v.checkpoint, [1, 2], {}, dedup)  # read again, unchanged: judged, not reported twice
    assert len(again.violations) == 1 and again.checkpoint.stats["dedup_snapshots_judged"] == 2


def test_a_snapshot_whose_horizon_is_not_the_topics_is_dropped() -> None:
    """Its horizon trimmed, or a topic deleted and created again under the same name: nothing to judge it against."""
    stale = MessageCheckpoint(Position(2, 0), waiting=DedupSnapshot(Position(2, 0), {"p": 9}, horizon=3))
    v = validate(stale, [7, 8], {7: ledger(7, plain("p", [1]))}, None)
    assert v.violations == () and v.checkpoint.waiting is None


def test_entries_lost_on_every_copy_are_validated_as_lost_so_the_snapshot_names_whose_they_were() -> None:
    """A topic's last ledger lost on every bookie (each having answered): not a ledger to wait for, a loss. What is
    left of it is validated, and deduplication's snapshot says whose acknowledged messages are gone."""
    dedup = DedupSnapshot(Position(2, 4), {"p": 15}, horizon=2)
    one = ledger(1, plain("p", range(1, 11)))
    gone = LedgerSequences.of(2, TOPIC, 4, {}, rest_lost=True)
    assert gone.complete and gone.lost == 5
    v = validate(MessageCheckpoint(), [1, 2], {1: one, 2: gone}, dedup)
    assert v.stopped_at is None and v.checkpoint.stats["entries_lost"] == 5
    assert [x.details["producers"] for x in v.violations] == [
        [{"producer": "p", "persisted": 15, "highest_stored": 10, "last_seen": "1:9"}]]
    assert validate(MessageCheckpoint(), [1, 2], {1: one, 2: LedgerSequences.of(2, TOPIC, 4, {})},
                    dedup).stopped_at == 2  # not known lost: it waits
