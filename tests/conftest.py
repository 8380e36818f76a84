"""Shared fixtures: one real ZooKeeper server per session (Debian's jars), a namespace per test."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from scrutiny.localzk import LocalZooKeeper

_counter = itertools.count()


@pytest.fixture(scope="session")
def zk_server() -> Iterator[LocalZooKeeper]:
    server = LocalZooKeeper()
    server.start()
    yield server
    server.close()


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
