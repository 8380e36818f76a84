"""Test tooling, apart from what runs in production: a private ZooKeeper from Debian's jars, a writer
of the tree a real cluster keeps, bookies' synthetic stores, the demo cluster. It may drive kazoo
directly: it plays the cluster, not scrutiny."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from kazoo.client import KazooClient

from scrutiny.config import ClusterSettings
from scrutiny.store import MetadataStore, open_store
from scrutiny.store.zookeeper import ZooKeeperStore


def store_at(uri: str, **settings: Any) -> MetadataStore:
    """A store opened the way scrutiny opens it, on `uri`, with ClusterSettings overrides."""
    return open_store(ClusterSettings(metadata_service_uri=uri, **settings))


def store_on(client: KazooClient, uri: str) -> ZooKeeperStore:
    """A store on a client the test already holds (its session, its credentials)."""
    return ZooKeeperStore(client, uri)


@contextlib.contextmanager
def store_for(client: Any, uri: str) -> Iterator[MetadataStore]:
    """The store a writer's cluster is read through: the writer's own ZooKeeper session (left open), or a
    store opened on etcd for the while (the writer there is an `EtcdTree`, no session to share)."""
    if isinstance(client, KazooClient):
        yield store_on(client, uri)
        return
    with open_store(ClusterSettings(metadata_service_uri=uri, etcd_lease_ttl=5)) as store:
        yield store
