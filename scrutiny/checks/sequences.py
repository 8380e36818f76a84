"""Every acknowledged message accounted for (Venice's data integrity validation, over what the bookies hold):
each producer's sequence ids followed through a topic's ledgers in the managed ledger's order.

Two steps, so that a ledger closed since the last look is validated alone:
- `LedgerSequences.of` (on the executor, per ledger): the ledger's verified envelopes, each entry once, folded
  per producer into a `ProducerRun` (first and last ids, the highest, what repeated inside the ledger);
- `validate` (on the driver, per topic): the runs of the ledgers after the topic's `MessageCheckpoint`, in
  order, against the checkpoint's producers and Pulsar's deduplication snapshot (cursor `pulsar.dedup`).

Only what cannot be legitimate is a finding: deduplication's snapshot ahead of the data (acknowledged
messages gone), and a repeat the broker's deduplication would have dropped. Gaps, restarts, repeats without
deduplication and markers are statistics (`docs/formats.md` 20). A transaction's messages count once its
commit marker is read (what consumers receive), apart once its abort marker is; until then they are held in
the checkpoint, open. Pure."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from scrutiny.categories import Category
from scrutiny.checks.deep import DeepAnswer
from scrutiny.checks.violation import Violation
from scrutiny.errors import DataError
from scrutiny.pulsar.entry import LedgerEnvelopes, Stamp
from scrutiny.pulsar.records import Position

MAX_REPEATS_KEPT = 20  # per producer and ledger: the positions a finding names
MAX_STANDING = 50  # per topic checkpoint: the findings it keeps standing (the latest)
MAX_PRODUCERS_KEPT = 1000  # per topic checkpoint: the producers seen last (a forgotten one is only unseen)
MAX_OPEN_TRANSACTIONS_KEPT = 10000  # per topic checkpoint: the transactions without an outcome, the latest
TXN_COMMIT, TXN_ABORT = 21, 22  # MarkerType: a transaction's outcome, written on each partition it wrote on
DEDUP_CURSOR = "pulsar.dedup"
_EXCUSED = int(Stamp.CHUNK | Stamp.TRANSACTION | Stamp.REPLICATED)  # a repeat that may be legitimate
_SKIPPED = int(Stamp.MARKER | Stamp.UNREADABLE)
_TRANSACTION = int(Stamp.TRANSACTION)
_CHUNK = int(Stamp.CHUNK)


@dataclass(frozen=True, slots=True)
class ProducerRun:
    """One producer's messages in one ledger."""

    first_entry: int
    first_id: int  # its first entry's first sequence id
    first_stamps: int
    last_entry: int
    last_id: int
    highest: int
    messages: int = 0
    gaps: int = 0  # inside the ledger: a next id beyond the highest + 1
    restarts: int = 0  # inside the ledger: back to 0
    repeats: tuple[tuple[int, int, int], ...] = ()  # inside the ledger: (entry, first id, highest before), unexcused
    repeats_count: int = 0


@dataclass(frozen=True)
class LedgerSequences:
    """What one ledger's messages say, per producer; `complete` when every entry had a verified copy, or those
    without are known `lost` (no copy on any bookie of its write set, every one of them having answered)."""

    ledger_id: int
    topic: str
    entries: int
    complete: bool
    producers: Mapping[str, ProducerRun] = field(default_factory=dict)
    markers: int = 0
    not_messages: int = 0
    lost: int = 0
    transactional: Mapping[tuple[int, int], int] = field(default_factory=dict)  # a transaction's messages here
    outcomes: Mapping[tuple[int, int], bool] = field(default_factory=dict)  # markers here: committed, or aborted

    @staticmethod
    def of(ledger_id: int, topic: str, last_entry_id: int, deep: Mapping[str, DeepAnswer],
           rest_lost: bool = False) -> LedgerSequences:
        """From every copy's envelopes, each entry taken once (verified copies carry the same payload);
        `rest_lost`: the entries without a verified copy are lost."""
        envs = [a.envelopes for _, a in sorted(deep.items()) if a.envelopes is not None and a.envelopes.entry_ids.size]
        ids, producer, first, last, messages, stamps, names = _union(envs)
        txns = {eid: t for e in envs for eid, t in e.transactions.items()}  # a copy's are every copy's
        transactional: Counter[tuple[int, int]] = Counter()
        outcomes: dict[tuple[int, int], bool] = {}
        entries = last_entry_id + 1
        complete = rest_lost or (ids.size == entries and (entries == 0 or int(ids[-1]) == last_entry_id))
        runs: dict[str, ProducerRun] = {}
        markers = not_messages = 0
        for i in range(ids.size):
            s = int(stamps[i])
            txn = txns.get(int(ids[i])) if s & _TRANSACTION else None
            if s & _SKIPPED:
                markers += bool(s & int(Stamp.MARKER))
                not_messages += bool(s & int(Stamp.UNREADABLE))
                if txn is not None and txn[2] in (TXN_COMMIT, TXN_ABORT):
                    outcomes[txn[:2]] = txn[2] == TXN_COMMIT
                continue
            if txn is not None:
                transactional[txn[:2]] += int(messages[i])
            name = names[int(producer[i])]
            runs[name] = _step(runs.get(name), int(ids[i]), int(first[i]), int(last[i]), int(messages[i]), s)
        return LedgerSequences(ledger_id, topic, entries, complete, runs, markers, not_messages,
                               entries - int(ids.size) if rest_lost else 0, dict(transactional), outcomes)


