"""The hand-off against BookKeeper's own repair, on every BookKeeper line: scrutiny marks two losses of a real
bookie's, and a real AutoRecovery's ReplicationWorker (its checker at percentage 0, BookKeeper's default) acts on
the marks. A whole share lost: the worker copies it elsewhere and unmarks, and scrutiny's follow-up says repaired.
One entry lost in the middle of a share: the worker's checker reads the share's ends only, finds nothing and
unmarks without copying; scrutiny says UNMARKED_WITHOUT_REPAIR with the `recover` command, the test runs that
command with BookKeeper's shell, and scrutiny then finds the ledger whole. (scrutiny is told the cluster checks at
100, so that it marks the second loss too: the misconfiguration its finding names.) And what BookKeeper's checker
and worker do with a copy a bookie lists but cannot read (its entry log gone), at percentages 0 and 100."""

from __future__ import annotations

import shlex
from pathlib import Path

from scrutiny.auditor import Auditor
from scrutiny.checks import expected_share
from scrutiny.checks.remedy import NO, YES, RepairContext, remedy
from scrutiny.codec import Availability
from scrutiny.config import AuditorSettings
from scrutiny.repair.plan import MARKED, REPAIRED, UNREPAIRED
from scrutiny.scan.engines import LocalEngine
from scrutiny.testing import store_at
from scrutiny.testing.realbookkeeper import RealBookie, RealBookKeeper
from tests.real.conftest import Agents, findings, flushed, scan, scan_settings
from tests.support.helpers import wait_for


def handing_off(c: RealBookKeeper, tmp_path: Path) -> Auditor:
    """An auditor handing off to the cluster's autorecovery (`repair: mark`), told the cluster checks at 100 so that
    it marks a loss its checker reads only mid-share too: the misconfiguration its finding then names."""
    settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp_path / "reports"), full_interval_seconds=3600,
                               underreplication_interval_seconds=0, insecure_open_rescan=True,
                               continuous_batch_seconds=1.0, repair="mark", repair_interval_seconds=1.0)
    return Auditor(scan_settings(c, auditor_ledger_verification_percentage=100), settings, engine=LocalEngine()).start()


def outcomes(auditor: Auditor) -> dict[int, set[str]]:
    """What the hand-off's journal says of each ledger."""
    out: dict[int, set[str]] = {}
    for h in auditor.handoff.handed():
        out.setdefault(h.candidate.ledger_id, set()).add(h.outcome)
    return out


