"""What one change notification costs the auditor, against what one ledger costs a full run's read, in one
run: the floor under continuous scrutiny's cost per change.

A process holds the store's persistent recursive watch (`TreeWatch`, as the auditor's leader does) while
another process changes ledgers, in a burst and at a slow steady rate: the CPU, per notification, of the
thread that receives them (kazoo's connection thread), its idle CPU over the same time subtracted; a floor,
since what the auditor then does with a notification is not counted. The baseline: the same process
reading ledgers as a full run does (`read_ledgers`: multiRead, a thousand znodes a request, decoded), the
whole process's CPU per ledger. Medians of `--rounds`.

ZooKeeper's side too: its CPU per notification is the burst's changes written with the watch held less
the same writes without it, against its CPU per ledger of the full run's read. No client can lower it:
learning that a ledger closed takes a notification (or a read of the ledger).

    python -m bench.zkwatch [--ledgers 3000 --slow-rate 4 --slow-seconds 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from typing import Any

from kazoo.client import KazooClient

from bench.common import cpu_seconds, table, thread_cpu
from scrutiny.config import ScanSettings
from scrutiny.metadata import (
    Layout,
    LedgerMetadata,
    LedgerState,
    Segment,
    encode_ledger_metadata,
    ledger_path,
    parse_metadata_service_uri,
)
from scrutiny.store.zkwatch import TreeWatch
from scrutiny.store.zookeeper import new_client
from scrutiny.testing import processes, store_at
from scrutiny.testing.clusterwriter import ClusterWriter
from scrutiny.testing.localzk import LocalZooKeeper

ENS = ("10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181")
ROOT = "/ledgers"
WRITER = """
import sys, time
from kazoo.client import KazooClient
hosts, data, rate = sys.argv[1], bytes.fromhex(sys.argv[2]), float(sys.argv[3])
paths = sys.stdin.read().split()
c = KazooClient(hosts=hosts)
c.start()
t0 = time.monotonic()
for i, p in enumerate(paths):
    c.set(p, data)
    if rate:
        time.sleep(max(0.0, t0 + (i + 1) / rate - time.monotonic()))
c.stop()
"""


def md(lid: int, last: int = 999) -> LedgerMetadata:
    return LedgerMetadata(lid, LedgerState.CLOSED, 3, 2, 2, last, 0, (Segment(0, ENS),))


def write(zk: LocalZooKeeper, ids: list[int], rate: float) -> None:
    """Another process sets the ledgers' znodes, `rate` a second (0: as fast as it can)."""
    paths = "\n".join(ledger_path(Layout.HIERARCHICAL, ROOT, i) for i in ids)
    data = encode_ledger_metadata(md(ids[0], 1000)).hex()
    processes.run([sys.executable, "-c", WRITER, zk.hosts, data, str(rate)], input=paths.encode(), check=True,
                   timeout=600)


def notifications(zk: LocalZooKeeper, ids: list[int], rate: float) -> tuple[float, float]:
    """CPU seconds per notification while another process changes `ids` at `rate` a second: of the
    receiving thread, its idle CPU over the same time subtracted (the thread's, not the process's: waiting
    for the writer with a bound polls in this process); and ZooKeeper's, all of it (the writes' own cost
    is subtracted by the caller)."""
    uri = f"zk+hierarchical://{zk.hosts}{ROOT}"
    client = new_client(ScanSettings(metadata_service_uri=uri), parse_metadata_service_uri(uri))  # as the auditor's
    client.start()
    seen, all_seen = [0], threading.Event()

    def on_event(kind: str, path: str) -> None:
        seen[0] += 1
        if seen[0] >= len(ids):
            all_seen.set()

    watch = TreeWatch(client, ROOT, on_event, lambda why: None)
    try:
        receiver = client._connection._connection_routine.native_id
        c0, z0, t0 = thread_cpu(receiver), cpu_seconds(zk.pid), time.monotonic()
        write(zk, ids, rate)
        all_seen.wait(30)  # no polling: this process does nothing but receive
        spent, took, on_zk = thread_cpu(receiver) - c0, time.monotonic() - t0, cpu_seconds(zk.pid) - z0
        i0 = thread_cpu(receiver)
        time.sleep(min(took, 10.0))  # the thread's idle cost (its pings) over the same time
        idle = (thread_cpu(receiver) - i0) * took / min(took, 10.0)
        return max(0.0, spent - idle) / max(1, seen[0]), on_zk / max(1, seen[0])
    finally:
        watch.close()
        client.stop()
        client.close()