def _union(envs: Sequence[LedgerEnvelopes]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                     np.ndarray, list[str]]:
    names: list[str] = []
    remapped = []
    for e in envs:
        index = {n: i for i, n in enumerate(names)}
        mapping = np.array([index.setdefault(n, len(index)) for n in e.producers] or [0], dtype=np.int32)
        names = list(index)
        remapped.append(np.where(e.producer >= 0, mapping[np.maximum(e.producer, 0)], -1))
    if not envs:
        empty = np.empty(0, np.int64)
        return empty, empty, empty, empty, empty, empty, names
    ids = np.concatenate([e.entry_ids for e in envs])
    ids, at = np.unique(ids, return_index=True)  # the first copy's envelope of each entry
    cols = [np.concatenate(c)[at] for c in (remapped, [e.first_sequence_ids for e in envs],
                                            [e.last_sequence_ids for e in envs], [e.messages for e in envs],
                                            [e.stamps for e in envs])]
    return ids, cols[0], cols[1], cols[2], cols[3], cols[4], names


def _against(first: int, stamps: int, highest: int, last_id: int) -> str:
    """A producer's next first id against what it sent before: "gap", "restart" (at 0), "repeat", or "" in
    order (a chunk carrying the last id is the same message going on)."""
    if first > highest + 1:
        return "gap"
    if first > highest or (stamps & _CHUNK and first == last_id):
        return ""
    return "restart" if first == 0 else "repeat"


_STATS = {"gap": "sequence_gaps", "restart": "producer_restarts", "repeat": "repeats"}


def _step(run: ProducerRun | None, entry: int, first: int, last: int, messages: int, stamps: int) -> ProducerRun:
    if run is None:
        return ProducerRun(entry, first, stamps, entry, last, last, messages)
    gaps, restarts, repeats, count = run.gaps, run.restarts, run.repeats, run.repeats_count
    how = _against(first, stamps, run.highest, run.last_id)
    if how == "gap":
        gaps += 1
    elif how == "restart":
        restarts += 1
    elif how == "repeat" and not stamps & _EXCUSED:
        count += 1
        if len(repeats) < MAX_REPEATS_KEPT:
            repeats += ((entry, first, run.highest),)
    return replace(run, last_entry=entry, last_id=last, highest=max(run.highest, last),
                   messages=run.messages + messages, gaps=gaps, restarts=restarts, repeats=repeats, repeats_count=count)


@dataclass(frozen=True, slots=True)
class ProducerState:
    highest: int
    last_id: int
    seen_at: Position  # its last entry validated


@dataclass(frozen=True)
class DedupSnapshot:
    """Cursor `pulsar.dedup`'s mark-delete and its properties: each producer's highest sequence id persisted when
    the broker wrote them, which may be later than `position` (purging an inactive producer writes the current
    ids at the old mark-delete: `MessageDeduplication.purgeInactiveProducers`; a timer's snapshot copies them
    after reading the last add). All were persisted before the snapshot was read, in a ledger the topic listed
    then: `horizon` is the last ledger of the topic's record read no sooner than the snapshot."""

    position: Position
    highest: Mapping[str, int]
    horizon: int

    def to_json(self) -> list[object]:
        return [list(self.position), dict(self.highest), self.horizon]

    @staticmethod
    def from_json(doc: list[Any]) -> DedupSnapshot:
        pos, highest, horizon = doc
        return DedupSnapshot(Position(int(pos[0]), int(pos[1])), {str(k): int(v) for k, v in highest.items()},
                             int(horizon))


