"""When the leader lists the agents again: every AGENTS_EVERY_SECONDS, sooner when something moved (a
registration, an agent's feed, the sightings a run recorded), but never more often than
AGENTS_AT_MOST_EVERY_SECONDS: an agent down for long is not a storm of listings."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

AGENTS_EVERY_SECONDS = 60.0
AGENTS_AT_MOST_EVERY_SECONDS = 5.0


class AgentListing:
    def __init__(self, list_agents: Callable[[], None]) -> None:
        self.list_agents = list_agents
        self._moved = threading.Event()

    def moved(self) -> None:
        """List them again soon."""
        self._moved.set()

    def follow(self, stop: threading.Event) -> None:
        """List the agents at once, then at this cadence until `stop` (the leader's thread; `moved` wakes it)."""
        self._moved.clear()
        listed = -math.inf
        while not stop.is_set():
            since = time.monotonic() - listed
            if since >= AGENTS_EVERY_SECONDS or (self._moved.is_set() and since >= AGENTS_AT_MOST_EVERY_SECONDS):
                self._moved.clear()
                listed = time.monotonic()
                self.list_agents()
            stop.wait(AGENTS_AT_MOST_EVERY_SECONDS)
            self._moved.wait(max(0.0, AGENTS_EVERY_SECONDS - (time.monotonic() - listed)))
