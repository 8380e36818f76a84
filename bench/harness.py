"""The benches' one cluster harness: a private ZooKeeper from Debian's jars, a client on it, the cluster's root,
URI and writer, and agents that serve in-process holdings, registered as the bookies' agents; closed in the
reverse order."""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Self

from kazoo.client import KazooClient

from scrutiny.agent import BookieAgent
from scrutiny.entrysources import EntrySource
from scrutiny.metadata import BookieRegistration
from scrutiny.testing import store_on
from scrutiny.testing.clusterwriter import ClusterWriter
from scrutiny.testing.localzk import LocalZooKeeper


class BenchCluster:
    def __init__(self, heap: str = "1g", root: str = "/bench/ledgers") -> None:
        self.zk = LocalZooKeeper(heap=heap)
        self.zk.start()
        self.client = KazooClient(hosts=self.zk.hosts, timeout=30)
        self.client.start(timeout=30)
        self.root = root
        self.uri = f"zk+hierarchical://{self.zk.hosts}{root}"
        self.writer = ClusterWriter(self.client, root)
        self.agents: dict[str, BookieAgent] = {}

    def serve(self, holdings: Mapping[str, EntrySource]) -> None:
        """An agent in this process for each bookie's holdings, registered, and the bookie registered too."""
        registry = store_on(self.client, self.uri)
        for bookie, source in holdings.items():
            agent = BookieAgent(source, bind="127.0.0.1:0", workers=4).start()
            agent.register(registry, bookie, f"127.0.0.1:{agent.port}")
            self.writer.register_bookie(BookieRegistration(bookie, False))
            self.agents[bookie] = agent

    def close(self) -> None:
        for agent in self.agents.values():
            agent.stop(grace=0)
        self.client.stop()
        self.client.close()
        self.zk.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
