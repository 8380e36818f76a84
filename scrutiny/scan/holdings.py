"""A whole-cluster run's reverse check (`scrutiny.orphans`): every bookie lists its ledgers; those the first
pass did not enumerate are read again, and those still absent are sighted. A ledger sighted for longer than
the grace period is asked about again (still held? how much?) and read again once more: only a ledger still
held and still absent is reported."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

import numpy as np

from scrutiny.bookieclient import BookieClient, HoldingsClient
from scrutiny.checks import Violation
from scrutiny.config import ScanSettings
from scrutiny.orphans import SIGHTINGS as ORPHAN_SIGHTINGS
from scrutiny.orphans import LedgerIds, not_enumerated, orphan
from scrutiny.pulsar.owners import UNKNOWN
from scrutiny.runstats import Holdings, RunFigures
from scrutiny.scan.result import Blast
from scrutiny.store import MetadataStore
from scrutiny.store.facts import ClusterFacts
from scrutiny.times import iso, now_ms

log = logging.getLogger(__name__)


@dataclasses.dataclass
class HoldingsPhase:
    settings: ScanSettings
    store: MetadataStore
    run_id: str
    record_sightings: bool = False

    def run(self, enumerated: list[LedgerIds], stats: RunFigures, blast: dict[str, Blast] | None,
            locations: Mapping[str, str]) -> list[Violation]:
        """The orphans to report; `blast` (the run's blast radius, when it counts one) learns of every bookie
        that answered, so that one no ledger names counts 0, not unknown."""
        s, store = self.settings, self.store
        facts = ClusterFacts.read(store)
        with BookieClient.from_settings(s, facts.agent_addresses) as agents:
            client = HoldingsClient(agents)
            listed = client.list_many(facts.registered | set(facts.agent_addresses) | set(s.bookie_endpoints),
                                      lambda ids: not_enumerated(ids, enumerated))
            held = {b: ids for b, ids in listed.items() if not isinstance(ids, str)}  # not enumerated
            if blast is not None:
                for b in held:
                    for key in (f"bookie:{b}", *((f"rack:{locations[b]}",) if b in locations else ())):
                        blast.setdefault(key, Blast())
            for b, why in sorted((b, why) for b, why in listed.items() if isinstance(why, str)):
                log.info("run %s: cannot list what %s holds: %s", self.run_id, b, why)
            suspects = np.unique(np.concatenate([np.empty(0, np.int64), *held.values()])).tolist()
            absent = {r.ledger_id for r in store.read_ledgers(suspects) if r.deleted}
            candidates = {b: [lid for lid in ids.tolist() if lid in absent] for b, ids in held.items()}
            now = now_ms()
            sightings = ORPHAN_SIGHTINGS.read(store).seen(candidates, now)
            stats.add(Holdings(orphan_bookies_listed=len(held), orphan_bookies_not_listed=len(listed) - len(held),
                                   orphan_candidates=sum(map(len, candidates.values())),
                                   orphan_sightings_untracked=sightings.untracked))
            due = {b: per for b, per in sightings.due(s.orphan_grace_period * 1000, now).items() if b in held}
            held_by: dict[int, dict[str, dict[str, int]]] = {}
            first_seen: dict[int, int] = {}
            for b, per in sorted(due.items()):
                for lid, h in client.held(b, per).items():
                    if h is not None:  # else collected meanwhile
                        held_by.setdefault(lid, {})[b] = h.to_json()
                        first_seen[lid] = min(first_seen.get(lid, now), per[lid])
        # its metadata, and the owner it named, are gone
        found = [dataclasses.replace(orphan(r.ledger_id, held_by[r.ledger_id], first_seen[r.ledger_id], now,
                                            s.orphan_grace_period, iso(first_seen[r.ledger_id])), owner=UNKNOWN)
                 for r in store.read_ledgers(sorted(held_by)) if r.deleted]
        if self.record_sightings:
            try:
                ORPHAN_SIGHTINGS.write(store, sightings)
            except Exception as exc:  # the next run sights them again: later, never early
                log.warning("run %s: could not record the orphan sightings: %s", self.run_id, exc)
        return found
