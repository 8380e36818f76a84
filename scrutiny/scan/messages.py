"""A deep run's messages phase: every acknowledged message accounted for. The executors summed up each topic
ledger they scrubbed (`LedgerSequences`); here each topic's ledgers are validated in the managed ledger's
order from where its last validation stopped (`MessageCheckpoint`, one leaders' record a topic: a ledger
closed since is validated alone, and the next leader goes on), against Pulsar's deduplication snapshot.
A deep pass scrubs a topic's ledgers in one run (`checks.messages.deep_slice_key`).

Every finding rests on the topic's record and BookKeeper's metadata read again no sooner than the re-check
delay: the ledger it names still listed and still in BookKeeper, and deduplication's snapshot still at or
past the position it was judged at."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from scrutiny.checks import Violation
from scrutiny.checks.sequences import (
    DEDUP_CURSOR,
    DedupSnapshot,
    LedgerSequences,
    MessageCheckpoint,
    Validation,
    stitched,
    validate,
)
from scrutiny.config import ScanSettings
from scrutiny.pulsar.owners import Owner
from scrutiny.pulsar.records import Position, url_encoded
from scrutiny.pulsar.snapshot import PulsarRecord, TopicRecord
from scrutiny.records import LeaderRecord
from scrutiny.runstats import Messages, RunFigures
from scrutiny.scan.cursorledgers import CursorLedgers
from scrutiny.scan.topics import pulsar_store
from scrutiny.store import MetadataStore

log = logging.getLogger(__name__)


def checkpoint_record(topic: str) -> LeaderRecord[MessageCheckpoint]:
    return LeaderRecord(f"message-checkpoints/{url_encoded(topic)}",
                        lambda data: MessageCheckpoint.parse(data, f"{topic}'s message checkpoint"),
                        MessageCheckpoint.to_bytes, MessageCheckpoint,
                        "the topic's messages are validated again from its first ledger")


def dedup_snapshot(topic: TopicRecord, cursors: CursorLedgers) -> tuple[Position, dict[str, int]] | None:
    """Cursor `pulsar.dedup`'s mark-delete and properties; None when deduplication is off, or they cannot be read."""
    cursor = topic.cursors.get(DEDUP_CURSOR)
    return cursors.mark_delete(topic.topic, cursor) if cursor is not None else None


def with_horizons(pulsar: MetadataStore, read: Mapping[str, tuple[Position, dict[str, int]] | None]
                  ) -> dict[str, DedupSnapshot | None]:
    """Each snapshot with its horizon: the topic's last ledger in its record read now, after the snapshot."""
    after = PulsarRecord.decode(pulsar.pulsar_records(sorted(t for t, s in read.items() if s is not None)))
    out: dict[str, DedupSnapshot | None] = {}
    for topic, snap in read.items():
        t = after.topic(topic) if snap is not None else None
        order = in_bookkeeper(t) if t is not None else []
        out[topic] = DedupSnapshot(snap[0], snap[1], order[-1]) if snap is not None and order else None
    return out


def in_bookkeeper(topic: TopicRecord) -> list[int]:
    """The topic's ledgers in order after the last one offloaded and deleted from BookKeeper on purpose."""
    ledgers = topic.managed_ledger.ledgers
    gone = [i for i, li in enumerate(ledgers) if li.gone_on_purpose]
    return [li.ledger_id for li in ledgers[(gone[-1] + 1 if gone else 0):]]


def unvalidated(store: MetadataStore, record: PulsarRecord, topics: Iterable[str]) -> frozenset[int]:
    """The ledgers of these topics after their checkpoints' (a topic never validated is left to the deep pass:
    its whole history is the deep scrub's to read, at its pace)."""
    out: set[int] = set()
    for topic in topics:
        t = record.topic(topic)
        done = checkpoint_record(topic).read(store).position
        if t is None or done is None:
            continue
        order = in_bookkeeper(t)
        if done.ledger_id in order:
            out.update(order[order.index(done.ledger_id) + 1:])
    return frozenset(out)


