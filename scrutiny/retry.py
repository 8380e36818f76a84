"""The one retry policy: exponential backoff with a ceiling, and the retry loop as a value (kazoo's
KazooRetry): `Retry(backoff, tries=..., deadline=...).call(fn, retry_if)`, bounded by tries, time, or both."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    initial: float = 0.1
    maximum: float = 2.0
    factor: float = 2.0

    def delays(self) -> Iterator[float]:
        """initial, initial * factor, ... up to maximum, forever."""
        delay = self.initial
        while True:
            yield delay
            delay = min(delay * self.factor, self.maximum)


@dataclass(frozen=True)
class Retry:
    backoff: Backoff
    tries: int | None = None  # attempts in all (None: no bound)
    deadline: float | None = None  # seconds from the first attempt (None: no bound): no wait ends past it
    sleep: Callable[[float], object] = time.sleep  # e.g. a stop event's wait, which a stop cuts short

    def call(self, fn: Callable[[], T], retry_if: Callable[[Exception], bool],
             on_retry: Callable[[Exception, float], object] = lambda exc, delay: None) -> T:
        """`fn()` until it returns. An exception `retry_if` accepts is retried after the backoff's next delay
        (`on_retry` told first) while the tries and the deadline allow, and raised when they do not; any
        other is raised at once."""
        delays = self.backoff.delays()
        end = time.monotonic() + self.deadline if self.deadline is not None else math.inf
        for attempt in itertools.count(1):
            try:
                return fn()
            except Exception as exc:
                if not retry_if(exc):
                    raise
                delay = next(delays)
                if (self.tries is not None and attempt >= self.tries) or time.monotonic() + delay >= end:
                    raise
                on_retry(exc, delay)
                self.sleep(delay)
        raise AssertionError("unreachable")


ZOOKEEPER_REQUEST = Backoff(0.1, 2.0)  # a read retried across connection loss
RECONNECT = Backoff(1.0, 30.0)  # a daemon waiting for its store: never a crash loop
BOOKIE_CALL = Backoff(0.2, 0.8)  # a bookie call retried after a transient failure
