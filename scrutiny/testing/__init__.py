"""Test tooling, apart from what runs in production: a private ZooKeeper from Debian's jars, a writer
of the tree a real cluster keeps, bookies' synthetic stores, the demo cluster. It may drive kazoo
directly: it plays the cluster, not scrutiny."""

from __future__ import annotations

from typing import Any

from kazoo.client import KazooClient

from scrutiny.config import ClusterSettings
from scrutiny.store import MetadataStore, open_store
from scrutiny.store.zookeeper import ZooKeeperStore


def store_at(uri: str, **settings: Any) -> ZooKeeperStore:
    """A store opened the way scrutiny opens it, on `uri`, with ClusterSettings overrides."""
    store = open_store(ClusterSettings(metadata_service_uri=uri, **settings))
    assert isinstance(store, ZooKeeperStore)
    return store


def store_on(client: KazooClient, uri: str) -> ZooKeeperStore:
    """A store on a client the test already holds (its session, its credentials)."""
    return ZooKeeperStore(client, uri)


def store_for(client: Any, uri: str) -> MetadataStore:
    """The store a writer's cluster is read through: on the writer's own ZooKeeper session, or opened on
    etcd (the writer there is an `EtcdTree`, no session to share)."""
    if isinstance(client, KazooClient):
        return store_on(client, uri)
    return open_store(ClusterSettings(metadata_service_uri=uri, etcd_lease_ttl=5))
