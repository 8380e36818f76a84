"""Helpers shared by tests that run scrutiny's processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

SLOW_AGENT = Path(__file__).resolve().parent / "slow_agent.py"


def wait_for(predicate: Callable[[], object], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


def auditor_process(config: Path) -> subprocess.Popen[str]:
    """`scrutiny auditor` as its own process; its first stdout line names its RPC port."""
    return subprocess.Popen([sys.executable, "-m", "scrutiny.cli", "auditor", "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def slow_agent(store: Path, delay: float) -> tuple[subprocess.Popen[str], int]:
    """An agent process on a synthetic store whose every answer takes `delay` seconds; and its port."""
    proc = subprocess.Popen([sys.executable, str(SLOW_AGENT), str(store), str(delay)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    return proc, int(proc.stdout.readline())  # type: ignore[union-attr]
