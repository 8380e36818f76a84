"""Metadata reads per second from one ZooKeeper on this machine: one at a time (the baseline) against
pipelined reads with a bound on requests in flight, in one run.

    python -m bench.zkreads [--ledgers 20000]
"""

from __future__ import annotations

import argparse
import time

from kazoo.client import KazooClient

from bench.common import table
from scrutiny.metadata import Layout, LedgerMetadata, LedgerState, Segment, ledger_path
from scrutiny.store.zookeeper import ZooKeeperStore
from scrutiny.testing import store_at
from scrutiny.testing.clusterwriter import ClusterWriter
from scrutiny.testing.localzk import LocalZooKeeper

ENS = ("10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181")


def run(ledgers: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    with LocalZooKeeper() as zk:
        client = KazooClient(hosts=zk.hosts)
        client.start()
        t0 = time.perf_counter()
        ClusterWriter(client, "/ledgers").init_cluster()
        ClusterWriter(client, "/ledgers").write_ledgers(
            LedgerMetadata(i, LedgerState.CLOSED, 3, 2, 2, 999, 0, (Segment(0, ENS),)) for i in range(ledgers))
        rows.append({"what": f"write {ledgers} ledgers (batched transactions)", "seconds": time.perf_counter() - t0,
                     "per second": ledgers / (time.perf_counter() - t0)})
        paths = [ledger_path(Layout.HIERARCHICAL, "/ledgers", i) for i in range(ledgers)]
        n = min(ledgers, 5000)
        t0 = time.perf_counter()
        for p in paths[:n]:
            client.get(p)
        dt = time.perf_counter() - t0
        base = n / dt
        rows.append({"what": f"get one at a time ({n})", "seconds": dt, "per second": base, "x baseline": 1.0})
        client.stop()
        for bound in (16, 256):
            with store_at(f"zk+hierarchical://{zk.hosts}/ledgers", zk_max_in_flight=bound) as store:
                assert isinstance(store, ZooKeeperStore)
                t0 = time.perf_counter()
                got = sum(1 for _ in store.get_many(paths))
                dt = time.perf_counter() - t0
                rows.append({"what": f"pipelined get, <= {bound} in flight", "seconds": dt,
                             "per second": got / dt, "x baseline": got / dt / base})
                t0 = time.perf_counter()
                got = sum(1 for r in store.read_ledgers(range(ledgers)) if r.metadata)
                dt = time.perf_counter() - t0
                rows.append({"what": f"pipelined read + decode, <= {bound} in flight", "seconds": dt,
                             "per second": got / dt, "x baseline": got / dt / base})
        with store_at(f"zk+hierarchical://{zk.hosts}/ledgers") as store:
            t0 = time.perf_counter()
            ranges = store.ledger_ranges()
            ids = sum(len(store.ledger_ids(r)) for r in ranges)
            dt = time.perf_counter() - t0
            rows.append({"what": f"enumerate {ids} ledgers ({len(ranges)} ranges)", "seconds": dt,
                         "per second": ids / dt})
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ledgers", type=int, default=20000)
    print(table(run(p.parse_args().ledgers)))


if __name__ == "__main__":
    main()
