"""Deep scrub: bytes per second verified by one bookie agent, against the disk-read floor measured in
the same run on the same entry logs.

One DbLedgerStorage bookie directory written in BookKeeper's formats (CRC32C, 1 KiB payloads): then
- floor: every entry log read sequentially in 1 MiB reads (no parsing);
- floor: every entry read at its index location (pread per entry, no digest);
- the source's verify() of every ledger (index walk, reads, ids, digest, payload hash), in-process;
- the agent over gRPC (a separate process), unlimited, and with its byte-rate limit set below the
  floor: the limit must hold.
Page cache: warm for all rows (just written and read once before timing); medians of --repeats.

    python -m bench.deepscrub [--ledgers 200 --entries 500]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from bench.common import table
from scrutiny import entrylog
from scrutiny.entrysources import DbLedgerStorageSource
from scrutiny.entrysources.entrylogs import OpenLogs
from scrutiny.testing import processes
from scrutiny.testing.dbledgerstorage import EntryLog, LiveBookie
from scrutiny.testing.processes import stop
from scrutiny.v1 import bookie_pb2, bookie_pb2_grpc

BOOKIE = "127.0.5.1:3181"
LOG_BYTES = 64 * 1024 * 1024  # roll over to a new entry log at about this size (BookKeeper: 1 GiB)


def build(path: Path, ledgers: int, entries: int, payload: int) -> int:
    """The bookie's directory; the bytes its entries take in the logs."""
    body = os.urandom(payload)
    total, log_id = 0, 1
    with LiveBookie(path) as bookie:
        log = EntryLog(path, log_id)
        for lid in range(ledgers):
            stored = {e: entrylog.package_entry(lid, e, e - 1, (e + 1) * payload, body, "CRC32C")
                      for e in range(entries)}
            bookie.write(lid, stored, log)
            total += sum(len(s) + 4 for s in stored.values())
            if log.file.tell() > LOG_BYTES:
                log.finish()
                log_id += 1
                log = EntryLog(path, log_id)
        log.finish()
        bookie.flush()
    return total


def sequential_read(path: Path) -> int:
    n = 0
    for log in sorted((path / "current").glob("*.log")):
        with open(log, "rb", buffering=0) as f:
            while chunk := f.read(1 << 20):
                n += len(chunk)
    return n


def per_entry_read(source: DbLedgerStorageSource, ledgers: int) -> int:
    n = 0
    with OpenLogs(source.ledger_dirs) as logs:
        for lid in range(ledgers):
            for d, _, location in source.locations_of(lid) or []:
                stored, _, _ = logs.read(d, location)
                n += len(stored)
    return n


def verify_all(source: DbLedgerStorageSource, ledgers: int) -> int:
    n = 0
    for lid in range(ledgers):
        got = source.verify(lid, "CRC32C", None)
        assert got is not None and not got.corrupt
        n += got.bytes_read
    return n


def agent_verify(port: int, ledgers: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}", [("grpc.max_receive_message_length", 64 << 20)]) as ch:
        stub = bookie_pb2_grpc.BookieStub(ch)
        asks = [bookie_pb2.LedgerToVerify(ledger_id=lid, digest_type=bookie_pb2.CRC32C) for lid in range(ledgers)]
        n = 0
        for i in range(0, ledgers, 20):
            req = bookie_pb2.VerifyEntriesOfLedgersRequest(ledgers=asks[i:i + 20])
            for msg in stub.VerifyEntriesOfLedgers(req, timeout=600):
                for v in msg.ledgers:
                    assert v.status == bookie_pb2.EOK and not v.corrupt
                    n += v.bytes_read
        return n


def start_agent(path: Path, rate: float) -> tuple[subprocess.Popen[str], int]:
    proc = processes.spawn([sys.executable, "-m", "scrutiny.cli", "bookie-agent", "--bookie-id", BOOKIE,
                             "--source", "dbledgerstorage", "--ledger-dir", str(path), "--bind", "127.0.0.1:0",
                             "--deep-bytes-per-second", str(rate)], stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline().split("port ")[1].split()[0])  # type: ignore[union-attr]


def timed(fn: Any, repeats: int) -> tuple[float, int]:
    times, n = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        n = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), n


def run(ledgers: int, entries: int, payload: int = 1024, repeats: int = 3) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bookie"
        total = build(path, ledgers, entries, payload)
        source = DbLedgerStorageSource([path], Path(tmp) / "scratch")
        source.refresh()
        sequential_read(path)  # warm the page cache for every row alike

        def row(what: str, seconds: float, n: int, baseline: float | None) -> None:
            rate = n / seconds
            rows.append({"what": what, "MB": round(n / 1e6, 1), "median s": seconds, "MB/s": rate / 1e6,
                         "share of the sequential floor": rate / baseline if baseline else 1.0})

        s, n = timed(lambda: sequential_read(path), repeats)
        floor = n / s
        row("floor: entry logs read sequentially (1 MiB reads)", s, n, None)
        s, n = timed(lambda: per_entry_read(source, ledgers), repeats)
        row("floor: every entry read at its location", s, n, floor)
        s, n = timed(lambda: verify_all(source, ledgers), repeats)
        row("verify(): ids, size, CRC32C, payload hash (in-process)", s, n, floor)
        source.close()
        for label, limit in (("agent over gRPC, no limit", 1e12), ("agent over gRPC, limit 8 MB/s", 8e6)):
            proc, port = start_agent(path, limit)
            try:
                s, n = timed(lambda port=port: agent_verify(port, ledgers), 1 if limit < 1e12 else repeats)
                row(label, s, n, floor)
                if limit < 1e12:
                    rows[-1]["limit MB/s"] = limit / 1e6
            finally:
                stop(proc)
        assert n >= total - 4 * ledgers * entries  # every stored byte was read (size fields aside)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ledgers", type=int, default=200)
    p.add_argument("--entries", type=int, default=500)
    p.add_argument("--payload", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    print(table(run(a.ledgers, a.entries, a.payload, a.repeats)))


if __name__ == "__main__":
    main()
