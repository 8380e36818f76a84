"""The operator's second question: is it safe to take this bookie (or rack) down? The what-if run and
every full run's blast radius, through real ZooKeeper, agents and Spark, against a brute force."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from kazoo.client import KazooClient

from scrutiny.agent import BookieAgent
from scrutiny.checks import expected_share
from scrutiny.codec import Availability
from scrutiny.config import ScanSettings
from scrutiny.entrysources import SyntheticStore
from scrutiny.entrysources.synthetic import SyntheticStoreWriter
from scrutiny.metadata import BookieRegistration, LedgerMetadata, LedgerState, Segment
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.testing import store_on
from scrutiny.testing.clusterwriter import ClusterWriter
from scrutiny.testing.localzk import LocalZooKeeper
from tests.conftest import Place
from tests.support.helpers import synthetic_agents

B = [f"127.0.7.{n}:3181" for n in range(1, 7)]
RACKS = {B[0]: "/r1", B[1]: "/r2", B[2]: "/r3", B[3]: "/r1", B[4]: "/r2", B[5]: "/r3"}


def topic(lid: int) -> tuple[tuple[str, bytes], ...]:
    return (("application", b"pulsar"), ("component", b"managed-ledger"),
            ("pulsar/managed-ledger", f"public/default/persistent/t{lid % 4}".encode()))


def share(md: LedgerMetadata, b: str) -> np.ndarray:
    return Availability.of(expected_share(md, b)).entry_ids()


Held = dict[str, dict[int, np.ndarray]]


@pytest.fixture
def cluster(place: Place, tmp_path: Path) -> Iterator[tuple[str, dict[int, LedgerMetadata], Held]]:
    """Random ledgers (E3 with WQ2/AQ2 or WQ3/AQ2) on six bookies in three racks; some copies lost; on
    ZooKeeper and on Pulsar's metadata store on etcd."""
    rng = random.Random(5)
    root = place.root
    w = ClusterWriter(place.client, root)
    w.init_cluster()
    held: dict[str, dict[int, np.ndarray]] = {b: {} for b in B}
    mds: dict[int, LedgerMetadata] = {}
    store = SyntheticStoreWriter()
    for lid in range(1, 61):
        wq = rng.choice((2, 3))
        ens = tuple(rng.sample(B, 3))
        md = LedgerMetadata(lid, LedgerState.CLOSED, 3, wq, 2, rng.randint(5, 60), 0, (Segment(0, ens),),
                            custom_metadata=topic(lid))
        mds[lid] = md
        for b in ens:
            ids = share(md, b)
            if rng.random() < 0.1:  # a lost stretch of entries
                ids = ids[ids % 7 != 3]
            held[b][lid] = ids
            store.add_entries(b, lid, ids)
    w.write_ledgers(mds.values())
    w.write_racks(RACKS, f"{root.rsplit('/', 1)[0]}/bookies")
    for b in B:
        w.register_bookie(BookieRegistration(b, False))
    with synthetic_agents(store, tmp_path, place.registry):
        yield place.uri, mds, held


def least_without(md: LedgerMetadata, held: dict[str, dict[int, np.ndarray]], gone: set[str]) -> int:
    """Brute force: every entry, every bookie of its write set."""
    ens, e = md.segments[0].ensemble, md.ensemble_size
    least = md.write_quorum
    for entry in range(md.last_entry_id + 1):
        copies = sum(1 for w in range(md.write_quorum)
                     if (b := ens[(entry + w) % e]) not in gone and entry in set(held[b].get(md.ledger_id, [])))
        least = min(least, copies)
    return least


def test_blast_radius_matches_a_brute_force(cluster: tuple, spark_engine: object) -> None:  # type: ignore[type-arg]
    uri, mds, held = cluster
    report = ScrutinyRun(ScanSettings(metadata_service_uri=uri, placement_policy="none", recheck_delay=0.2),
                         spark_engine).execute()  # type: ignore[arg-type]
    assert report.blast_radius is not None
    expect: dict[str, dict[str, dict[str, int]]] = {"bookies": {}, "racks": {}}
    scopes = [("bookies", b, {b}) for b in B]
    scopes += [("racks", r, {b for b in B if RACKS[b] == r}) for r in set(RACKS.values())]
    for scope, name, gone in scopes:
        depending = [md for md in mds.values() if gone & md.bookies]
        below = [md for md in depending if least_without(md, held, gone) < md.ack_quorum]
        none = [md for md in below if least_without(md, held, gone) == 0]
        if depending:
            expect[scope][name] = {"ledgers_below_aq": len(below), "ledgers_without_a_copy": len(none),
                                   "topics_below_aq": len({md.ledger_id % 4 for md in below}),
                                   "topics_without_a_copy": len({md.ledger_id % 4 for md in none}),
                                   "ledgers": len(depending), "topics": len({md.ledger_id % 4 for md in depending})}
    assert report.blast_radius == expect
    assert json.loads(report.dumps())["blast_radius"] == expect