@dataclass(frozen=True)
class MessageCheckpoint:
    """Where a topic's validation stands: validated through `position` (a closed ledger's last entry), with
    each producer's state there, the statistics so far, the findings the validation made, which stand while
    their ledger is the topic's (a ledger is validated once), the deduplication snapshot `waiting` for the
    validation to reach its horizon, and the transactions read without their outcome yet (their messages). Kept by
    the leaders, one record a topic."""

    position: Position | None = None
    producers: Mapping[str, ProducerState] = field(default_factory=dict)
    stats: Mapping[str, int] = field(default_factory=dict)
    standing: tuple[Violation, ...] = ()
    waiting: DedupSnapshot | None = None
    transactions: Mapping[tuple[int, int], int] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return json.dumps({"position": list(self.position) if self.position else None,
                           "producers": {p: [s.highest, s.last_id, *s.seen_at] for p, s in self.producers.items()},
                           "stats": dict(self.stats),
                           "standing": [[str(v.category), v.ledger_id, dict(v.details)] for v in self.standing],
                           "waiting": self.waiting.to_json() if self.waiting else None,
                           "transactions": [[*t, n] for t, n in self.transactions.items()]},
                          sort_keys=True).encode()

    @staticmethod
    def parse(data: bytes, where: str = "a topic's message checkpoint") -> MessageCheckpoint:
        try:
            doc = json.loads(data)
            pos = doc["position"]
            producers = {str(p): ProducerState(int(v[0]), int(v[1]), Position(int(v[2]), int(v[3])))
                         for p, v in doc["producers"].items()}
            standing = tuple(Violation(Category(c), int(lid), (), dict(d)) for c, lid, d in doc.get("standing", []))
            waiting = DedupSnapshot.from_json(doc["waiting"]) if doc.get("waiting") else None
            open_ = {(int(most), int(least)): int(n) for most, least, n in doc.get("transactions", [])}
            return MessageCheckpoint(Position(int(pos[0]), int(pos[1])) if pos else None, producers,
                                     {str(k): int(v) for k, v in doc.get("stats", {}).items()}, standing, waiting,
                                     open_)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise DataError(f"{where}: unreadable ({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True)
class Validation:
    """A topic's validation: its new checkpoint; the findings (those standing in the checkpoint whose ledger
    the topic still lists, and the new ones); the ledgers validated; where it stopped, and why not further."""

    checkpoint: MessageCheckpoint
    violations: tuple[Violation, ...] = ()
    ledgers: tuple[int, ...] = ()  # validated, in order
    stopped_at: int | None = None  # the first ledger that could not be (a copy unverified, not read this run)


def validate(checkpoint: MessageCheckpoint, order: Sequence[int], read: Mapping[int, LedgerSequences],
             dedup: DedupSnapshot | None, lost: Collection[int] = ()) -> Validation:
    """The topic's closed ledgers in BookKeeper (`order`: the managed ledger's, after any offloaded away) past
    the checkpoint, folded in order while each was read whole in this run. A ledger `lost` (listed, and gone
    from BookKeeper: TOPIC_LEDGER_MISSING says so) is a hole: the validation starts again after it, knowing no
    producer. The deduplication snapshot is judged once the fold has validated its horizon, in this run or a
    later one (the checkpoint keeps one waiting)."""
    start = 0
    if checkpoint.position is not None and checkpoint.position.ledger_id in order:
        start = order.index(checkpoint.position.ledger_id) + 1
    elif checkpoint.position is not None:
        # trimmed since: what lay between it and the record's first ledger is unknown, so nothing is known
        checkpoint = MessageCheckpoint(stats={**checkpoint.stats, "checkpoint_resets": 1 + checkpoint.stats.get(
            "checkpoint_resets", 0)}, standing=checkpoint.standing, waiting=checkpoint.waiting)
    state = dict(checkpoint.producers)
    open_ = dict(checkpoint.transactions)
    stats: Counter[str] = Counter(checkpoint.stats)
    found = [v for v in checkpoint.standing if v.ledger_id in order]
    position = checkpoint.position
    done: list[int] = []
    stopped = None
    # the snapshot kept waiting, then this run's: each judged once the fold has validated its horizon
    waiting = [s for s in (checkpoint.waiting, dedup) if s is not None and s.horizon in order]
    if len(waiting) == 2 and waiting[0] == waiting[1]:
        waiting.pop()

    def judge() -> None:
        if position is None or position.ledger_id not in order:
            return
        for snap in [s for s in waiting if order.index(position.ledger_id) >= order.index(s.horizon)]:
            waiting.remove(snap)
            stats["dedup_snapshots_judged"] += 1
            if not any(v.details.get("dedup_snapshot") == str(snap.position) for v in found
                       if v.category is Category.PULSAR_DEDUP_STATE_AHEAD_OF_DATA):
                found.extend(_ahead(snap, state))

    judge()
    for lid in order[start:]:
        if lid in lost:
            state.clear()
            open_.clear()  # their outcomes may have been in it
            stats["restarts_after_a_lost_ledger"] += 1
            position = Position(lid, -1)
            continue
        led = read.get(lid)
        if led is None or not led.complete:
            stopped = lid
            break
        found += _fold(led, state, stats, dedup)
        _settle(led, open_, stats)
        done.append(lid)
        position = Position(lid, led.entries - 1)
        judge()
    if len(state) > MAX_PRODUCERS_KEPT:
        state = dict(sorted(state.items(), key=lambda kv: kv[1].seen_at)[-MAX_PRODUCERS_KEPT:])
    if len(open_) > MAX_OPEN_TRANSACTIONS_KEPT:
        open_ = dict(list(open_.items())[-MAX_OPEN_TRANSACTIONS_KEPT:])
    kept = MessageCheckpoint(position, state, dict(stats), tuple(found[-MAX_STANDING:]),
                             waiting[0] if waiting else None, open_)
    return Validation(kept, tuple(found), tuple(done), stopped)


def _settle(led: LedgerSequences, open_: dict[tuple[int, int], int], stats: Counter[str]) -> None:
    """A ledger's transactional messages held open, then the outcomes its markers say: a committed transaction's
    messages validated, an aborted one's apart (consumers never receive them)."""
    for txn, n in led.transactional.items():
        open_[txn] = open_.get(txn, 0) + n
    for txn, committed in led.outcomes.items():
        n = open_.pop(txn, 0)
        stats.update({"messages_validated" if committed else "messages_aborted": n,
                      "transactions_committed" if committed else "transactions_aborted": 1})


def _fold(led: LedgerSequences, state: dict[str, ProducerState], stats: Counter[str],
          dedup: DedupSnapshot | None) -> list[Violation]:
    stats.update(messages_validated=sum(r.messages for r in led.producers.values()) - sum(led.transactional.values()),
                 markers=led.markers, entries_not_messages=led.not_messages, entries_lost=led.lost)
    repeats: list[dict[str, object]] = []
    for name, run in sorted(led.producers.items()):
        before = state.get(name)
        stats.update(sequence_gaps=run.gaps, producer_restarts=run.restarts, repeats=run.repeats_count)
        # across ledgers: never a finding (a producer forgotten by an idle broker)
        if before is not None and (how := _against(run.first_id, run.first_stamps, before.highest, before.last_id)):
            stats[_STATS[how]] += 1
        state[name] = ProducerState(max(run.highest, before.highest) if before else run.highest, run.last_id,
                                    Position(led.ledger_id, run.last_entry))
        # Inside one ledger the broker cannot have forgotten the producer (it forgets one idle for
        # brokerDeduplicationProducerInactivityTimeoutMinutes, 360; a ledger rolls over within
        # managedLedgerMaxLedgerRolloverTimeMinutes, 240): a repeat after the snapshot is one it should have dropped
        if dedup is not None and name in dedup.highest:
            under = [r for r in run.repeats if Position(led.ledger_id, r[0]) > dedup.position]
            if under:
                repeats.append({"producer": name, "count": len(under), "entry_id": under[0][0],
                                "sequence_id": under[0][1], "highest_before": under[0][2]})
    if not repeats:
        return []
    return [Violation(Category.PULSAR_REPEAT_UNDER_DEDUP, led.ledger_id, (),
                      {"producers": repeats, "dedup_snapshot": str(dedup.position) if dedup else ""})]


def _ahead(dedup: DedupSnapshot, state: Mapping[str, ProducerState]) -> list[Violation]:
    """Producers whose highest id stored through the snapshot's horizon is below what the snapshot says was
    persisted: under deduplication a producer's ids only grow along the topic, every ledger between its last
    message seen and the horizon was read whole, and the message is gone."""
    behind = [{"producer": p, "persisted": s, "highest_stored": state[p].highest, "last_seen": str(state[p].seen_at)}
              for p, s in sorted(dedup.highest.items()) if p in state and state[p].highest < s]
    if not behind:
        return []
    return [Violation(Category.PULSAR_DEDUP_STATE_AHEAD_OF_DATA, dedup.position.ledger_id, (),
                      {"dedup_snapshot": str(dedup.position), "horizon": dedup.horizon, "producers": behind})]


def stitched(reads: Iterable[LedgerSequences]) -> dict[str, dict[int, LedgerSequences]]:
    """The ledgers read in a run, by topic."""
    out: dict[str, dict[int, LedgerSequences]] = {}
    for led in reads:
        out.setdefault(led.topic, {})[led.ledger_id] = led
    return out
