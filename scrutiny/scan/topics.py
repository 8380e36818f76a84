"""A run's topics phase: Pulsar's record (read from Pulsar's metadata store, BookKeeper's unless
`pulsar_metadata_uri` names another) held against BookKeeper's ledgers as the first pass saw them
(`scrutiny.checks.topics`), a ledger missing there read again after the record. Every finding rests on facts
read twice: the records it concerns are read again no sooner than the re-check delay after the first look,
then BookKeeper's metadata of every ledger they name, in that order (a ledger is created before a record
names it and deleted after it is dropped from one), then those records once more (a topic's deletion removes
its ledgers first, its record after), and only a finding the fresh facts give again is reported."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator

from scrutiny.bookieclient import BookieClient, HoldingsClient
from scrutiny.categories import Category
from scrutiny.checks import Violation
from scrutiny.checks.topics import check_topics, leaked, unnamed
from scrutiny.config import ScanSettings
from scrutiny.orphans import Sightings
from scrutiny.pulsar.ledgers import BookKeeperLedgers, LedgerFact
from scrutiny.pulsar.owners import PULSAR_KINDS, Owner, owner_from_custom_metadata, topic_of_owner
from scrutiny.pulsar.records import COMPACTED_LEDGER_PROPERTY, COMPACTION_CURSOR
from scrutiny.pulsar.snapshot import PulsarRecord
from scrutiny.records import LeaderRecord
from scrutiny.runstats import PulsarRecordFigures, RunFigures
from scrutiny.scan.cursorledgers import CursorLedgers
from scrutiny.store import LedgerRead, MetadataStore, open_store
from scrutiny.store.facts import ClusterFacts
from scrutiny.times import iso, now_ms

log = logging.getLogger(__name__)

# Where a ledger has no ctime (etcd), when it was first seen Pulsar's and named by nothing (one key: a leak is
# no bookie's).
LEAK_SIGHTINGS = LeaderRecord("leak-sightings", lambda data: Sightings.parse(data, "the stored leak sightings"),
                              Sightings.to_bytes, Sightings, "every leaked-ledger candidate without a ctime is "
                              "sighted anew")
_HEAD = {Category.TOPIC_HEAD_LEDGER_CLOSED, Category.TOPIC_WRITTEN_PAST_CLOSED_HEAD}  # one fact, either verdict


@contextlib.contextmanager
def pulsar_store(store: MetadataStore, settings: ScanSettings) -> Iterator[MetadataStore]:
    """Pulsar's metadata store: BookKeeper's, or the one `pulsar_metadata_uri` names (opened for the phase)."""
    if not settings.pulsar_metadata_uri:
        yield store
        return
    other = open_store(dataclasses.replace(settings, metadata_service_uri=settings.pulsar_metadata_uri))
    try:
        yield other
    finally:
        other.close()


def _key(v: Violation) -> tuple[str, int]:
    return ("head" if v.category in _HEAD else str(v.category)), v.ledger_id


@dataclasses.dataclass
class TopicsPhase:
    settings: ScanSettings
    store: MetadataStore  # BookKeeper's
    run_id: str
    record_sightings: bool = False
    sleep: Callable[[float], None] = time.sleep

    def run(self, bookkeeper: BookKeeperLedgers, topics: tuple[str, ...] | None,
            stats: RunFigures) -> tuple[list[Violation], list[str]]:
        """The findings, and the records that could not be decoded; `topics` None: every topic's record."""
        with pulsar_store(self.store, self.settings) as pulsar:
            t0 = time.monotonic()
            reads_before = pulsar.reads
            first = PulsarRecord.decode(pulsar.pulsar_records(topics))
            found = self._missing_still(check_topics(first, bookkeeper))
            read_at = time.monotonic()
            suspects = unnamed(first, bookkeeper)
            since = self._since(suspects)
            leaks = leaked(suspects, now_ms(), self.settings.leaked_ledger_grace_period, since)
            stats.add(PulsarRecordFigures(pulsar_topics=len(first.topics), pulsar_schemas=len(first.schemas),
                                          pulsar_candidates=len(found) + len(leaks), pulsar_unnamed=len(suspects)))
            confirmed: list[Violation] = []
            if found or leaks:
                # a record's ledger is deleted a moment after the record drops it: look again no sooner than this
                self.sleep(max(0.0, self.settings.recheck_delay - (time.monotonic() - read_at)))
                confirmed = self._again(pulsar, found, bookkeeper) + self._leaks_again(pulsar, leaks, since, stats)
            stats.add(PulsarRecordFigures(pulsar_store_reads=pulsar.reads - reads_before,
                                          pulsar_ms=int((time.monotonic() - t0) * 1000)))
        return confirmed, list(first.problems)

    def _missing_still(self, found: list[Violation]) -> list[Violation]:
        """A ledger the first pass did not list may have been created since, then named: missing only if
        BookKeeper still lacks it now, after the record was read. So a ledger is seen missing twice, the re-check
        delay apart, and a topic's deletion under way (its ledgers gone, its record not yet) is no finding unless
        it lasts that long."""
        ids = sorted({v.ledger_id for v in found if v.category is Category.TOPIC_LEDGER_MISSING})
        if not ids:
            return found
        now = BookKeeperLedgers.of(self.store.read_ledgers(ids))
        return [v for v in found if v.category is not Category.TOPIC_LEDGER_MISSING or now.get(v.ledger_id) is None]

    def _since(self, suspects: list[LedgerFact]) -> dict[int, int]:
        """When each unnamed ledger without a ctime was first seen so (the auditor keeps it across runs)."""
        without = [f.ledger_id for f in suspects if f.ctime_ms < 0]
        sightings = LEAK_SIGHTINGS.read(self.store).seen({"": without}, now_ms())
        if self.record_sightings:
            try:
                LEAK_SIGHTINGS.write(self.store, sightings)
            except Exception as exc:  # the next run sights them anew: later, never early
                log.warning("run %s: could not record the leak sightings: %s", self.run_id, exc)
        return dict(sightings.first_seen.get("", {}))

    def _again(self, pulsar: MetadataStore, found: list[Violation], bookkeeper: BookKeeperLedgers) -> list[Violation]:
        """The topics of the findings read again, then every ledger they name (and those their keys give them),
        checked again: the findings both looks give, as the second gives them."""
        if not found:
            return []
        topics = sorted({topic_of_owner(v.owner) for v in found if v.owner is not None})
        again = PulsarRecord.decode(pulsar.pulsar_records(topics))
        ids = {n.ledger_id for n in again.needs()} | {v.ledger_id for v in found}
        ids |= {f.ledger_id for t in again.topics.values() for f in bookkeeper.of_owner("topic", t.topic, -1)}
        fresh = BookKeeperLedgers.of(self.store.read_ledgers(sorted(ids)))
        first = {_key(v) for v in found}
        kept = [v for v in check_topics(again, fresh) if _key(v) in first]
        if not kept:
            return []
        # A broker deletes a topic's ledgers before its record: read after the ledgers, the record must still
        # say the same (a topic deleted meanwhile has none)
        last = PulsarRecord.decode(pulsar.pulsar_records(sorted({topic_of_owner(v.owner) for v in kept
                                                                 if v.owner is not None})))
        still = {_key(v) for v in check_topics(last, fresh)}
        return [v for v in kept if _key(v) in still]

    def _leaks_again(self, pulsar: MetadataStore, leaks: list[LedgerFact], unnamed_since: dict[int, int],
                     stats: RunFigures) -> list[Violation]:
        """Each leak's ledger read again (still there, still Pulsar's), then the records its keys point to (still
        naming it nowhere); its bookies asked what they hold of it."""
        if not leaks:
            return []
        reads: dict[int, tuple[LedgerRead, Owner]] = {}
        for r in self.store.read_ledgers(sorted(f.ledger_id for f in leaks)):
            owner = owner_from_custom_metadata(r.metadata.custom_metadata) if r.metadata is not None else None
            if owner is not None and owner.kind in PULSAR_KINDS:
                reads[r.ledger_id] = (r, owner)
        again = PulsarRecord.decode(pulsar.pulsar_records(sorted({topic_of_owner(o) for _, o in reads.values()})))
        named = set(again.named()) | again.offloaded
        still = {lid: ro for lid, ro in reads.items() if lid not in named}
        still = {lid: ro for lid, ro in still.items() if lid not in self._compacted_live(again, still)}
        held = self._held({lid: r for lid, (r, _) in still.items()})
        now = now_ms()
        out = []
        for lid, (r, owner) in sorted(still.items()):
            md = r.metadata
            assert md is not None
            known = md.ctime > 0
            since = md.ctime if known else unnamed_since.get(lid, now)
            held_by = held.get(lid, {})
            details = {"kind": owner.kind, "owner": owner.name + (f" cursor {owner.cursor}" if owner.cursor else ""),
                       "age_from": "its ctime" if known else "first seen unnamed", "since": iso(since),
                       "age_seconds": (now - since) // 1000,
                       "grace_period_seconds": self.settings.leaked_ledger_grace_period,
                       "entries": md.last_entry_id + 1 if md.closed else None, "length": md.length,
                       "held_by": held_by, "bytes": sum(h.get("bytes", 0) for h in held_by.values())}
            out.append(Violation(Category.LEAKED_LEDGER, lid, tuple(sorted(held_by)), details, owner=owner))
        stats.add(PulsarRecordFigures(pulsar_leaked_ledgers=len(out),
                                      pulsar_leaked_bytes=sum(v.details["bytes"] for v in out)))
        return out

    def _compacted_live(self, record: PulsarRecord, candidates: dict[int, tuple[LedgerRead, Owner]]) -> set[int]:
        """The compacted ledgers a live compaction cursor may name: it keeps its position, and the compacted ledger
        in its properties, in its own ledger, not in its record. One whose cursor's ledger cannot be read is not
        reported either: nothing shows it is unnamed."""
        out: set[int] = set()
        cursors = CursorLedgers(self.settings, self.store)
        try:
            for lid, (_, owner) in candidates.items():
                t = record.topic(owner.name) if owner.kind == "compacted-topic" else None
                cursor = t.cursors.get(COMPACTION_CURSOR) if t is not None else None
                if t is None or cursor is None or cursor.ledger_id < 0:
                    continue
                live = cursors.mark_delete(t.topic, cursor)
                if live is None or live[1].get(COMPACTED_LEDGER_PROPERTY) == lid:
                    out.add(lid)
        finally:
            cursors.close()
        return out

    def _held(self, reads: dict[int, LedgerRead]) -> dict[int, dict[str, dict[str, int]]]:
        """Per ledger, each of its bookies that holds some of it: its entries, and bytes where its agent knows."""
        per_bookie: dict[str, list[int]] = {}
        for lid, r in reads.items():
            assert r.metadata is not None
            for b in r.metadata.bookies:
                per_bookie.setdefault(b, []).append(lid)
        out: dict[int, dict[str, dict[str, int]]] = {}
        if not per_bookie:
            return out
        facts = ClusterFacts.read(self.store)
        with BookieClient.from_settings(self.settings, facts.agent_addresses) as agents:
            client = HoldingsClient(agents)
            for b, ids in sorted(per_bookie.items()):
                try:
                    answers = client.held(b, ids)
                except Exception as exc:  # unknown, not a reason to withhold the finding: the metadata says it
                    log.info("run %s: cannot ask %s what it holds of leaked ledgers: %s", self.run_id, b, exc)
                    continue
                for lid, h in answers.items():
                    if h is not None:
                        out.setdefault(lid, {})[b] = h.to_json()
        return out