def unwatched_writes(zk: LocalZooKeeper, ids: list[int]) -> float:
    """ZooKeeper's CPU seconds per write of the burst with nobody watching."""
    z0 = cpu_seconds(zk.pid)
    write(zk, ids, 0)
    return (cpu_seconds(zk.pid) - z0) / len(ids)


def full_run_reads(zk: LocalZooKeeper, ledgers: int) -> tuple[float, float]:
    """CPU seconds per ledger of a full run's read: this process's, and ZooKeeper's."""
    store = store_at(f"zk+hierarchical://{zk.hosts}{ROOT}")
    try:
        ids = list(range(ledgers))
        c0, z0 = cpu_seconds(), cpu_seconds(zk.pid)
        read = sum(1 for r in store.read_ledgers(ids) if r.metadata is not None)
        assert read == ledgers
        return (cpu_seconds() - c0) / ledgers, (cpu_seconds(zk.pid) - z0) / ledgers
    finally:
        store.close()


def run(ledgers: int, slow_rate: float, slow_seconds: float, rounds: int) -> list[dict[str, Any]]:
    got: dict[str, list[float]] = {k: [] for k in ("full", "burst", "slow", "zk full", "zk burst", "zk slow")}
    with LocalZooKeeper() as zk:
        client = KazooClient(hosts=zk.hosts)
        client.start()
        writer = ClusterWriter(client, ROOT)
        writer.init_cluster()
        writer.write_ledgers(md(i) for i in range(ledgers))
        client.stop()
        ids = list(range(ledgers))
        slow = list(range(int(slow_rate * slow_seconds)))
        unwatched_writes(zk, ids)  # ZooKeeper's JIT warmed on these writes before either is measured
        for _ in range(rounds):
            for k, v in zip(("full", "zk full"), full_run_reads(zk, ledgers), strict=True):
                got[k].append(v)
            unwatched = unwatched_writes(zk, ids)
            for kind, changed, rate in (("burst", ids, 0.0), ("slow", slow, slow_rate)):
                receiving, on_zk = notifications(zk, changed, rate)
                got[kind].append(receiving)
                if kind == "burst":  # at a slow rate ZooKeeper's idle CPU over the time would swamp it
                    got["zk burst"].append(on_zk - unwatched)
    full, zk_full = statistics.median(got["full"]), statistics.median(got["zk full"])
    rows = [{"what": f"a full run's read of a ledger (multiRead, {ledgers} ledgers)", "cpu us": full * 1e6,
             "x the full run's": 1.0, "ZooKeeper cpu us": zk_full * 1e6, "ZooKeeper x the full run's": 1.0}]
    for kind, what in (("burst", f"a notification, {ledgers} changes in a burst"),
                       ("slow", f"a notification, {slow_rate:g} changes a second for {slow_seconds:g} s")):
        per = statistics.median(got[kind])
        row = {"what": what, "cpu us": per * 1e6, "x the full run's": per / max(full, 1e-12)}
        if got[f"zk {kind}"]:
            on_zk = statistics.median(got[f"zk {kind}"])
            row |= {"ZooKeeper cpu us": on_zk * 1e6, "ZooKeeper x the full run's": on_zk / max(zk_full, 1e-12)}
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ledgers", type=int, default=3000)
    p.add_argument("--slow-rate", type=float, default=4.0)
    p.add_argument("--slow-seconds", type=float, default=30.0)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    print(table(run(a.ledgers, a.slow_rate, a.slow_seconds, a.rounds)))
    print("\n(continuous mode under 5% of a full run at 1% of the ledgers changing an hour leaves a change at most "
          "5 times a full run's cost of a ledger)")


if __name__ == "__main__":
    main()
