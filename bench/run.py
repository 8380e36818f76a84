"""Every benchmark of this directory, each with its baseline measured in the same run.

    python -m bench.run [--quick]      (make bench)
"""

from __future__ import annotations

import argparse
import platform
import time

from bench import agent_index, agentcalls, checks, codec, deepscrub, ensemble_changes, pipeline, shapes, zkreads
from bench.common import table


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="small sizes (the smoke test)")
    quick = p.parse_args().quick
    print(f"# scrutiny benchmarks, {time.strftime('%Y-%m-%d %H:%M')}, {platform.node()}, "
          f"{platform.python_version()}\n")
    print("## codec (python -m bench.codec)\n")
    print(table(codec.run([100_000] if quick else [1_000_000, 10_000_000], 1 if quick else 3)) + "\n")
    print("## coverage check cost by ledger size (python -m bench.checks)\n")
    print(table(checks.run([1_000, 100_000] if quick else [1_000, 100_000, 10_000_000],
                           10_000 if quick else 100_000)) + "\n")
    print("## an executor's CPU per ledger without I/O (python -m bench.pipeline)\n")
    print(table(pipeline.run(2_000 if quick else 20_000, 1 if quick else 7)) + "\n")
    print("## ledgers whose ensemble changed, answered as a real agent answers (python -m bench.ensemble_changes)\n")
    print(table(ensemble_changes.run(2_000 if quick else 50_000, 1 if quick else 5)) + "\n")
    print("## a range's checks as the cluster has more racks, so more shapes (python -m bench.shapes)\n")
    print(table(shapes.run([5] if quick else [5, 10, 20], 2_000 if quick else 10_000, 1 if quick else 5)) + "\n")
    print("## ZooKeeper metadata reads (python -m bench.zkreads)\n")
    print(table(zkreads.run(1000 if quick else 20_000)) + "\n")
    print("## bookie agent calls (python -m bench.agentcalls)\n")
    print(table(agentcalls.run(500 if quick else 20_000)) + "\n")
    print("## the agent against a bookie's index, and RocksDB's own iteration (python -m bench.agent_index)\n")
    print(table(list(agent_index.run([200_000] if quick else [10_000_000], 200 if quick else 2000,
                                     1 if quick else 5))) + "\n")
    print("## deep scrub: bytes verified per agent (python -m bench.deepscrub)\n")
    print(table(deepscrub.run(10 if quick else 200, 50 if quick else 500, repeats=1 if quick else 3)) + "\n")


if __name__ == "__main__":
    main()