def test_the_real_replication_worker_repairs_a_lost_share_and_unmarks_a_loss_it_cannot_see(
        bookkeeper: RealBookKeeper, agents: Agents, tmp_path: Path) -> None:
    c = bookkeeper
    bookies = agents.bookies(4)
    client = c.client()
    with store_at(c.uri) as store:
        while True:  # two ledgers sharing a bookie (any two ensembles of 3 of 4 bookies share two)
            whole, _ = client.create(3, 2, 2, "CRC32C", entries=30)
            middle, _ = client.create(3, 2, 2, "CRC32C", entries=30)
            mds = {r.ledger_id: r.metadata for r in store.read_ledgers([whole, middle])}
            shared = sorted(set(mds[whole].segments[0].ensemble) & set(mds[middle].segments[0].ensemble))  # type: ignore
            if shared:
                break
    flushed(agents, [whole, middle])
    bookie = next(b for b in bookies if b.bookie_id == shared[0])
    share = Availability.of(expected_share(mds[middle], bookie.bookie_id)).entry_ids().tolist()  # type: ignore
    gone_entry = share[len(share) // 2]
    bookie.lose_entries(whole)  # its whole share of `whole`
    bookie.lose_entries(middle, [gone_entry])  # one entry amid its share of `middle`
    assert findings(scan(c)) == {("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", whole),
                                 ("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", middle)}

    # BookKeeper's autorecovery at its defaults but for its own periodic check (which would mark them itself)
    c.autorecovery(percentage=0, auditorPeriodicCheckInterval=0, lostBookieRecoveryDelay=3600)
    auditor = handing_off(c, tmp_path)
    try:
        wait_for(lambda: {REPAIRED, MARKED} <= outcomes(auditor).get(whole, set())
                 and {UNREPAIRED, MARKED} <= outcomes(auditor).get(middle, set()), 240,
                 lambda: f"{outcomes(auditor)}; see {c.workdir}")
        with store_at(c.uri) as store:
            assert store.marked([whole, middle]) == set()
            repaired = next(store.read_ledgers([whole])).metadata
        assert repaired is not None and bookie.bookie_id not in repaired.bookies  # copied to another bookie
        found = {(str(f.violation.category), f.violation.ledger_id): f for f in auditor.current.findings()}
        assert set(found) == {("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", middle), ("UNMARKED_WITHOUT_REPAIR", middle)}
        unmarked = found["UNMARKED_WITHOUT_REPAIR", middle].to_json()
        assert "at 0, BookKeeper's default" in unmarked["details"]["cause"]
        [command] = unmarked["remedy"]["commands"]
        assert command == f"bin/bookkeeper shell recover {bookie.bookie_id} -l {middle}"

        # the operator runs it, as the finding says (and answers its prompt)
        c.shell(*shlex.split(command)[2:], answer="Y\n")
        assert findings(scan(c)) == set()
        auditor.rescan(None, "")
        wait_for(lambda: auditor.current.findings() == [], 120,
                 lambda: f"{[f.to_json() for f in auditor.current.findings()]}")
    finally:
        auditor.stop()


def first_and_last(agents: Agents, bookie: RealBookie, ledger_id: int) -> tuple[set[int], int, int]:
    """The entry logs the bookie's index places the ledger's entries in, and the logs of its first and last."""
    s = agents.agents[bookie.bookie_id].source
    s.refresh()
    where = [(e, loc >> 32) for _, e, loc in s.locations_of(ledger_id) or []]  # type: ignore[attr-defined]
    return {log for _, log in where}, where[0][1], where[-1][1]


def test_the_real_autorecovery_and_a_copy_whose_entry_log_is_gone(bookkeeper: RealBookKeeper, agents: Agents,
                                                                   tmp_path: Path) -> None:
    """A bookie that lists an entry it cannot read (its entry log removed) is, to BookKeeper's checker, a bookie
    that lacks it: a read fails it. So autorecovery repairs such a copy where its checker reads it, and only
    there, as scrutiny's remedies say: at percentage 0 (the first and the last entry of a share) a ledger whose
    end was in the log is repaired and one that lost only entries mid-share is unmarked without repair; at
    percentage 100, BookKeeper's own Auditor finds the second one too and its worker repairs it."""
    c = bookkeeper
    bookies = agents.bookies(3, logSizeLimit=1024 * 1024)  # a ledger of 2.4 MB spans three logs
    client = c.client()
    ledgers = [client.create(3, 3, 2, "CRC32C", entries=600, size=4096)[0] for _ in range(3)]
    agents.serve(c.add_bookie())  # where the copies go
    flushed(agents, ledgers)
    bookie = bookies[0]
    spans = {lid: first_and_last(agents, bookie, lid) for lid in ledgers}
    # a log holding only middle entries of one ledger, and one holding the first entry of another (and neither end
    # of the first)
    mid_lid, mid_log = next((lid, log) for lid, (logs, first, last) in spans.items()
                            for log in sorted(logs) if log not in (first, last))
    end_lid, end_log = next((lid, first) for lid, (_, first, _) in spans.items()
                            if lid != mid_lid and first not in spans[mid_lid][1:])
    bookie.stop()
    for log in (mid_log, end_log):
        (bookie.ledger_dir / "current" / f"{log:x}.log").unlink()
    bookie.start()
    at_100 = scan(c, auditor_ledger_verification_percentage=100)
    at_0 = scan(c)
    lossy = {mid_lid, end_lid} | {lid for lid, (logs, _, _) in spans.items() if logs & {mid_log, end_log}}
    assert findings(at_0) == {("LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY", lid) for lid in lossy}
    zero, hundred = ({v.ledger_id: remedy(v, r.repair).autorecovery for v in r.violations} for r in (at_0, at_100))
    assert zero[mid_lid] == NO and zero[end_lid] == YES and set(hundred.values()) == {YES}
    deep = scan(c, deep=True)  # the deep run's copies that fail the bookie's read: as the coverage finding says
    corrupt = {v.ledger_id: v for v in deep.violations if str(v.category) == "CORRUPT_ENTRY"}
    assert set(corrupt) == lossy and all(set(v.details["copies"][bookie.bookie_id]["reasons"]) == {"missing-log"}
                                         for v in corrupt.values())
    assert remedy(corrupt[mid_lid], RepairContext(100)).autorecovery == YES

    # percentage 0, BookKeeper's default: scrutiny marks both (told the cluster checks at 100: the misconfiguration
    # its finding then names), the worker repairs the one whose end it cannot read and unmarks the other
    recovery = c.autorecovery(percentage=0, auditorPeriodicCheckInterval=0, lostBookieRecoveryDelay=3600)
    auditor = handing_off(c, tmp_path)
    try:
        wait_for(lambda: REPAIRED in outcomes(auditor).get(end_lid, set())
                 and UNREPAIRED in outcomes(auditor).get(mid_lid, set()), 240,
                 lambda: f"{outcomes(auditor)}; see {c.workdir}")
    finally:
        auditor.stop()
    recovery.stop()
    left = scan(c)
    assert mid_lid in {v.ledger_id for v in left.violations} and end_lid not in {v.ledger_id for v in left.violations}

    # percentage 100: BookKeeper's own Auditor reads every entry, marks what is left, and its worker repairs it
    c.autorecovery(percentage=100, auditorPeriodicCheckInterval=5, lostBookieRecoveryDelay=3600)
    with store_at(c.uri) as store:
        def repaired() -> bool:  # marked, copied elsewhere, unmarked
            md = next(store.read_ledgers([mid_lid])).metadata
            return md is not None and bookie.bookie_id not in md.bookies and not store.marked([mid_lid])

        wait_for(repaired, 240, lambda: f"for AutoRecovery at 100; see {c.workdir}")
    assert findings(scan(c)) == set()