def whatif(uri: str, *flags: str) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    res = subprocess.run([sys.executable, "-m", "scrutiny.cli", "whatif", "--metadata-service-uri", uri,
                          "--engine", "local", "--recheck-delay", "0.2", "--format", "json", *flags],
                         capture_output=True, text=True, timeout=120)
    return res.returncode, json.loads(res.stdout), res.stderr


def test_whatif_unsafe_exactly_where_the_last_copies_are(cluster: tuple) -> None:  # type: ignore[type-arg]
    uri, mds, held = cluster
    for flags, gone in ((["--without", B[0]], {B[0]}), (["--without-rack", "/r2"], {B[1], B[4]})):
        status, doc, err = whatif(uri, *flags)
        unsafe = {md.ledger_id for md in mds.values()
                  if gone & md.bookies and least_without(md, held, gone) < md.ack_quorum}
        flagged = {v["ledger_id"] for v in doc["violations"]
                   if v["category"].startswith("WOULD_HAVE_NO") or v["category"].startswith("WOULD_HAVE_LESS_THAN_AQ")
                   or "unsafe_without" in v["details"]}
        assert flagged == unsafe and status == 1 and "UNSAFE" in err
        assert {v["owner"]["name"] for v in doc["violations"] if v["ledger_id"] in unsafe} == \
            {f"persistent://public/default/t{lid % 4}" for lid in unsafe}
        # only ledgers of the bookies taken down are looked at
        assert doc["ledgers"]["seen"] == sum(1 for md in mds.values() if gone & md.bookies)


def test_whatif_of_a_bookie_with_only_redundant_copies_is_safe(zk_server: LocalZooKeeper, zk_client: KazooClient,
                                                              zk_namespace: str, tmp_path: Path) -> None:
    root = f"{zk_namespace}/ledgers"
    w = ClusterWriter(zk_client, root)
    w.init_cluster()
    md = LedgerMetadata(1, LedgerState.CLOSED, 3, 3, 2, 30, 0, (Segment(0, tuple(B[:3])),))  # WQ3 AQ2
    w.write_ledgers([md])
    store = SyntheticStoreWriter()
    for b in B[:3]:
        w.register_bookie(BookieRegistration(b, False))
        store.add(b, 1, expected_share(md, b))
    uri = f"zk+hierarchical://{zk_server.hosts}{root}"
    agents = []
    for b, path in store.write_all(tmp_path).items():
        agents.append(BookieAgent(SyntheticStore(path), bind="127.0.0.1:0").start())
        agents[-1].register(store_on(zk_client, uri), b, f"127.0.0.1:{agents[-1].port}")
    try:
        status, doc, err = whatif(uri, "--without", B[2])
        assert status == 0 and "safe" in err
        assert [v["category"] for v in doc["violations"]] == ["WOULD_HAVE_LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY"]
        status, doc, _ = whatif(uri, "--without", B[1], "--without", B[2])
        assert status == 1 and doc["violations"][0]["category"] == "WOULD_HAVE_LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY"
    finally:
        for a in agents:
            a.stop(grace=0)


def test_the_auditor_answers_whatif_and_reports_the_blast_radius(cluster: tuple, tmp_path: Path) -> None:  # type: ignore[type-arg]
    import grpc

    from scrutiny.auditor import Auditor, AuditorSettings
    from scrutiny.scan.engines import LocalEngine
    from scrutiny.v1 import auditor_pb2, auditor_pb2_grpc
    from tests.support.helpers import wait_for

    uri, mds, held = cluster
    scan = ScanSettings(metadata_service_uri=uri, engine="local", placement_policy="none", recheck_delay=0.2)
    settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp_path), underreplication_interval_seconds=0,
                               insecure_open_rescan=True)
    auditor = Auditor(scan, settings, engine=LocalEngine()).start()
    try:
        wait_for(lambda: "full" in auditor.last, 60)
        full = auditor.last["full"].report
        assert full is not None and full.blast_radius is not None and B[0] in full.blast_radius["bookies"]
        stub = auditor_pb2_grpc.AuditorStub(grpc.insecure_channel(auditor.address))
        resp = stub.WhatIf(auditor_pb2.WhatIfRequest(bookie_ids=[B[0]], wait=True), timeout=60)
        doc = json.loads(resp.report_json)
        unsafe = {md.ledger_id for md in mds.values()
                  if B[0] in md.bookies and least_without(md, held, {B[0]}) < md.ack_quorum}
        assert {v["ledger_id"] for v in doc["violations"]
                if v["category"].startswith("WOULD_HAVE_NO") or v["category"].startswith("WOULD_HAVE_LESS_THAN_AQ")
                or "unsafe_without" in v["details"]} == unsafe
        assert full.blast_radius["bookies"][B[0]]["ledgers_below_aq"] == len(unsafe)  # the lookup agrees with the run
        with pytest.raises(grpc.RpcError) as err:
            stub.WhatIf(auditor_pb2.WhatIfRequest())
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        auditor.stop()
