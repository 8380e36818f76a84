"""The real thing: bookies, AutoRecovery and BookKeeper's shell from each release tests/peers/versions names
(`make peers` fetches them), on the session's ZooKeeper. Every test here runs once a BookKeeper line."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from scrutiny.testing.localzk import LocalZooKeeper
from scrutiny.testing.realbookkeeper import RealBookKeeper, Release

VERSIONS = Path(__file__).resolve().parents[1] / "peers" / "versions"
_roots = itertools.count()


def bookkeeper_versions() -> list[str]:
    return [line.split()[1] for line in VERSIONS.read_text().splitlines() if line.startswith("bookkeeper ")]


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
    cluster = RealBookKeeper(release, zk_server.hosts, f"/real{next(_roots)}/ledgers", tmp_path / "bk")
    try:
        yield cluster
    finally:
        cluster.close()
