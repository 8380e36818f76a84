"""Child processes of the tests, the benches and the demo: they die with their parent, however it ends (a
SIGKILL included), and are never waited for without a bound."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

REAP_SECONDS = 10.0  # SIGKILL cannot be ignored: past this the child is stuck in the kernel
# util-linux's setpriv sets PR_SET_PDEATHSIG, then execs the command: the kernel kills the child when its parent
# goes. The kernel ties that signal to the thread that forked, so every child is forked from one thread that
# lives as long as the process (a child started from a short-lived thread would die with that thread).
SETPRIV = shutil.which("setpriv")
_FORKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spawner")


def spawn(cmd: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
    """`subprocess.Popen(cmd, **popen)`, the child killed when this process ends."""
    prefix = [SETPRIV, "--pdeathsig", "KILL", "--"] if SETPRIV else []
    return _FORKER.submit(lambda: subprocess.Popen([*prefix, *cmd], **popen)).result()


def run(cmd: Sequence[str], timeout: float | None = None, **popen: Any) -> subprocess.CompletedProcess[Any]:
    """`subprocess.run`, the child spawned as `spawn` does; `check` as subprocess.run's."""
    check = popen.pop("check", False)
    feed = popen.pop("input", None)
    if feed is not None:
        popen["stdin"] = subprocess.PIPE
    if popen.pop("capture_output", False):
        popen["stdout"] = popen["stderr"] = subprocess.PIPE
    proc = spawn(cmd, **popen)
    try:
        out, err = proc.communicate(feed, timeout=timeout)
    except BaseException:
        reap(proc)
        raise
    if check and proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, list(cmd), out, err)
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)


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
