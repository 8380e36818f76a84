"""The real thing: bookies, AutoRecovery and BookKeeper's shell from each release tests/peers/versions names
(`make peers` fetches them), on the session's ZooKeeper. Every test here runs once a BookKeeper line."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scrutiny.agent import BookieAgent
from scrutiny.checks import expected_share
from scrutiny.codec import Availability
from scrutiny.config import ScanSettings
from scrutiny.entrysources import DbLedgerStorageSource
from scrutiny.entrysources.bridge import BookieBridgeSource
from scrutiny.entrysources.entrylogs import log_ids_in
from scrutiny.metadata import LedgerState
from scrutiny.report import Report
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import LocalEngine
from scrutiny.testing import store_at
from scrutiny.testing.localetcd import LocalEtcd
from scrutiny.testing.localzk import LocalZooKeeper
from scrutiny.testing.metadatahome import OnEtcd, OnZooKeeper
from scrutiny.testing.realbookkeeper import DB_LEDGER_STORAGE, RealBookie, RealBookKeeper, Release
from scrutiny.testing.realpulsar import RealPulsar
from tests.support.helpers import wait_for

VERSIONS = Path(__file__).resolve().parents[1] / "peers" / "versions"
_roots = itertools.count()


def bookkeeper_versions() -> list[str]:
    return [line.split()[1] for line in VERSIONS.read_text().splitlines() if line.startswith("bookkeeper ")]


def pulsar_versions() -> list[tuple[str, str]]:
    """Each Pulsar release, with the BookKeeper release its bookies run."""
    return [(w[1], w[2]) for line in VERSIONS.read_text().splitlines() if (w := line.split())[:1] == ["pulsar"]]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/real/" in str(item.fspath):
            item.add_marker(pytest.mark.real)


@pytest.fixture(params=bookkeeper_versions(), ids=lambda v: f"bk{v}")
def release(request: pytest.FixtureRequest) -> Release:
    return Release.of(request.param)


@pytest.fixture
def bookkeeper(release: Release, zk_server: LocalZooKeeper, tmp_path: Path) -> Iterator[RealBookKeeper]:
    """An empty cluster of this release under a root of the test's own (no bookie yet)."""
    cluster = RealBookKeeper(release, OnZooKeeper(zk_server.hosts, f"/real{next(_roots)}/ledgers"), tmp_path / "bk")
    try:
        yield cluster
    finally:
        cluster.close()


PulsarOn = tuple[RealBookKeeper, "Agents", Callable[..., RealPulsar]]


@contextlib.contextmanager
def pulsar_cluster(cluster: RealBookKeeper, release: Release, tmp_path: Path) -> Iterator[PulsarOn]:
    """Three DbLedgerStorage bookies of `cluster`, each with its agent, and what starts a broker of `release` on
    them (with the broker's settings over the harness's); all of it stopped after, the cluster closed."""
    agents = Agents(cluster, tmp_path)
    brokers: list[RealPulsar] = []

    def broker(**settings: Any) -> RealPulsar:
        brokers.append(RealPulsar(release, cluster, **settings))
        return brokers[-1]

    try:
        for _ in range(3):
            agents.serve(cluster.add_bookie())
        yield cluster, agents, broker
    finally:
        for b in brokers:
            b.close()
        agents.close()
        cluster.close()


@pytest.fixture(params=pulsar_versions(), ids=lambda v: f"pulsar{v[0]}")
def pulsar_on(request: pytest.FixtureRequest, zk_server: LocalZooKeeper, tmp_path: Path) -> Iterator[PulsarOn]:
    """A real cluster of the Pulsar release's BookKeeper line, its broker's records beside BookKeeper's root."""
    version, bk_version = request.param
    cluster = RealBookKeeper(Release.of(bk_version), OnZooKeeper(zk_server.hosts, f"/real{next(_roots)}/ledgers"),
                             tmp_path / "bk")
    with pulsar_cluster(cluster, Release.of(version, project="pulsar"), tmp_path) as on:
        yield on


# Pulsar releases whose etcd metadata store does not start: the reason
ETCD_BROKEN = {"3.0.7": "its jetcd-core-shaded jar was shaded twice (NoClassDefFoundError: io/grpc/netty/shaded/io/"
                        "grpc/netty/shaded/.../ByteBufFormat), apache/pulsar#23513, fixed in 3.0.8, not served here"}


@pytest.fixture(params=[pytest.param(v, marks=pytest.mark.skip(reason=f"Pulsar {v[0]} on etcd: {ETCD_BROKEN[v[0]]}"))
                        if v[0] in ETCD_BROKEN else v for v in pulsar_versions()], ids=lambda v: f"pulsar{v[0]}")
def pulsar_on_etcd(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PulsarOn]:
    """As `pulsar_on`, with every record on Pulsar's metadata store on an etcd of the test's own (it has no chroot):
    the bookies of the release's own jars (its BookKeeper, Pulsar's drivers), as `bin/pulsar bookie` runs them."""
    release = Release.of(request.param[0], project="pulsar")
    (tmp_path / "etcd").mkdir()
    etcd = LocalEtcd(tmp_path / "etcd")
    etcd.start()
    try:
        with pulsar_cluster(RealBookKeeper(release, OnEtcd(etcd.endpoint), tmp_path / "bk"), release, tmp_path) as on:
            yield on
    finally:
        etcd.close()


