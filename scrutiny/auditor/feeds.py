"""The agents' change feeds (WatchHoldings), followed on one asyncio loop with grpc.aio.

Why not a thread per agent with the threaded gRPC client: a reader blocked on a threaded stream wakes ten
times a second (grpc's `_common.wait` polls in 0.1 s slices so that signals are seen), so an idle leader
following a hundred agents woke a thousand times a second for nothing. Here a quiet stream costs nothing
in Python: a host gone without a word is told by HTTP/2 keepalive pings, which gRPC's core sends and
answers (the stream then fails and is followed again). A stream that says nothing, not even the agent's
heartbeat (every 5 minutes: an agent whose process hangs still answers pings), for FEED_SILENT_SECONDS is
taken for dead too and followed again. Heartbeats every few seconds cost an idle leader with 60 agents
about 14 s of CPU an hour (0.3 ms each).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

import grpc
from grpc import aio

from scrutiny.channels import aio_channel, aio_loop
from scrutiny.v1 import bookie_pb2, bookie_pb2_grpc

log = logging.getLogger(__name__)
RECONNECT_SECONDS = 2.0
STOP_SECONDS = 10
FEED_SILENT_SECONDS = 660.0  # two heartbeats missed (scrutiny.agent.HEARTBEAT_SECONDS), and a minute
KEEPALIVE_MS, KEEPALIVE_TIMEOUT_MS = 30_000, 10_000  # a ping every 30 s, answered within 10 s or the stream fails


class AgentFeeds:
    """Follows each agent it is given until stopped. `address(bookie)` is asked at every (re)connection;
    `cursor(bookie)` says where to resume; `on_message(bookie, feed_id, msg)` runs on the loop's thread;
    `on_down(bookie)` when a stream failed (its agent may have moved); `states` is kept up to date
    (`agent <bookie>` -> up | down | unavailable)."""

    def __init__(self, address: Callable[[str], str], cursor: Callable[[str], tuple[str, int]],
                 on_message: Callable[[str, str, Any], None], on_down: Callable[[str], None],
                 states: dict[str, str], credentials: grpc.ChannelCredentials | None = None,
                 max_message_bytes: int = 64 * 1024 * 1024) -> None:
        self.address, self.cursor, self.on_message, self.on_down = address, cursor, on_message, on_down
        self.states, self.credentials = states, credentials
        self.options = [("grpc.max_receive_message_length", max_message_bytes), ("grpc.enable_retries", 0),
                        ("grpc.keepalive_time_ms", KEEPALIVE_MS), ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
                        ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
                        ("grpc.http2.max_pings_without_data", 0),  # a quiet stream sends no data: ping anyway
                        ("grpc.http2.bdp_probe", 0)]  # no bandwidth probe (a ping) after each message
        self._loop = aio_loop()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stopping = False  # set before the tasks are cancelled: a follow still on its way starts nothing
        self._thread = threading.Thread(target=self._run, name="continuous-feeds", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._loop.run_forever()
        finally:  # stopped only once nothing is pending on it (`stop`)
            self._loop.close()

    def follow(self, bookie: str) -> None:
        with contextlib.suppress(RuntimeError):  # its loop closed: stopped, the leader stepped down meanwhile
            self._loop.call_soon_threadsafe(self._start, bookie)

    def _start(self, bookie: str) -> None:
        if not self._stopping and bookie not in self._tasks:
            self._tasks[bookie] = self._loop.create_task(self._follow(bookie))

    def stop(self) -> None:
        """Every stream cancelled, every channel closed, the loop ended with nothing pending on it: grpc.aio's
        own tasks (a call's request being sent, a cancellation being handled) are awaited too, or they would be
        destroyed pending with the loop."""
        async def cancel_all() -> None:
            for _ in range(10):  # what a cancellation ends may start a task of its own: until none is left
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                if not tasks:
                    break
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            await self._loop.shutdown_asyncgens()

        if self._stopping:  # stopped before
            self._thread.join(timeout=STOP_SECONDS)
            return
        self._stopping = True
        if not self._loop.is_closed():  # closed on its own: `run_forever` failed
            cancelled = asyncio.run_coroutine_threadsafe(cancel_all(), self._loop)
            # the loop stops once the cancellations are done, never before: a loop stopped with tasks pending
            # would destroy them (and leave their channels open) when it goes
            cancelled.add_done_callback(lambda _: self._loop.call_soon_threadsafe(self._loop.stop))
            try:
                cancelled.result(timeout=STOP_SECONDS)
            except concurrent.futures.TimeoutError:  # a loaded machine
                log.warning("the agents' feeds did not end within %d s: they end on their own, then their loop",
                            STOP_SECONDS)
        self._thread.join(timeout=STOP_SECONDS)

    async def _follow(self, bookie: str) -> None:
        feed = f"agent {bookie}"
        while not self._stopping:
            address = self.address(bookie)
            channel = aio_channel(address, self.credentials, self.options)
            try:
                if await self._read(bookie, channel):
                    self.states[feed] = "unavailable"  # a bridge to a stock bookie: full runs only
                    return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("following %s", feed)
                self.states[feed] = "down"
            finally:
                await channel.close(grace=None)
            await asyncio.sleep(RECONNECT_SECONDS)

    async def _read(self, bookie: str, channel: aio.Channel) -> bool:
        """One stream until it ends, fails or goes silent; True when the agent cannot watch at all."""
        feed = f"agent {bookie}"
        feed_id, after = self.cursor(bookie)
        call = bookie_pb2_grpc.BookieStub(channel).WatchHoldings(
            bookie_pb2.WatchHoldingsRequest(feed_id=feed_id, after_sequence=after))
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancellation that comes as the call
            # ends, and the feed then followed its agent for good, its loop never ending after `stop`
            async with asyncio.timeout(FEED_SILENT_SECONDS):
                await call.initial_metadata()  # the agent sends it at once
            self.states[feed] = "up"
            while True:
                async with asyncio.timeout(FEED_SILENT_SECONDS):
                    msg = await call.read()
                if msg is aio.EOF:  # the agent stopping ends its streams
                    break
                self.on_message(bookie, feed_id, msg)
                feed_id = msg.feed_id
        except TimeoutError:
            log.warning("continuous scrutiny: %s said nothing for %.0f s: following it again", feed,
                        FEED_SILENT_SECONDS)
        except aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return True
        finally:
            call.cancel()
        self.states[feed] = "down"
        self.on_down(bookie)
        return False
