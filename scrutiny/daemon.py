"""The life of a long-running process (the auditor, the agent): its signal handlers only set flags (Patroni's
daemon.py), and one loop acts on them, one at a time, so that a reload never races a stop."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

STOP, RELOAD = "stop", "reload"
WAKE_SECONDS = 0.2  # a signal the kernel delivers to another thread only flags it: the main thread looks this often


class Signals:
    """SIGTERM and SIGINT ask for a stop, SIGHUP (where the process reloads) for a reload; a second stop
    signal while the first is being handled ends the process at once (an operator who will not wait)."""

    def __init__(self, reloads: bool = False) -> None:
        self._lock = threading.Lock()
        self._asked: list[str] = []
        self._stopping = False
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        if reloads:
            signal.signal(signal.SIGHUP, self._on_reload)

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        if self._stopping:
            os._exit(128 + signum)
        self._stopping = True
        with self._lock:
            self._asked.append(STOP)

    def _on_reload(self, signum: int, frame: FrameType | None) -> None:
        with self._lock:
            self._asked.append(RELOAD)

    def next(self) -> str | None:
        """The oldest request not acted on yet, if any."""
        with self._lock:
            return self._asked.pop(0) if self._asked else None


def serve(signals: Signals, reload: Callable[[], None] = lambda: None,
          stopped: threading.Event | None = None) -> None:
    """Until a stop signal (or `stopped` is set from elsewhere): each reload signal acted on in turn, here on
    the main thread."""
    done = stopped or threading.Event()
    while not done.wait(WAKE_SECONDS):
        asked = signals.next()
        if asked == STOP:
            return
        if asked == RELOAD:
            reload()
