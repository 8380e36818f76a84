"""Helpers shared by tests that run scrutiny's processes."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from scrutiny.agent import BookieAgent
from scrutiny.entrysources import SyntheticStore
from scrutiny.entrysources.synthetic import SyntheticStoreWriter
from scrutiny.scan.context import Pass, RunContext
from scrutiny.scan.engines import LocalEngine, Progress
from scrutiny.scan.result import RangeResult
from scrutiny.store import LedgerRange, MetadataStore
from scrutiny.testing import processes

SLOW_AGENT = Path(__file__).resolve().parent / "slow_agent.py"


def wait_for(predicate: Callable[[], object], timeout: float = 30.0,
             saying: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out {saying()}")


def auditor_process(config: Path, log: Path | None = None) -> subprocess.Popen[str]:
    """`scrutiny auditor` as its own process; its first stdout line names its RPC port; its log goes
    to `log` when given."""
    with open(log or os.devnull, "w") as stderr:
        return processes.spawn([sys.executable, "-m", "scrutiny.cli", "auditor", "--config", str(config)],
                                stdout=subprocess.PIPE, stderr=stderr, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})


def slow_agent(store: Path, delay: float, stop_grace: float = 5.0) -> tuple[subprocess.Popen[str], int]:
    """An agent process on a synthetic store whose every answer takes `delay` seconds; and its port."""
    proc = processes.spawn([sys.executable, str(SLOW_AGENT), str(store), str(delay), str(stop_grace)],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    return proc, int(proc.stdout.readline())  # type: ignore[union-attr]


class HookEngine(LocalEngine):
    """The local engine, with something happening to the cluster after the first pass."""

    def __init__(self, after_first_pass: Callable[[], None]) -> None:
        self.hook: Callable[[], None] | None = after_first_pass

    def map_ranges(self, ctx: RunContext, ranges: list[LedgerRange], mode: Pass,
                   progress: Progress | None = None) -> Iterator[RangeResult]:
        yield from super().map_ranges(ctx, ranges, mode, progress)
        if self.hook is not None:
            hook, self.hook = self.hook, None
            hook()


@contextlib.contextmanager
def synthetic_agents(store: SyntheticStoreWriter, tmp_path: Path, registry: MetadataStore) -> Iterator[None]:
    """An agent on loopback for every bookie of `store`, registered in the metadata store."""
    agents = []
    try:
        for b, path in store.write_all(tmp_path).items():
            agents.append(BookieAgent(SyntheticStore(path), bind="127.0.0.1:0").start())
            agents[-1].register(registry, b, f"127.0.0.1:{agents[-1].port}")
        yield
    finally:
        for a in agents:
            a.stop(grace=0)