@dataclasses.dataclass
class MessagesPhase:
    settings: ScanSettings
    store: MetadataStore  # BookKeeper's
    run_id: str
    record_checkpoints: bool = False  # the auditor's leader: go on from, and keep, each topic's checkpoint
    sleep: Callable[[float], None] = time.sleep

    def run(self, read: Mapping[int, LedgerSequences], stats: RunFigures) -> list[Violation]:
        by_topic = stitched(read.values())
        if not by_topic:
            return []
        cursors = CursorLedgers(self.settings, self.store)
        with pulsar_store(self.store, self.settings) as pulsar, contextlib.closing(cursors):
            record = PulsarRecord.decode(pulsar.pulsar_records(sorted(by_topic)))
            read_at = time.monotonic()
            topics = {topic: t for topic in sorted(by_topic) if (t := record.topic(topic)) is not None}  # else deleted
            dedups = with_horizons(pulsar, {name: dedup_snapshot(t, cursors) for name, t in topics.items()})
            found: list[Violation] = []
            for topic, t in topics.items():
                v = self._validate(topic, t, by_topic[topic], dedups[topic], stats)
                owner = Owner("topic", topic)
                found += [dataclasses.replace(x, owner=owner) for x in v.violations]
                stats.add(Messages(pulsar_topics_validated=1, pulsar_ledgers_validated=len(v.ledgers),
                                   pulsar_validation_stopped=v.stopped_at is not None,
                                   pulsar_topics_without_dedup_snapshot=dedups[topic] is None,
                                   pulsar_dedup_snapshots_waiting=v.checkpoint.waiting is not None,
                                   pulsar_messages_in_open_transactions=sum(v.checkpoint.transactions.values())))
            if not found:
                return []
            self.sleep(max(0.0, self.settings.recheck_delay - (time.monotonic() - read_at)))
            return self._again(pulsar, found, cursors)

    def _validate(self, topic: str, t: TopicRecord, ledgers: Mapping[int, LedgerSequences],
                  dedup: DedupSnapshot | None, stats: RunFigures) -> Validation:
        record = checkpoint_record(topic)
        before = record.read(self.store) if self.record_checkpoints else MessageCheckpoint()
        order = in_bookkeeper(t)
        done = before.position.ledger_id if before.position is not None else None
        unread = [lid for lid in order[order.index(done) + 1 if done in order else 0:] if lid not in ledgers]
        lost = {r.ledger_id for r in self.store.read_ledgers(unread) if r.deleted} if unread else set()
        v = validate(before, order, ledgers, dedup, lost)
        # the topic's own tallies, kept in its checkpoint (one from another version may name more: left out)
        stats.add(Messages.of({f"pulsar_{k}": n - before.stats.get(k, 0) for k, n in v.checkpoint.stats.items()}))
        if self.record_checkpoints and v.checkpoint != before:
            try:
                record.write(self.store, v.checkpoint)
            except Exception as exc:  # the next run validates those ledgers again: later, never wrong
                log.warning("run %s: could not keep %s's message checkpoint: %s", self.run_id, topic, exc)
        return v

    def _again(self, pulsar: MetadataStore, found: list[Violation], cursors: CursorLedgers) -> list[Violation]:
        topics = sorted({v.owner.name for v in found if v.owner is not None})
        again = PulsarRecord.decode(pulsar.pulsar_records(topics))
        present = {r.ledger_id for r in self.store.read_ledgers(sorted({v.ledger_id for v in found}))
                   if r.metadata is not None}
        snapshots: dict[str, tuple[Position, dict[str, int]] | None] = {}  # each topic's, read once
        kept = []
        for v in found:
            t = again.topic(v.owner.name) if v.owner is not None else None
            if t is None or v.ledger_id not in in_bookkeeper(t) or v.ledger_id not in present:
                continue
            judged = Position.parse(str(v.details.get("dedup_snapshot", "")))
            if judged is not None:
                if t.topic not in snapshots:
                    snapshots[t.topic] = dedup_snapshot(t, cursors)
                now = snapshots[t.topic]
                if now is not None and now[0] < judged:  # gone back: not the same history
                    continue
            kept.append(v)
        return kept
