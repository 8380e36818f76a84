"""Child processes of the tests and benches, never waited for without a bound."""

from __future__ import annotations

import signal
import subprocess
import time
from typing import Any

REAP_SECONDS = 10.0  # SIGKILL cannot be ignored: past this the child is stuck in the kernel


def reap(proc: subprocess.Popen[Any]) -> None:
    """Kill the child and collect it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=REAP_SECONDS)


def stop(proc: subprocess.Popen[Any], grace: float = 10.0, sig: int = signal.SIGTERM) -> float | None:
    """Ask the child to stop (`sig`) and give it `grace` seconds; killed past that. The seconds it took
    to exit on its own, None if it had to be killed."""
    if proc.poll() is not None:
        return 0.0
    t0 = time.monotonic()
    proc.send_signal(sig)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        reap(proc)
        return None
    return time.monotonic() - t0
