"""Shared fixtures: one real ZooKeeper server per session (Debian's jars), a namespace per test."""

from __future__ import annotations

import contextlib
import gc
import itertools
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import hypothesis
import pytest
from kazoo.client import KazooClient

from scrutiny.scan.work import EXECUTOR
from scrutiny.store import MetadataStore
from scrutiny.testing import store_for
from scrutiny.testing.localetcd import EtcdTree, LocalEtcd
from scrutiny.testing.localzk import LocalZooKeeper

_counter = itertools.count()
# No deadline per example: a loaded machine makes any of them slow, and timing is the benches' business
hypothesis.settings.register_profile("scrutiny", deadline=None)
hypothesis.settings.load_profile("scrutiny")


@pytest.fixture(scope="session")
def zk_server() -> Iterator[LocalZooKeeper]:
    server = LocalZooKeeper()
    server.start()
    yield server
    EXECUTOR.close()  # sessions cached by in-process runs: close them before the server goes
    close_leaked_clients()
    server.close()


def close_leaked_clients() -> None:
    """Every kazoo client still open at the end is a leak (it would reconnect, noisily, to the stopped
    server): name it and close it."""
    gc.collect()
    for client in [o for o in gc.get_objects() if isinstance(o, KazooClient)]:
        if not client._stopped.is_set():
            print(f"\nleaked ZooKeeper client to {client.hosts}: closing it", file=sys.stderr)
            client.stop()
            client.close()


@pytest.fixture
def zk_namespace(zk_server: LocalZooKeeper, request: pytest.FixtureRequest) -> str:
    """A fresh path for this test's cluster: its ledgers root is `<namespace>/ledgers`."""
    if not zk_server.running:  # a fault test may have stopped it
        zk_server.start()
    name = request.node.name.replace("[", "-").replace("]", "").replace("/", "-")[:60]
    return f"/t{next(_counter)}-{name}"


@pytest.fixture
def zk_client(zk_server: LocalZooKeeper) -> Iterator[KazooClient]:
    client = KazooClient(hosts=zk_server.hosts, timeout=10)
    client.start(timeout=15)
    yield client
    client.stop()
    client.close()


@pytest.fixture(scope="session")
def etcd_server(spark_engine: object) -> Iterator[LocalEtcd]:
    """One real etcd per session (Debian's etcd-server). Spark first: its JVM cannot be forked while the
    etcd clients' gRPC threads (a lease's keep-alives) are busy."""
    server = LocalEtcd()
    server.start()
    yield server
    EXECUTOR.close()  # stores cached by in-process runs, before their server goes
    server.close()


@pytest.fixture
def etcd_tree(etcd_server: LocalEtcd) -> Iterator[EtcdTree]:
    """An empty etcd for this test (Pulsar's etcd store has no chroot: the cluster is at /ledgers), and
    the writer's view of it."""
    tree = EtcdTree(etcd_server.endpoint)
    tree.kv.delete(b"\0", b"\0")  # every key
    yield tree
    tree.close()


@dataclass
class Place:
    """Where a test writes its cluster: `client` writes it (ClusterWriter's client), `uri` names it for
    scrutiny, `registry` is a store on it for the agents' registrations."""

    client: Any
    root: str
    uri: str
    registry: MetadataStore


@contextlib.contextmanager
def place_on(request: pytest.FixtureRequest, store: str) -> Iterator[Place]:
    """A place on ZooKeeper (BookKeeper's own layout, a namespace of this test's) or on etcd (Pulsar's
    metadata store, emptied for this test)."""
    if store == "zk":
        client = request.getfixturevalue("zk_client")
        root = f"{request.getfixturevalue('zk_namespace')}/ledgers"
        uri = f"zk+hierarchical://{request.getfixturevalue('zk_server').hosts}{root}"
    else:
        client, root, uri = request.getfixturevalue("etcd_tree"), "/ledgers", request.getfixturevalue("etcd_server").uri
    with store_for(client, uri) as registry:
        yield Place(client, root, uri, registry)


@pytest.fixture(params=["zk", "etcd"])
def place(request: pytest.FixtureRequest) -> Iterator[Place]:
    """The same scenario on ZooKeeper and on etcd."""
    with place_on(request, request.param) as p:
        yield p


@pytest.fixture(scope="session", autouse=True)
def spark_before_grpc(request: pytest.FixtureRequest) -> None:
    """A session that will use Spark starts it before its first test. pyspark forks Spark's JVM (a subprocess
    with a preexec_fn), and a fork while gRPC's threads are busy (an agent, a channel, an etcd lease) can
    lose the child: CI once saw `JAVA_GATEWAY_EXITED` on the one xdist worker whose first Spark test came
    after gRPC tests, and every Spark and etcd test of that worker failed with it."""
    if any("spark_engine" in item.fixturenames for item in request.session.items):
        request.getfixturevalue("spark_engine")


@pytest.fixture(scope="session")
def spark_engine() -> Iterator[object]:
    """One real SparkSession (local mode) for the whole test session."""
    from scrutiny.scan.engines import SparkEngine, spark_session

    session = spark_session("local[2]")
    yield SparkEngine(session=session)
    session.stop()
