"""The churn soak, short and seeded: back-to-back scans on both engines while the cluster does only
legal BookKeeper operations aimed at the re-check and re-read moments (recoveries leaving residue past
the close, deletes collected later among them) and Pulsar's topics roll over, trim and acknowledge.
Nothing may be reported; the faults injected at the end (a lost copy, an orphan, adds past a close, and
one of each class the topic's record shows) must be found. (`make soak` runs it for ten minutes.)"""

from __future__ import annotations

import json
from statistics import median

import pytest
from kazoo.client import KazooClient

from scrutiny.scan.engines import LocalEngine
from scrutiny.testing.auditorsoak import auditor_soak
from scrutiny.testing.localetcd import EtcdTree, LocalEtcd
from scrutiny.testing.localzk import LocalZooKeeper
from scrutiny.testing.soak import soak

pytestmark = pytest.mark.soak
BOOKKEEPER_FAULTS = {"LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", "ORPHAN_LEDGER", "ENTRIES_PAST_THE_CLOSE",
                     "LOST_BOOKIE_RECOVERY_NOT_STARTED"}
# the churn's Pulsar topics get one of each class the topic's record can show
PULSAR_FAULTS = {"TOPIC_LEDGER_MISSING", "CURSOR_POSITION_NOT_IN_TOPIC", "TOPIC_ENTRY_COUNT_MISMATCH",
                 "TOPIC_WRITTEN_PAST_CLOSED_HEAD", "LEAKED_LEDGER"}
FAULTS = BOOKKEEPER_FAULTS | PULSAR_FAULTS


def test_churn_soak_reports_nothing_then_finds_the_fault(zk_server: LocalZooKeeper, zk_client: KazooClient,
                                                         zk_namespace: str, spark_engine: object) -> None:
    result = soak(zk_client, f"{zk_namespace}/ledgers", f"zk+hierarchical://{zk_server.hosts}{zk_namespace}/ledgers",
                  seconds=30,
                  engines={"local": LocalEngine(), "spark": spark_engine}, seed=12,  # type: ignore[dict-item]
                  min_runs=4, min_moments=("potentially_faulty", "ledgers_with_residue_past_the_close",
                                           "orphan_candidates", "lost_bookies", "pulsar_candidates"))
    summary = json.dumps(result.summary(), indent=1, default=str)  # a string: pytest would cut a dict short
    assert result.false_alarms == [], json.dumps(result.false_alarms[:5], indent=1)
    # the hand-off, armed, raced by the churn: every mark for a loss still standing, once; each repaired
    assert result.handoff_wrong == [], json.dumps(result.handoff_wrong[:10], indent=1)
    assert result.operations["lose_share"] and result.handoff["marked"] and result.handoff["repaired"], summary
    assert result.runs >= 4 and set(result.runs_by_engine) == {"local", "spark"}, summary
    assert result.incomplete_runs == 0, summary
    ops = result.operations
    assert ops["create"] and ops["delete"] and ops["rereplicate"] and ops["restart_agent"] and ops["restart_bookie"]
    # a bookie whose session was renewed was seen gone (its agent answering) and never reported
    assert ops["session_expiry"] and result.moments["lost_bookies"], summary
    assert ops["recover_with_residue"], summary
    assert ops["pulsar_trim"] and ops["pulsar_acknowledge"] and result.moments["pulsar_candidates"], summary
    assert result.moments["potentially_faulty"], summary  # the churn did reach the re-check moments
    # ... and the reverse check's: residue past a close, ledgers held and absent awaiting collection
    assert result.moments["ledgers_with_residue_past_the_close"] and result.moments["orphan_candidates"], summary
    assert {f.split()[0] for f in result.faults} == FAULTS, summary
    assert result.fault_found and result.fault_report_extra == [], summary
    # continuous scrutiny beside the runs: nothing during the churn, every fault it can see found by itself
    assert result.continuous_false_alarms == [], json.dumps(result.continuous_false_alarms[:5], indent=1)
    assert result.continuous_found and result.continuous_missed == 0, summary
    assert {f.split()[0] for f in result.continuous_expected} == FAULTS - {"ORPHAN_LEDGER", "LEAKED_LEDGER"}, summary


def test_churn_soak_on_etcd(etcd_server: LocalEtcd, etcd_tree: EtcdTree, spark_engine: object) -> None:
    """The same soak, shorter, on Pulsar's metadata store on etcd: no modification times there, and
    ranges read at one revision while the churn writes."""
    result = soak(etcd_tree, "/ledgers", etcd_server.uri, seconds=15,
                  engines={"local": LocalEngine(), "spark": spark_engine}, seed=13,  # type: ignore[dict-item]
                  min_runs=2)
    summary = json.dumps(result.summary(), indent=1, default=str)  # a string: pytest would cut a dict short
    assert result.false_alarms == [], json.dumps(result.false_alarms[:5], indent=1)
    # the hand-off, armed, raced by the churn: every mark for a loss still standing, once; each repaired
    assert result.handoff_wrong == [], json.dumps(result.handoff_wrong[:10], indent=1)
    assert result.operations["lose_share"] and result.handoff["marked"] and result.handoff["repaired"], summary
    assert result.runs >= 2 and set(result.runs_by_engine) == {"local", "spark"}, summary
    assert result.incomplete_runs == 0, summary
    assert result.moments["potentially_faulty"], summary
    assert {f.split()[0] for f in result.faults} == FAULTS, summary
    assert result.fault_found and result.fault_report_extra == [], summary
    # continuous scrutiny on etcd's watch (resumable from a revision) and the agents' feeds
    assert result.continuous_false_alarms == [], json.dumps(result.continuous_false_alarms[:5], indent=1)
    assert result.continuous_found and result.continuous_missed == 0, summary
    assert {f.split()[0] for f in result.continuous_expected} == FAULTS - {"ORPHAN_LEDGER", "LEAKED_LEDGER"}, summary


def test_auditor_soak_threads_and_fds_stay_flat(zk_server: LocalZooKeeper, zk_client: KazooClient,
                                                zk_namespace: str, tmp_path: object) -> None:
    samples = auditor_soak(zk_client, f"{zk_namespace}/ledgers", zk_server.hosts, runs=16, engine=LocalEngine(),
                           reports_dir=str(tmp_path))
    assert len(samples) == 16
    # Each sample is taken with the auditor at rest (runs may still start): the last ones against the
    # most the process held once the first runs had opened what it keeps. A leak of one per run would
    # stand about ten above it. Threads: the fewest of the last (a run starting at a sample adds its own for a
    # while, a leak raises the floor).
    warm, last = samples[2:6], samples[-4:]
    assert min(s.threads for s in last) <= max(s.threads for s in warm) + 2, samples
    assert median(s.fds for s in last) <= max(s.fds for s in warm) + 4, samples
    assert median(s.rss_mb for s in last) <= max(s.rss_mb for s in warm) + 30, samples
