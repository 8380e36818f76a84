"""Whether the agent watches its bookie for changes, who follows its change feed (WatchHoldings), and the
feed's streams.

The agent looks at its bookie's `ledgers` index from its start and while a reader follows its feed, and
WATCH_LINGER_SECONDS after the last one left: a leader's hand-over (a new election, an auditor restarted)
resumes the feed without a gap. Once nobody has followed for that long, it stops looking (its answers come
from the disk at each call, never from the watch) and the feed is renewed: a reader back later is told GAP.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from scrutiny.agent.metrics import AgentMetrics
from scrutiny.changefeed import Change, ChangeFeed, Event
from scrutiny.entrysources import SourceError, WatchesChanges
from scrutiny.v1 import bookie_pb2

# A WatchHoldings stream says it is alive at least this often. A host gone without a word is told by the
# reader's HTTP/2 keepalive pings (answered by gRPC's core, never waking Python); the heartbeat is for an
# agent whose process hangs, and each one costs the reader a wake-up: seldom.
HEARTBEAT_SECONDS = 300.0
WATCH_LINGER_SECONDS = 900.0
Msg = bookie_pb2.HoldingsChange


class Watching:
    """The feed of one agent's source. `spend(n)` pays for the index keys a look read (the CPU budget);
    `going(context)` says whether a stream goes on (its reader there, the agent not stopping)."""

    def __init__(self, source: WatchesChanges, metrics: AgentMetrics, spend: Callable[[int], None],
                 going: Callable[[grpc.ServicerContext], bool], linger_seconds: float = WATCH_LINGER_SECONDS) -> None:
        self.source, self.metrics, self.spend, self.going = source, metrics, spend, going
        self.feed = ChangeFeed()
        self.linger = linger_seconds
        self._watching = False
        self._followers = 0
        # monotonic: when the last reader left. An agent starts as if one just had: it watches from its start,
        # and a leader that follows it within the linger (after the agent's restart, say) gets every change
        self._left_at = time.monotonic()
        self._lock = threading.Lock()  # one look at a time; readers come and go between looks

    def look(self) -> list[Change]:
        """One look at the bookie (the agent's watch thread, every watch_interval_seconds): what changed since
        the last, appended to the feed; nothing while nobody follows (the answers never need the watch)."""
        with self._lock:
            if bool(self._followers) or time.monotonic() - self._left_at < self.linger:
                return self._look()
            if self._watching:
                self._watching = False
                self.metrics.watching.set(0)
                self.feed.renew()
                self.source.unwatched()
            return []

    def _look(self) -> list[Change]:
        passes = self.source.index_passes
        with self.metrics.watch.time():
            found, read = self.source.changes()  # the first look after a pause takes stock
        self.metrics.index_passes.inc(self.source.index_passes - passes)
        self._watching = True
        self.metrics.watching.set(1)
        self.spend(read)
        self.feed.append(found)
        for c in found:
            self.metrics.changes.labels(str(c.kind)).inc()
        return list(found)

    @contextlib.contextmanager
    def followed(self, context: grpc.ServicerContext) -> Iterator[None]:
        """A reader follows the feed; the agent watches the whole bookie before it reads (stock taken of the
        `ledgers` index at once if nobody followed)."""
        with self._lock:
            if not self._watching:
                try:
                    self._look()
                except SourceError as exc:
                    context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot take stock of what the bookie holds: {exc}")
            self._followers += 1
        try:
            yield
        finally:
            with self._lock:
                self._followers -= 1
                self._left_at = time.monotonic()

    def stream(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        """The feed from the reader's cursor: a GAP first when it missed changes, then every change as it is
        seen, a HEARTBEAT when nothing changed for HEARTBEAT_SECONDS."""
        context.send_initial_metadata(())  # the reader knows at once that it follows a live, watching agent
        feed, last, heartbeat = self.feed, request.after_sequence, time.monotonic()
        reader = request.feed_id
        while self.going(context):
            events, gap = feed.since(reader, last)
            if gap:
                yield Msg(kind=Msg.GAP, feed_id=feed.feed_id, sequence=feed.last,
                          detail="changes after the cursor are not all kept (the agent restarted, or "
                          "nobody followed it for a while)")
            for e in events:
                yield _change_message(feed.feed_id, e)
                last = e.sequence
            reader = feed.feed_id
            if gap and not events:
                last = feed.last
            if not feed.wait(last, 1.0) and time.monotonic() - heartbeat >= HEARTBEAT_SECONDS:
                yield Msg(kind=Msg.HEARTBEAT, feed_id=feed.feed_id, sequence=feed.last)
                heartbeat = time.monotonic()


def _change_message(feed_id: str, e: Event) -> Any:
    c = e.change
    return Msg(kind=str(c.kind), feed_id=feed_id, sequence=e.sequence, observed_at_ms=e.observed_ms,
               ledger_ids=c.ledger_ids, entry_log_id=c.entry_log, every_ledger=c.every_ledger, detail=c.detail)
