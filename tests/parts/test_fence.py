"""A deposed leader cannot mark: each mark is written in one transaction with the leader's own election node, so a
leader whose session the store expired (stalled, paused, cut off) and another took over is refused, whatever it
still believes; the new leader marks. On ZooKeeper (kazoo opens a new session by itself: only the fence refuses)
and on etcd (the lease revoked)."""

from __future__ import annotations

import contextlib
import subprocess
import threading
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from scrutiny.config import ClusterSettings
from scrutiny.errors import Fenced
from scrutiny.metadata import UnderreplicationMark
from scrutiny.store import Election, MetadataStore, open_store
from scrutiny.store.etcd import EtcdStore
from scrutiny.store.zookeeper import ZooKeeperStore
from scrutiny.testing.clusterwriter import ClusterWriter
from tests.conftest import Place
from tests.parts.test_etcdstore import B, closed
from tests.support.helpers import wait_for


@contextlib.contextmanager
def leading(store: MetadataStore, name: str) -> Iterator[tuple[Election, threading.Event]]:
    """`store` contending in the auditors' election: the election, and whether it leads now."""
    election, now, done = store.election(name), threading.Event(), threading.Event()

    def lead() -> None:
        now.set()
        done.wait()
        now.clear()

    thread = threading.Thread(target=election.run, args=(lead,), daemon=True)
    thread.start()
    try:
        yield election, now
    finally:
        done.set()
        election.cancel()
        thread.join(30)  # it lets go on a live session, as `Leadership.stop` waits for it before closing the store


def lose_session(store: MetadataStore, place: Place) -> None:
    """The store expires `store`'s session, as it does to a process stalled past its timeout."""
    if isinstance(store, ZooKeeperStore):
        sid, password = store.client.client_id
        other = KazooClient(hosts=place.uri.split("//", 1)[1].split("/", 1)[0], client_id=(sid, password))
        other.start(timeout=10)
        other.stop()  # closes that session on the server
        other.close()
    else:
        assert isinstance(store, EtcdStore)
        subprocess.run(["etcdctl", "--endpoints", place.uri.split("//", 1)[1].split("/", 1)[0].replace(";", ","),
                        "lease", "revoke", f"{store.session.lease:x}"], check=True, capture_output=True, timeout=30)


def answers(store: MetadataStore) -> bool:
    try:
        store.replication_disabled()
        return True
    except Exception:
        return False


def test_a_deposed_leaders_mark_is_refused_and_the_new_leaders_written(place: Place) -> None:
    w = ClusterWriter(place.client, place.root)
    w.init_cluster()
    w.write_ledgers([closed(1), closed(2)])
    settings = {"zk_session_timeout": 4, "etcd_lease_ttl": 4}
    with open_store(ClusterSettings(metadata_service_uri=place.uri, **settings)) as first, \
            open_store(ClusterSettings(metadata_service_uri=place.uri, **settings)) as second:
        versions = {r.ledger_id: r.metadata.znode_version for r in first.read_ledgers([1, 2]) if r.metadata}
        with leading(first, "first") as (old, first_leads):
            wait_for(first_leads.is_set, 10)
            fence = old.fence()
            assert fence is not None
            with leading(second, "second") as (new, second_leads):
                lose_session(first, place)
                wait_for(second_leads.is_set, 30)
                wait_for(lambda: answers(first), 30)  # the first goes on, on a new session (kazoo opens one)
                # the first still believes it leads (its lead() has not returned): the store refuses its mark
                with pytest.raises(Fenced, match="leads no more"):
                    first.mark_underreplicated(UnderreplicationMark(1, (B[0],), 1), versions[1], fence)
                assert first.underreplication_mark(1) is None
                again = new.fence()
                assert again is not None and again != fence
                assert second.mark_underreplicated(UnderreplicationMark(2, (B[0],), 1), versions[2], again)
                assert second.underreplication_mark(2) is not None
                # a fence standing, the ledger's own conditions still hold
                assert not second.mark_underreplicated(UnderreplicationMark(2, (B[1],), 1), versions[2], again)
