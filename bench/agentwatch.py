"""What a DbLedgerStorage agent spends watching its bookie while the bookie changes, in one run: followed by
a leader (the `ledgers` index watched: ledgers gone, keys-only passes within 1% of a core), followed by
nobody (its entry logs and cookie only), and not watching at all (`watch_interval_seconds` 0, the
baseline).

The agent's own start counts as a reader that just left (it watches its first 15 minutes, so that a
leader following it after a restart misses nothing); this bench sets that linger to 0.

The bookie: `--ledgers` ledgers in real RocksDB indexes, changing `--changes-per-second` (half created, half
deleted by its garbage collector, their locations cleaned up), a checkpoint every 10 s as `flushInterval` (the
indexes' writes synced; their memtables stay, as a real bookie's checkpoint leaves them). The agent (its
source and server as `scrutiny bookie-agent` builds them) runs in its own process, started afresh for each
window and measured after its first look; a follower is a WatchHoldings stream held open by this process. The
agent's CPU an hour, the median of `--rounds` windows of `--seconds` per mode, the modes in alternation.

    python -m bench.agentwatch [--ledgers 300000 --changes-per-second 1 --seconds 60 --rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from bench.common import cpu_seconds, table
from scrutiny.testing import processes
from scrutiny.testing.dbledgerstorage import LiveBookie
from scrutiny.testing.processes import stop
from scrutiny.v1 import bookie_pb2, bookie_pb2_grpc

MODES = ("not watching", "followed by nobody", "followed")
SETTLE_SECONDS = 7.0  # past the agent's first look (5 s): its stock taken outside the window
CHECKPOINT_SECONDS = 10.0


class ChangingBookie:
    """The bookie's own writes: ledgers created and collected, a checkpoint every CHECKPOINT_SECONDS."""

    def __init__(self, path: Path, ledgers: int) -> None:
        self.live = LiveBookie(path)
        for lid in range(ledgers):
            self.live.add(lid, range(5))
        self.live.flush()
        self.oldest, self.next_id = 0, ledgers
        self.changes = 0

    @contextlib.contextmanager
    def changing(self, per_second: float) -> Iterator[None]:
        stopping = threading.Event()

        def churn() -> None:
            t0, checkpointed, n = time.monotonic(), time.monotonic(), 0
            while not stopping.wait(max(0.0, t0 + (n + 1) / per_second - time.monotonic())):
                n += 1
                if self.changes % 2:
                    self.live.delete(self.oldest)
                    self.live.cleanup(self.oldest)
                    self.oldest += 1
                else:
                    self.live.add(self.next_id, range(5))
                    self.next_id += 1
                self.changes += 1
                if time.monotonic() - checkpointed >= CHECKPOINT_SECONDS:
                    self.live.checkpoint()
                    checkpointed = time.monotonic()

        t = threading.Thread(target=churn, name="bookie-churn", daemon=True)
        t.start()
        try:
            yield
        finally:
            stopping.set()
            t.join()

    def close(self) -> None:
        self.live.close()


# The agent as `scrutiny bookie-agent --source dbledgerstorage` builds it (its default 32 MiB block cache), with
# no linger: an agent nobody follows would otherwise watch its first 15 minutes as if a leader had just left.
AGENT = """
import sys, time
from scrutiny.agent import BookieAgent
from scrutiny.entrysources import DbLedgerStorageSource
source = DbLedgerStorageSource([sys.argv[1]], sys.argv[2], 32 * 1024 * 1024)
agent = BookieAgent(source, bind="127.0.0.1:0", watch_interval_seconds=float(sys.argv[3]),
                    watch_linger_seconds=0).start()
print(agent.port, flush=True)
time.sleep(1e9)
"""


def start_agent(path: Path, scratch: Path, watching: bool) -> tuple[subprocess.Popen[str], int]:
    shutil.rmtree(scratch, ignore_errors=True)
    agent = processes.spawn([sys.executable, "-c", AGENT, str(path), str(scratch), "5" if watching else "0"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return agent, int(agent.stdout.readline())  # type: ignore[union-attr]


@contextlib.contextmanager
def follower(port: int) -> Iterator[None]:
    """A leader's WatchHoldings stream, open (the agent's stock taken) until the block ends."""
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    call = bookie_pb2_grpc.BookieStub(channel).WatchHoldings(bookie_pb2.WatchHoldingsRequest())
    call.initial_metadata()

    def drain() -> None:
        with contextlib.suppress(grpc.RpcError):  # cancelled at the end
            for _ in call:
                pass

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        yield
    finally:
        call.cancel()
        reader.join(5)
        channel.close()


def window(bookie: ChangingBookie, path: Path, scratch: Path, mode: str, seconds: float, per_second: float,
           settle: float) -> float:
    """The agent's CPU seconds an hour in this mode while the bookie changes."""
    agent, port = start_agent(path, scratch, watching=mode != "not watching")
    try:
        with contextlib.ExitStack() as stack:
            if mode == "followed":
                stack.enter_context(follower(port))
            stack.enter_context(bookie.changing(per_second))
            time.sleep(settle)
            c0, t0 = cpu_seconds(agent.pid), time.monotonic()
            time.sleep(seconds)
            return (cpu_seconds(agent.pid) - c0) * 3600 / (time.monotonic() - t0)
    finally:
        stop(agent)


def run(ledgers: int, per_second: float, seconds: float, rounds: int,
        settle: float = SETTLE_SECONDS) -> list[dict[str, Any]]:
    got: dict[str, list[float]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        path, scratch = Path(tmp) / "bookie", Path(tmp) / "scratch"
        bookie = ChangingBookie(path, ledgers)
        try:
            for _ in range(rounds):
                for mode in MODES:
                    got[mode].append(window(bookie, path, scratch, mode, seconds, per_second, settle))
        finally:
            bookie.close()
    base = statistics.median(got["not watching"])
    return [{"agent": mode, "cpu s/h": round(statistics.median(got[mode]), 1),
             "less not watching, s/h": round(statistics.median(got[mode]) - base, 1) + 0.0,  # never "-0"
             "rounds (s/h)": " ".join(f"{x:.1f}" for x in got[mode])} for mode in MODES]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ledgers", type=int, default=300_000)
    p.add_argument("--changes-per-second", type=float, default=1.0)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    print(table(run(a.ledgers, a.changes_per_second, a.seconds, a.rounds)))


if __name__ == "__main__":
    main()
