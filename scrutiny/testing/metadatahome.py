"""Where a real cluster of the tests keeps its metadata: BookKeeper's own layout on the tests' ZooKeeper (a root of
the cluster's, Pulsar's records beside it under the root's parent, as a production broker keeps them), or Pulsar's
metadata store on etcd (PIP-45: no chroot, the ledgers at /ledgers, Pulsar's records at the top). On etcd every
process is Pulsar's (its jars), loading Pulsar's BookKeeper metadata drivers as `bin/pulsar` does."""

from __future__ import annotations

from typing import Protocol

from kazoo.client import KazooClient

from scrutiny.testing.localetcd import EtcdTree

# bin/pulsar's BK_METADATA_OPTIONS: BookKeeper's `metadata-store:` URIs served by Pulsar's metadata store
PULSAR_DRIVERS = (
    "-Dbookkeeper.metadata.bookie.drivers=org.apache.pulsar.metadata.bookkeeper.PulsarMetadataBookieDriver",
    "-Dbookkeeper.metadata.client.drivers=org.apache.pulsar.metadata.bookkeeper.PulsarMetadataClientDriver")


class MetadataHome(Protocol):
    uri: str  # BookKeeper's metadataServiceUri
    root: str  # the ledgers' root
    pulsar_store: str  # a broker's metadataStoreUrl
    pulsar_root: str  # the path Pulsar's records are under ("" at the top)
    jvm: tuple[str, ...]  # what every process of the cluster is started with
    tree: KazooClient | EtcdTree  # the tests' own view of it, as the cluster's processes keep it

    def close(self) -> None: ...


class OnZooKeeper:
    def __init__(self, hosts: str, root: str = "/ledgers") -> None:
        self.root = root
        self.uri = f"zk+hierarchical://{hosts}{root}"
        self.pulsar_root = root.rsplit("/", 1)[0]
        self.pulsar_store = f"zk:{hosts}{self.pulsar_root}"
        self.jvm: tuple[str, ...] = ()
        self.tree = KazooClient(hosts=hosts, timeout=15)
        self.tree.start(timeout=30)
        self.tree.ensure_path(self.pulsar_root or "/")  # initnewcluster creates the root, not its parents

    def close(self) -> None:
        self.tree.stop()
        self.tree.close()


class OnEtcd:
    def __init__(self, endpoint: str) -> None:
        self.root, self.pulsar_root = "/ledgers", ""
        self.uri = f"metadata-store:etcd:{endpoint}"
        self.pulsar_store = f"etcd:{endpoint}"
        self.jvm = PULSAR_DRIVERS
        self.tree = EtcdTree(endpoint)

    def close(self) -> None:
        self.tree.close()