class Agents:
    """scrutiny's agent beside each bookie of a real cluster, in this process, registered as the bookie's agent:
    a DbLedgerStorage bookie's reads its indexes and entry logs (read-only, watching them), a stock bookie's is the
    bridge to it."""

    def __init__(self, cluster: RealBookKeeper, tmp_path: Path) -> None:
        self.cluster, self.tmp_path = cluster, tmp_path
        self.store = store_at(cluster.uri)
        self.agents: dict[str, BookieAgent] = {}

    def serve(self, bookie: RealBookie) -> BookieAgent:
        source: Any
        if bookie.settings["ledgerStorageClass"] == DB_LEDGER_STORAGE:
            source = DbLedgerStorageSource([bookie.ledger_dir], self.tmp_path / f"scratch-{bookie.name}")
        else:
            source = BookieBridgeSource("127.0.0.1", bookie.port, timeout=5)
        agent = BookieAgent(source, bind="127.0.0.1:0", workers=4, watch_interval_seconds=0.5).start()
        agent.register(self.store, bookie.bookie_id, f"127.0.0.1:{agent.port}")
        self.agents[bookie.bookie_id] = agent
        return agent

    def bookies(self, n: int, **settings: object) -> list[RealBookie]:
        """`n` new bookies of the cluster (with these settings), each served by its agent."""
        bookies = [self.cluster.add_bookie(**settings) for _ in range(n)]  # type: ignore[arg-type]
        for b in bookies:
            self.serve(b)
        return bookies

    def stop(self, bookie: RealBookie) -> None:
        self.agents.pop(bookie.bookie_id).stop(grace=0)

    def close(self) -> None:
        for agent in self.agents.values():
            agent.stop(grace=0)
        self.store.close()


def _count(read: Callable[[], tuple[np.ndarray, bool] | None]) -> str:
    try:
        got = read()
    except Exception as exc:
        return repr(exc)
    return "no ledger" if got is None else f"{got[0].size}{' limbo' if got[1] else ''}"


def holding_now(agents: Agents, bookie: RealBookie, ledger_id: int) -> str:
    """What the bookie holds of the ledger now, two ways: its agent, and its indexes opened afresh; and the entry
    logs the fresh reading places the entries in, against those in its directory. A false alarm's diagnosis: a stale
    agent, or an index or a log that lacks them. (A DbLedgerStorage bookie does not answer BP-34's call itself.)"""
    source = agents.agents[bookie.bookie_id].source
    if not isinstance(source, DbLedgerStorageSource):
        return f"{bookie.bookie_id} ledger {ledger_id}: no agent reading its files"
    fresh = DbLedgerStorageSource([bookie.ledger_dir], agents.tmp_path / f"fresh-{next(_roots)}")
    try:
        logs = sorted({loc >> 32 for _, _, loc in fresh.locations_of(ledger_id) or []})
        afresh = _count(lambda: fresh.entry_ids(ledger_id))
    finally:
        fresh.close()

    def agent_now() -> tuple[np.ndarray, bool] | None:
        source.refresh()
        return source.entry_ids(ledger_id)

    return (f"{bookie.bookie_id} ledger {ledger_id}: agent {_count(agent_now)}, afresh {afresh}; in logs {logs}, "
            f"logs there {sorted(log_ids_in(bookie.ledger_dir))}")


@pytest.fixture
def agents(bookkeeper: RealBookKeeper, tmp_path: Path) -> Iterator[Agents]:
    a = Agents(bookkeeper, tmp_path)
    try:
        yield a
    finally:
        a.close()


def scan_settings(cluster: RealBookKeeper, **settings: Any) -> ScanSettings:
    """How the tests scan a real cluster: the local engine; no rack map (the real client places ledgers on the
    default rack); a delayed look longer than a bookie's restart, and the write cache's lag (flushInterval 1 s)
    re-checked rather than reported."""
    return ScanSettings(**{"metadata_service_uri": cluster.uri, "engine": "local", "placement_policy": "none",
                           "recheck_delay": 8.0, "write_cache_grace_seconds": 3.0, "bookie_deadline_seconds": 10.0,
                           **settings})


def scan(cluster: RealBookKeeper, **settings: Any) -> Report:
    report = ScrutinyRun(scan_settings(cluster, **settings), LocalEngine()).execute()
    assert report.complete, report.errors[:3]
    return report


def findings(report: Report) -> set[tuple[str, int]]:
    return {(str(v.category), v.ledger_id) for v in report.violations}


def flushed(agents: Agents, ledger_ids: Iterable[int], timeout: float = 120.0, added: Mapping[int, int] = {}) -> None:
    """Until every DbLedgerStorage bookie of these ledgers (served by `agents`) lists its whole share of each in its
    index: its write cache flushed, which a bookie does every flushInterval and a loaded machine stretches. An open
    ledger's metadata names no last entry: `added` says the last the test added to it."""
    with store_at(agents.cluster.uri) as store:
        mds = [r.metadata for r in store.read_ledgers(sorted(ledger_ids))]
    for i, md in enumerate(mds):
        assert md is not None
        if md.state != LedgerState.CLOSED:
            assert md.ledger_id in added, f"ledger {md.ledger_id} is open: say the last entry added to it"
            mds[i] = dataclasses.replace(md, last_entry_id=added[md.ledger_id])

    def lacking() -> list[tuple[int, str]]:
        out = []
        for md in mds:
            assert md is not None
            for b in sorted(md.bookies):
                source = agents.agents[b].source if b in agents.agents else None
                if not isinstance(source, DbLedgerStorageSource):
                    continue  # a stock bookie answers from its write cache too
                source.refresh()
                got = source.entry_ids(md.ledger_id)
                want = Availability.of(expected_share(md, b)).entry_ids()
                if got is None or not np.isin(want, got[0]).all():
                    out.append((md.ledger_id, b))
        return out

    wait_for(lambda: not lacking(), timeout, lambda: f"for the bookies' flush: {lacking()}")
