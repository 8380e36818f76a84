"""What one of continuous mode's looks costs the auditor: a batch of changed ledgers (a scoped run, as
`Continuous._look_at_ledgers` makes every `continuous_batch_seconds`), its CPU by thread and its ZooKeeper
requests, in one process; the agents in their own processes, on a synthetic cluster. The settings are
`bench.continuous`'s (the local engine, no placement, no orphan check, no blast radius); the facts are kept
between looks as the leader keeps them (`FactsCache`).

At a few changes a second about half of continuous mode's hour is its looks (one every 10 s, whatever the rate;
`bench.continuous_threads` has the rest, thread by thread), so a look's cost is the part of `bench.continuous`'s
hour that can be measured in a minute.

    python -m bench.continuous_batch [--ledgers 20000 --per-batch 28 --batches 100]
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

import psutil
from kazoo.client import KazooClient

from bench.common import start_agents, stop_agents, table
from bench.profile_scan import cpu_by_thread
from bench.scale import build
from scrutiny.config import ScanSettings
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import LocalEngine
from scrutiny.store import open_store
from scrutiny.store.facts import FactsCache
from scrutiny.testing.localzk import LocalZooKeeper, packets_received


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ledgers", type=int, default=20_000)
    p.add_argument("--per-batch", type=int, default=28, help="ledgers a look (1%%/h of 1M at a look every 10 s: 28)")
    p.add_argument("--batches", type=int, default=100)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp, LocalZooKeeper(heap="1g") as zk:
        client = KazooClient(hosts=zk.hosts)
        client.start()
        held = build(client, "/ledgers", args.ledgers, 30, Path(tmp))
        uri = f"zk+hierarchical://{zk.hosts}/ledgers"
        agents = start_agents(held, Path(tmp), uri)
        try:
            settings = ScanSettings(metadata_service_uri=uri, engine="local", placement_policy="none",
                                    recheck_delay=5, orphan_check=False, blast_radius=False)
            store = open_store(settings)
            facts = FactsCache(store)
            ids = sorted({i for v in held.values() for i in v})
            rnd = random.Random(1)

            def look() -> None:
                report = ScrutinyRun(settings, LocalEngine(), kind="continuous", store=store,
                                     facts=facts.facts).execute(ledger_ids=sorted(rnd.sample(ids, args.per_batch)))
                assert report.complete and not report.violations, report.errors[:3]

            def looks(count: int) -> None:
                for _ in range(count):
                    look()

            looks(20)  # the channels, the sessions, the shapes' memo

            requests, before = packets_received(zk.port), psutil.Process().cpu_times()
            threads = cpu_by_thread(lambda: looks(args.batches))
            requests, after = packets_received(zk.port) - requests, psutil.Process().cpu_times()
            store.close()
        finally:
            stop_agents(agents)
            client.stop()
    rows = [{"thread": name, "CPU ms a look": cpu / args.batches * 1e3} for name, cpu in threads.items()
            if cpu / args.batches >= 5e-5]
    rows.append({"thread": "every thread still there", "CPU ms a look": sum(threads.values()) / args.batches * 1e3})
    process = after.user + after.system - before.user - before.system
    rows.append({"thread": "the process (threads that ended too)", "CPU ms a look": process / args.batches * 1e3})
    print(f"{args.batches} looks of {args.per_batch} ledgers among {len(ids):,}: "
          f"{requests / args.batches:.2f} ZooKeeper requests a look (as the server counts them, pings too; "
          "the leader's cursors apart)")
    print(table(rows))


if __name__ == "__main__":
    main()
