"""The hand-off against BookKeeper's own repair, on every BookKeeper line: scrutiny marks two losses of a real
bookie's, and a real AutoRecovery's ReplicationWorker (its checker at percentage 0, BookKeeper's default) acts on
the marks. A whole share lost: the worker copies it elsewhere and unmarks, and scrutiny's follow-up says repaired.
One entry lost in the middle of a share: the worker's checker reads the share's ends only, finds nothing and
unmarks without copying; scrutiny says UNMARKED_WITHOUT_REPAIR with the `recover` command, the test runs that
command with BookKeeper's shell, and scrutiny then finds the ledger whole. (scrutiny is told the cluster checks at
100, so that it marks the second loss too: the misconfiguration its finding names.)"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

from scrutiny.auditor import Auditor
from scrutiny.checks import expected_share
from scrutiny.codec import Availability
from scrutiny.config import AuditorSettings
from scrutiny.repair.plan import MARKED, REPAIRED, UNREPAIRED
from scrutiny.scan.engines import LocalEngine
from scrutiny.testing import store_at
from scrutiny.testing.realbookkeeper import RealBookKeeper
from tests.real.conftest import Agents, findings, scan, scan_settings
from tests.support.helpers import wait_for


def test_the_real_replication_worker_repairs_a_lost_share_and_unmarks_a_loss_it_cannot_see(
        bookkeeper: RealBookKeeper, agents: Agents, tmp_path: Path) -> None:
    c = bookkeeper
    bookies = [c.add_bookie() for _ in range(4)]
    for b in bookies:
        agents.serve(b)
    client = c.client()
    with store_at(c.uri) as store:
        while True:  # two ledgers sharing a bookie (any two ensembles of 3 of 4 bookies share two)
            whole, _ = client.create(3, 2, 2, "CRC32C", entries=30)
            middle, _ = client.create(3, 2, 2, "CRC32C", entries=30)
            mds = {r.ledger_id: r.metadata for r in store.read_ledgers([whole, middle])}
            shared = sorted(set(mds[whole].segments[0].ensemble) & set(mds[middle].segments[0].ensemble))  # type: ignore
            if shared:
                break
    time.sleep(2)  # flushed
    bookie = next(b for b in bookies if b.bookie_id == shared[0])
    share = Availability.of(expected_share(mds[middle], bookie.bookie_id)).entry_ids().tolist()  # type: ignore
    gone_entry = share[len(share) // 2]
    bookie.lose_entries(whole)  # its whole share of `whole`
    bookie.lose_entries(middle, [gone_entry])  # one entry amid its share of `middle`
    assert findings(scan(c)) == {("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", whole),
                                 ("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", middle)}

    # BookKeeper's autorecovery at its defaults but for its own periodic check (which would mark them itself)
    c.autorecovery(percentage=0, auditorPeriodicCheckInterval=0, lostBookieRecoveryDelay=3600)
    settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp_path / "reports"), full_interval_seconds=3600,
                               underreplication_interval_seconds=0, insecure_open_rescan=True,
                               continuous_batch_seconds=1.0, repair="mark", repair_interval_seconds=1.0)
    auditor = Auditor(scan_settings(c, auditor_ledger_verification_percentage=100), settings,
                      engine=LocalEngine()).start()
    try:
        def outcomes() -> dict[int, set[str]]:
            out: dict[int, set[str]] = {}
            for h in auditor.handoff.handed():
                out.setdefault(h.candidate.ledger_id, set()).add(h.outcome)
            return out

        wait_for(lambda: {REPAIRED, MARKED} <= outcomes().get(whole, set())
                 and {UNREPAIRED, MARKED} <= outcomes().get(middle, set()), 240,
                 lambda: f"{outcomes()}; see {c.workdir}")
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
