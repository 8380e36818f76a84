"""`scrutiny demo --real-bookkeeper`: the demo on BookKeeper itself, for an operator who wants to see scrutiny on
real bookies before installing it on a cluster. A local ZooKeeper, four real bookies on DbLedgerStorage (one on
the direct-I/O entry logger), ledgers written by BookKeeper's own client, three real faults made the way disks
make them, an agent beside each bookie, a deep run, and whether what it found equals what was done; then the
console until Ctrl-C. Needs a release `make peers` fetched (.peers/)."""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import tempfile
import time
from pathlib import Path

from scrutiny import entrylog
from scrutiny.agent import BookieAgent
from scrutiny.checks import expected_share
from scrutiny.codec import Availability
from scrutiny.config import ScanSettings
from scrutiny.entrysources import DbLedgerStorageSource
from scrutiny.errors import ConfigError
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import LocalEngine
from scrutiny.store import open_store
from scrutiny.testing.localzk import LocalZooKeeper
from scrutiny.testing.metadatahome import OnZooKeeper
from scrutiny.testing.realbookkeeper import PEERS, RealBookKeeper, Release

SHAPES = [(3, 2, 2), (3, 3, 2), (4, 2, 2), (4, 3, 2)]


def newest_release() -> str:
    """The newest BookKeeper release `make peers` fetched."""
    fetched = [p.parent.name.removeprefix("bookkeeper-") for p in PEERS.glob("bookkeeper-*/.fetched")]
    if not fetched:
        raise ConfigError(f"no BookKeeper release in {PEERS}: run `make peers` (or `make setup`) first")
    return max(fetched, key=lambda v: tuple(int(x) for x in v.split(".")))


def run_real_demo(args: argparse.Namespace, serve: bool) -> int:
    version = newest_release() if args.real_bookkeeper == "newest" else args.real_bookkeeper
    release = Release.of(version)
    work = Path(tempfile.mkdtemp(prefix="scrutiny-real-demo-"))
    zk = LocalZooKeeper(workdir=work / "zk")
    agents: list[BookieAgent] = []
    cluster: RealBookKeeper | None = None
    try:
        print(f"starting a local ZooKeeper and four bookies of BookKeeper {version} ...", flush=True)
        zk.start()
        cluster = RealBookKeeper(release, OnZooKeeper(zk.hosts), work / "bk")
        bookies = [cluster.add_bookie() for _ in range(3)] + [cluster.add_bookie(dbStorage_directIOEntryLogger="true")]
        client = cluster.client()
        ledgers = [client.create(e, wq, aq, digest, entries=40, size=512)[0]
                   for e, wq, aq in SHAPES for digest in ("CRC32C", "CRC32", "MAC")]
        print(f"wrote {len(ledgers)} ledgers with BookKeeper's client (every shape of quorum, three digests)",
              flush=True)
        time.sleep(2)  # the bookies' write caches flushed
        settings = ScanSettings(metadata_service_uri=cluster.uri, engine="local", placement_policy="none",
                                recheck_delay=3.0, write_cache_grace_seconds=2.0)
        with open_store(settings) as store:
            mds = {r.ledger_id: r.metadata for r in store.read_ledgers(ledgers)}
        expected: dict[tuple[str, int], str] = {}
        # 1. a bookie's whole share of a ledger gone (its index lost the ledger: the bookie says it has none)
        whole = ledgers[0]
        victim = next(b for b in bookies if b.bookie_id in mds[whole].bookies)  # type: ignore[union-attr]
        victim.lose_entries(whole)
        expected[("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", whole)] = f"{victim.bookie_id} lost its whole share"
        # 2. one entry gone in the middle of a bookie's share of another ledger
        middle = ledgers[4]
        victim2 = next(b for b in bookies if b.bookie_id in mds[middle].bookies)  # type: ignore[union-attr]
        share = Availability.of(expected_share(mds[middle], victim2.bookie_id)).entry_ids().tolist()  # type: ignore
        gone = share[len(share) // 2]
        victim2.lose_entries(middle, [gone])
        expected[("LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY", middle)] = f"{victim2.bookie_id} lost entry {gone}"
        # 3. a bit flipped on a bookie's disk, in an entry of a third ledger: only the deep scrub can tell
        flipped = ledgers[6]  # CRC32C (an HMAC ledger's digest is verified only where its password may travel)
        holder = next(b for b in bookies if b.bookie_id in mds[flipped].bookies)  # type: ignore[union-attr]
        source = DbLedgerStorageSource([holder.ledger_dir], work / "flip-scratch")
        _, entry, location = (source.locations_of(flipped) or [])[5]
        source.close()
        log_id, pos = entrylog.split_location(location)
        with entrylog.log_path(holder.ledger_dir, log_id).open("r+b") as f:
            f.seek(pos + 200)
            byte = f.read(1)
            f.seek(pos + 200)
            f.write(bytes([byte[0] ^ 0x10]))
        expected[("CORRUPT_ENTRY", flipped)] = f"a bit flipped in entry {entry} on {holder.bookie_id}'s disk"
        md = mds[flipped]
        assert md is not None
        short = "LESS_THAN_AQ" if md.write_quorum - 1 < md.ack_quorum else "LESS_THAN_WQ"
        expected[(f"{short}_REPLICAS_OF_AN_ENTRY", flipped)] = "the corrupt copy counts as none in a deep run"
        with open_store(settings) as store:
            for b in bookies:
                agent = BookieAgent(DbLedgerStorageSource([b.ledger_dir], work / f"scratch-{b.name}"),
                                    bind="127.0.0.1:0", workers=4).start()
                agent.register(store, b.bookie_id, f"127.0.0.1:{agent.port}")
                agents.append(agent)
            print("a deep run over the real bookies' own indexes and entry logs ...", flush=True)
            report = ScrutinyRun(dataclasses.replace(settings, deep=True), LocalEngine()).execute()
            print(report.render_text())
            found = {(str(v.category), v.ledger_id) for v in report.violations}
            print("fault made on the real bookies                          found?")
            for key, why in sorted(expected.items(), key=lambda kv: (kv[0][1], kv[0][0])):
                print(f"  ledger {key[1]:<6} {key[0]:<36} {'yes' if key in found else 'NO'}  ({why})")
            for key in sorted(found - expected.keys()):
                print(f"  ledger {key[1]:<6} {key[0]:<36} UNEXPECTED")
            same = found == set(expected) and report.complete
            print("\nthe findings equal the faults made" if same else "\nthe findings DIFFER from the faults made")
            if serve:
                from scrutiny.testing.democonsole import serve_console  # the auditor: only when served

                serve_console(settings, work, args.port, bookies[0].bookie_id)
        return 0 if same else 1
    finally:
        for agent in agents:
            agent.stop(grace=0)
        if cluster is not None:
            cluster.close()
        zk.close()
        shutil.rmtree(work, ignore_errors=True)
