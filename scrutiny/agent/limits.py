"""What bounds the agent's calls: its stop, the calls in flight, and the rates (bytes read, entries listed) they
share."""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import grpc


class AgentStopping(BaseException):
    """Ends a call that the agent's stop caught waiting for its budget or between two messages. A
    BaseException, as GeneratorExit is: the handlers keep `except Exception` so that one bad ledger
    never ends a stream, and a stop must not be taken for one bad ledger."""


class Calls:
    """The calls in flight, so that a stop knows when no call still uses the source."""

    def __init__(self) -> None:
        self._idle = threading.Condition()
        self.running = 0

    def __enter__(self) -> None:
        with self._idle:
            self.running += 1

    def __exit__(self, *exc: object) -> None:
        with self._idle:
            self.running -= 1
            self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self.running == 0, timeout)


class Counted(Protocol):
    calls: Calls


def stoppable(method: Callable[..., Any]) -> Callable[..., Any]:
    """A servicer method counted in flight, and ended as UNAVAILABLE (a scan treats the bookie as
    silent and looks again later) when the agent stops under it."""
    if inspect.isgeneratorfunction(method):
        @functools.wraps(method)
        def streaming(self: Counted, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            with self.calls:
                try:
                    yield from method(self, request, context)
                except AgentStopping:
                    context.abort(grpc.StatusCode.UNAVAILABLE, "the bookie agent is stopping")
        return streaming

    @functools.wraps(method)
    def unary(self: Counted, request: Any, context: grpc.ServicerContext) -> Any:
        with self.calls:
            try:
                return method(self, request, context)
            except AgentStopping:
                context.abort(grpc.StatusCode.UNAVAILABLE, "the bookie agent is stopping")
    return unary


class Rate:
    """A shared rate limit, in bytes read or entries listed (HDFS's block scanner and Ceph's scrub sleep
    do the same): a caller that got ahead of the rate sleeps until the rate has caught up with it.
    A rate of 0 is no limit."""

    def __init__(self, per_second: float, clock: Any = time.monotonic, sleep: Any = time.sleep) -> None:
        self.rate = per_second
        self.clock, self.sleep = clock, sleep
        self._lock = threading.Lock()
        self._free_at = clock()  # when what was taken so far will have been paid for

    def take(self, n: int) -> float:
        """Take `n` units; the seconds slept for them."""
        if self.rate <= 0:
            return 0.0
        with self._lock:
            now = self.clock()
            self._free_at = max(self._free_at, now - 0.1) + n / self.rate  # at most 0.1 s of credit
            wait = self._free_at - now
        if wait > 0:
            self.sleep(wait)
        return max(wait, 0.0)

