"""Ledgers answered per second by one bookie agent (a separate process): the unary call, one round
trip per ledger as upstream's auditor asks, against the streaming call, side by side in one run.

    python -m bench.agentcalls [--ledgers 20000]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time

from bench.common import table
from scrutiny.bookieclient import BookieClient, EndpointResolver
from scrutiny.checks import Outcome
from scrutiny.codec import SequenceGroup
from scrutiny.entrysources.synthetic import SyntheticStoreWriter
from scrutiny.testing import processes
from scrutiny.testing.processes import stop

BOOKIE = "127.0.1.1:3181"


def run(ledgers: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        w = SyntheticStoreWriter()
        for lid in range(ledgers):
            w.add(BOOKIE, lid, [SequenceGroup(0, 0, 1, 0), SequenceGroup(2, 998, 2, 3)])
        store = w.write_all(tmp)[BOOKIE]
        agent = processes.spawn([sys.executable, "-m", "scrutiny.cli", "bookie-agent", "--bookie-id", BOOKIE,
                                  "--source", "synthetic", "--synthetic-file", str(store), "--bind", "127.0.0.1:0"],
                                 stdout=subprocess.PIPE, text=True)
        try:
            port = int(agent.stdout.readline().split("port ")[1].split()[0])  # type: ignore[union-attr]
            resolver = EndpointResolver({BOOKIE: f"127.0.0.1:{port}"})
            ids = list(range(ledgers))
            sequential = min(ledgers, 2000)  # slow: a sample is enough for its rate
            cases = [("unary, 1 in flight (upstream's pattern)", dict(streaming=False, unary_in_flight=1), sequential),
                     ("unary, 16 in flight", dict(streaming=False, unary_in_flight=16), ledgers),
                     ("streaming, 1000 ledgers per call", dict(streaming=True, ledgers_per_call=1000), ledgers)]
            base = 0.0
            for name, kw, n in cases:
                with BookieClient(resolver, **kw) as client:  # type: ignore[arg-type]
                    client.fetch(BOOKIE, ids[:50])  # warm the channel
                    t0 = time.perf_counter()
                    got = client.fetch(BOOKIE, ids[:n])
                    dt = time.perf_counter() - t0
                assert all(a.outcome is Outcome.ENTRIES for a in got.values()) and len(got) == n
                rate = n / dt
                base = base or rate
                rows.append({"call": name, "ledgers": n, "seconds": dt, "ledgers/s": rate, "x unary": rate / base})
        finally:
            stop(agent)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ledgers", type=int, default=20000)
    print(table(run(p.parse_args().ledgers)))


if __name__ == "__main__":
    main()
