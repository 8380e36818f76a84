"""The one retry policy: exponential backoff with a ceiling, bounded by the caller (a deadline or a
number of attempts)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


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


ZOOKEEPER_REQUEST = Backoff(0.1, 2.0)  # a read retried across connection loss
RECONNECT = Backoff(1.0, 30.0)  # a daemon waiting for its store: never a crash loop
BOOKIE_CALL = Backoff(0.2, 0.8)  # a bookie call retried after a transient failure
