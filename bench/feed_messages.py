"""What one message of an agent's change feed (WatchHoldings) costs the auditor's leader that follows it, by
thread: gRPC's event engine, grpc.aio's poller, the feeds' loop. A message wakes them all, so at continuous
mode's rates (a few a second, each alone) this is most of what a feed costs.

`--agents` feeds served by another process (the agent's server options; each stream sends a change when told),
followed by `AgentFeeds` as the leader makes it; `--rate` messages a second for `--seconds`, spread over the
feeds, the follower's idle CPU over as long subtracted. The feeds' channel options as they are against the
same less gRPC's bandwidth probe (`grpc.http2.bdp_probe`, on by default), in alternation, `--rounds` each.

    python -m bench.feed_messages [--agents 30 --rate 10 --seconds 60 --rounds 3]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc

from bench.common import table, thread_cpu
from scrutiny.agent.server import KEEPALIVE_PINGS_AT_MOST_EVERY_MS
from scrutiny.auditor.feeds import AgentFeeds
from scrutiny.v1 import bookie_pb2, bookie_pb2_grpc

BDP = "grpc.http2.bdp_probe"


class Feed(bookie_pb2_grpc.BookieServicer):
    """A feed that sends a LEDGERS_GONE each time it is told to (`tell`)."""

    def __init__(self) -> None:
        self.told = 0
        self.changed = threading.Condition()

    def tell(self) -> None:
        with self.changed:
            self.told += 1
            self.changed.notify()

    def WatchHoldings(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        context.send_initial_metadata(())
        sent = 0
        while context.is_active():
            with self.changed:
                if self.told == sent:
                    self.changed.wait(timeout=1.0)
                told = self.told
            for sequence in range(sent + 1, told + 1):
                yield bookie_pb2.HoldingsChange(kind=bookie_pb2.HoldingsChange.LEDGERS_GONE, feed_id="bench",
                                                sequence=sequence, ledger_ids=[sequence])
            sent = told


def serve(agents: int) -> None:
    """The agents (`--serve`): their ports on stdout; then, for each line read, that many changes at that rate
    ("<count> <rate>"), spread over the feeds at random; "done" after each."""
    feeds, servers = [Feed() for _ in range(agents)], []
    ports = []
    for feed in feeds:
        server = grpc.server(futures.ThreadPoolExecutor(2), options=[
            ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_PINGS_AT_MOST_EVERY_MS),
            ("grpc.http2.max_ping_strikes", 0)])
        bookie_pb2_grpc.add_BookieServicer_to_server(feed, server)
        ports.append(server.add_insecure_port("127.0.0.1:0"))
        server.start()
        servers.append(server)
    print(" ".join(map(str, ports)), flush=True)
    rng = random.Random(7)
    for line in sys.stdin:
        count, rate = int(line.split()[0]), float(line.split()[1])
        t0 = time.monotonic()
        for n in range(count):
            rng.choice(feeds).tell()
            time.sleep(max(0.0, t0 + (n + 1) / rate - time.monotonic()))
        print("done", flush=True)


def threads_cpu() -> dict[str, float]:
    """CPU seconds by thread name (this process's), to the nanosecond."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            cpu = thread_cpu(int(tid))
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:  # ended meanwhile
            continue
        name = names.get(int(tid), comm)
        key = "_poll_wrapper" if "_poll_wrapper" in name else name
        out[key] = out.get(key, 0.0) + cpu
    return out


def follow(ports: list[str], agents: Any, count: int, rate: float, seconds: float, bdp: bool) -> dict[str, float]:
    """us of this process's CPU a message, by thread, its idle CPU over as long subtracted."""
    got = [0]
    feeds = AgentFeeds(lambda b: f"127.0.0.1:{ports[int(b)]}", lambda b: ("", 0),
                       lambda b, f, m: got.__setitem__(0, got[0] + 1), lambda b: None, {})
    if bdp:
        feeds.options = [o for o in feeds.options if o[0] != BDP]
    try:
        for i in range(len(ports)):
            feeds.follow(str(i))
        time.sleep(3)  # every stream up
        before = threads_cpu()
        time.sleep(seconds)
        idle = {k: v - before.get(k, 0.0) for k, v in threads_cpu().items()}
        before = threads_cpu()
        agents.stdin.write(f"{count} {rate}\n")
        agents.stdin.flush()
        agents.stdout.readline()
        time.sleep(1)  # the last messages read
        spent = {k: v - before.get(k, 0.0) for k, v in threads_cpu().items()}
    finally:
        feeds.stop()
    if got[0] < count:
        raise RuntimeError(f"{got[0]} of {count} messages read")
    scale = (seconds + 1) / seconds
    per = {k: (v - idle.get(k, 0.0) * scale) / count * 1e6 for k, v in spent.items()}
    per["the process"] = sum(per.values())
    return per


def run(agents: int, rate: float, seconds: float, rounds: int) -> list[dict[str, Any]]:
    """Each way's medians over the rounds, the ways in alternation."""
    served = subprocess.Popen([sys.executable, "-m", "bench.feed_messages", "--serve", str(agents)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert served.stdout is not None
        ports = served.stdout.readline().split()
        got: dict[str, list[dict[str, float]]] = {"as the leader follows (no probe)": [], "with gRPC's probe": []}
        for _ in range(rounds):
            for what in got:
                got[what].append(follow(ports, served, int(rate * seconds), rate, seconds, bdp=what.startswith("with")))
    finally:
        served.kill()
        served.wait()
    threads = ["the process", "event_engine", "continuous-feeds", "_poll_wrapper"]
    return [{"us a message": what} | {t: statistics.median(r.get(t, 0.0) for r in runs) for t in threads}
            | {"the process, each round": " ".join(f"{r['the process']:.0f}" for r in runs)}
            for what, runs in got.items()]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--agents", type=int, default=30)
    p.add_argument("--rate", type=float, default=10.0)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve:
        serve(a.serve)
        return
    rows = run(a.agents, a.rate, a.seconds, a.rounds)
    print(f"{a.agents} feeds, {a.rate:g} messages a second for {a.seconds:g} s, medians of {a.rounds} rounds\n")
    print(table(rows))


if __name__ == "__main__":
    main()
