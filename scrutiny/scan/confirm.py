"""What a run does between its first pass and its report, so that a finding is reported only while every fact it
rests on is still true: BP-34's delayed re-check of the ledgers whose bookies were silent, then every fact a
finding rests on read again: the ledger's metadata (deleted: dropped; changed: analysed again), its
under-replication mark (now marked: dropped), the bookies' answers seen at one look only (asked again), the
registrations of the bookies it blames or counts as gone, and the racks of a placement finding. Which findings
each step touches comes from the category registry (the facts a finding rests on), never from a list of
categories here."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np

from scrutiny.categories import Category, Fact, resting_on
from scrutiny.config import ScanSettings
from scrutiny.runstats import Scan
from scrutiny.scan.context import Pass, RunContext, Silences
from scrutiny.scan.pending import PendingRun
from scrutiny.store import LedgerRange
from scrutiny.store.facts import ClusterFacts
from scrutiny.times import now_ms

log = logging.getLogger(__name__)

ON_ANSWERS = resting_on(Fact.ANSWERS)  # a re-check recomputes these; those seen at one look are asked again
_ON_METADATA = resting_on(Fact.METADATA)  # the metadata must be unchanged
_ON_RACKS = resting_on(Fact.RACKS)  # the rack map must be unchanged


class Looks(Protocol):
    """What confirming a run's findings needs of the run: its settings and name, its pause, and a look (a pass
    over some ranges, its results absorbed into the pending run; the ledgers it left potentially faulty)."""

    settings: ScanSettings
    run_id: str
    sleep: Callable[[float], None]

    def look(self, pending: PendingRun, ctx: RunContext, ranges: list[LedgerRange], mode: Pass,
             first_look: bool = True) -> Silences: ...


class Confirmation:
    """A pending run's findings confirmed or dropped, on the run's looks."""

    def __init__(self, run: Looks) -> None:
        self.run = run

    def recheck(self, pending: PendingRun, faulty: Silences) -> None:
        """BP-34's delayed re-check, as many looks as it takes (at most `verify_rounds`): a bookie silent
        at two looks a delay apart and still registered is reported; one unregistered at every look has
        lost its copies; any other silence (newly silent, or unregistered only now: a rolling restart)
        gets its own delayed look. The caller waited the delay before the first look."""
        store, ctx = pending.store, pending.ctx
        if faulty:
            pending.stats.add(Scan(potentially_faulty=len(faulty)))
            log.info("run %s: re-checking %d potentially faulty ledgers", self.run.run_id, len(faulty))
        for look in range(self.run.settings.verify_rounds):
            if not faulty:
                return
            if look:
                pending.stats.add(Scan(rechecked_again=len(faulty)))
                self.run.sleep(self.run.settings.recheck_delay)
            facts = ClusterFacts.read(store)  # an agent that came back may listen elsewhere now
            silent = faulty.silent()
            lost = frozenset(b for b in silent if b not in facts.registered and b not in pending.registered_at_start)
            again = dataclasses.replace(ctx, agent_addresses=facts.agent_addresses, now_ms=now_ms(), placement=False,
                                        lost_bookies=lost, registered=frozenset(silent) & facts.registered,
                                        silent_before=faulty, lost=ctx.lost and ctx.lost.with_registered(
                                            facts.registered))
            pending.findings.drop(faulty, only=ON_ANSWERS)
            faulty = self.run.look(pending, again, store.ranges_of(faulty.ledger_ids), Pass.FINAL, first_look=False)
        if faulty:
            # Never a finding on a silence not yet confirmed: the next run looks again.
            pending.unsettled |= set(faulty.ledger_ids)
            pending.stats.add(Scan(left_unsettled_after_rechecks=len(faulty)))
            log.warning("run %s: %d ledgers still had newly silent bookies after %d looks; not reported",
                        self.run.run_id, len(faulty), self.run.settings.verify_rounds)

    def reread(self, pending: PendingRun) -> None:
        """Before reporting, every fact each finding rests on is read again (see the module's doc)."""
        store, findings = pending.store, pending.findings
        for round_ in range(self.run.settings.verify_rounds + 1):
            suspects = False
            reanalyse: set[int] = set()
            for chunk in findings.ledger_chunks(_ON_METADATA):
                suspects = True
                versions = {lid: (least, most) for lid, least, most in chunk}
                marked = store.marked(versions)
                gone = []
                for read in store.read_ledgers(list(versions)):
                    lid = read.ledger_id
                    if read.deleted:
                        gone.append(lid)
                        pending.counts["deleted_during_run"] += 1
                    elif lid in marked:
                        gone.append(lid)
                        pending.stats.add(Scan(dropped_marked_during_run=1))
                    elif read.metadata is not None and versions[lid] != (read.metadata.znode_version,) * 2:
                        reanalyse.add(lid)  # includes metadata that was unreadable and now reads
                findings.drop(gone)
            if not suspects:
                return
            if reanalyse:
                pending.stats.add(Scan(reanalyzed_after_metadata_change=len(reanalyse)))
            reanalyse |= self._racks_changed(pending)
            changed = registrations_changed(pending, self.run.settings.bookie_endpoints)
            relook = {lid: bookies for lid, bookies in changed.items() if lid not in reanalyse}
            once = self._seen_once(pending, exclude=reanalyse | relook.keys()) if round_ == 0 else set()
            if not reanalyse and not relook and not once:
                return
            if round_ == self.run.settings.verify_rounds:
                # Facts that keep changing under a finding: no finding on them, and one ledger never makes the
                # whole run incomplete; the next run (or continuous mode's look) settles it.
                pending.unsettled |= reanalyse | set(relook)
                findings.drop(reanalyse | set(relook))
                pending.stats.add(Scan(left_unsettled_after_rereads=len(reanalyse | set(relook))))
                log.warning("run %s: the facts of %d findings kept changing after %d re-reads; not reported",
                            self.run.run_id, len(reanalyse | set(relook)), self.run.settings.verify_rounds)
                return
            if reanalyse or relook:
                log.info("run %s: facts of %d findings changed during the run; looking again", self.run.run_id,
                         len(reanalyse) + len(relook))
            reanalyse |= once
            findings.drop(reanalyse)
            # (the blast radius counted these ledgers at their first look already)
            faulty = self.run.look(pending, dataclasses.replace(pending.ctx, blast_radius=False, holdings=False),
                                   store.ranges_of(reanalyse), Pass.FIRST, first_look=False)
            if faulty:
                self.run.sleep(self.run.settings.recheck_delay)
            self.recheck(pending, faulty.plus(relook))

    def _seen_once(self, pending: PendingRun, exclude: set[int]) -> set[int]:
        """The ledgers whose findings rest on the bookies' answers at one look only (no bookie silent, no
        recent close): asked again now. One wrong answer (an agent reading its index while the bookie
        flushed it) is then no finding, and a loss is one still there at two looks."""
        looked_twice = pending.faulty.ledger_ids
        out: set[int] = set()
        for chunk in pending.findings.ledger_chunks(ON_ANSWERS):
            ids = np.fromiter((lid for lid, _, _ in chunk), np.int64, len(chunk))
            out.update(ids[~np.isin(ids, looked_twice)].tolist())
        out -= exclude
        if out:
            pending.stats.add(Scan(reasked_before_reporting=len(out)))
            log.info("run %s: asking the bookies again about %d ledgers before reporting", self.run.run_id, len(out))
        return out

    def _racks_changed(self, pending: PendingRun) -> set[int]:
        """Ledgers with a placement finding on a bookie whose rack changed during the run (the racks
        of the run's context are replaced by the current ones)."""
        if not pending.racks_from_store or not pending.findings.counts().keys() & _ON_RACKS:
            return set()
        racks, _ = pending.store.racks(self.run.settings.racks_znode)
        if racks == dict(pending.ctx.locations):
            return set()
        moved = {b for b in set(racks) | set(pending.ctx.locations) if racks.get(b) != pending.ctx.locations.get(b)}
        pending.ctx = dataclasses.replace(pending.ctx, locations=racks)
        out = set(pending.findings.naming(moved, categories=_ON_RACKS, or_none=True))
        pending.stats.add(Scan(reanalyzed_after_rack_change=len(out)))
        return out


def registrations_changed(pending: PendingRun, explicit: Mapping[str, str]) -> dict[int, tuple[str, ...]]:
    """Ledgers whose finding blames a bookie no longer registered, or counts as gone the copies of
    one registered again: they need another look. So does a silence at an address the bookie's agent has
    left (it came back elsewhere while the look asked the old one); the bookie is newly silent there."""
    findings = pending.findings
    blamed = findings.named(categories={Category.BOOKIE_UNAVAILABLE})
    gone = findings.named(lost=True)
    if not blamed and not gone:
        return {}
    facts = ClusterFacts.read(pending.store)
    out = findings.naming(blamed - facts.registered, categories={Category.BOOKIE_UNAVAILABLE})
    out |= findings.naming(gone & facts.registered, lost=True)
    pending.stats.add(Scan(relooked_after_registration_change=len(out)))
    moved: dict[int, tuple[str, ...]] = {}
    for b, asked in findings.agents_asked():
        now = facts.agent_addresses.get(b, asked)  # registered nowhere now: down, the silence stands
        if b not in explicit and now != asked:
            moved.update((lid, ()) for lid in findings.asked_at(b, asked) if lid not in out)
    pending.stats.add(Scan(relooked_after_agent_moved=len(moved)))
    return out | moved
