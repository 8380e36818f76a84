"""Streaming calls to many agents at once, read on one asyncio loop with grpc.aio (a small fetch's calls: a
continuous look asks some thirty bookies about a few ledgers each).

Why not the threaded client's calls: each call handed to a thread of its own costs a thread's wake-ups and the
GIL's hand-overs, twice the CPU of the calls themselves (`bench.continuous_batch`). Why not threaded calls
started together and read in turn on one thread: a call is finished only once read, so every call read after
a hung agent's ran out of its deadline with its answers there. Here every call is read as its answers come.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping

import grpc
from grpc import aio

from scrutiny.channels import Options, aio_channel, aio_loop

log = logging.getLogger(__name__)
STOP_SECONDS = 10
Read = Callable[[aio.Channel], Awaitable[None]]  # one call on this channel, its answers taken as they come


class StreamLoop:
    """A loop thread, started at the first calls, and a channel to each agent address (on the loop)."""

    def __init__(self, credentials: grpc.ChannelCredentials | None, options: Options) -> None:
        self.credentials, self.options = credentials, options
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._channels: dict[str, aio.Channel] = {}  # by address; only the loop's thread touches it

    def read_all(self, calls: Mapping[str, tuple[str, Read]], timeout: float) -> dict[str, Exception | None]:
        """Each call (by name: an address, how to read it) at once: None for one read to its end, the
        exception it ended with otherwise; a call not over within `timeout` seconds is left out (cancelled)."""
        async def one(address: str, read: Read) -> None:
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = aio_channel(address, self.credentials, self.options)
            await read(channel)

        async def every() -> list[BaseException | None]:
            return await asyncio.gather(*(one(address, read) for address, read in calls.values()),
                                        return_exceptions=True)

        names = list(calls)
        done = asyncio.run_coroutine_threadsafe(every(), self._running())
        try:
            ended = done.result(timeout=timeout)
        except concurrent.futures.TimeoutError:  # never with gRPC's own deadlines: the loop itself is stuck
            done.cancel()
            log.warning("calls to %d agents not over within %.0f s: asked again, one thread each", len(names), timeout)
            return {}
        out: dict[str, Exception | None] = {}
        for name, exc in zip(names, ended, strict=True):
            if exc is not None and not isinstance(exc, Exception):  # a cancellation, an exit: not the call's
                raise exc
            out[name] = exc
        return out

    def forget(self, address: str) -> None:
        """The channel to this address closed: the next call connects anew."""
        async def close() -> None:
            channel = self._channels.pop(address, None)
            if channel is not None:
                await channel.close(grace=None)

        with self._lock:
            loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                asyncio.run_coroutine_threadsafe(close(), loop)

    def close(self) -> None:
        """Every channel closed, then the loop ended."""
        async def close_all() -> None:
            for channel in self._channels.values():
                await channel.close(grace=None)
            self._channels.clear()

        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return
        closed = asyncio.run_coroutine_threadsafe(close_all(), loop)
        closed.add_done_callback(lambda _: loop.call_soon_threadsafe(loop.stop))
        with contextlib.suppress(concurrent.futures.TimeoutError):
            closed.result(timeout=STOP_SECONDS)
        thread.join(timeout=STOP_SECONDS)

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = aio_loop()
                self._thread = threading.Thread(target=self._run, args=(loop,), name="bookie-calls", daemon=True)
                self._loop = loop
                self._thread.start()
            return self._loop

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop) -> None:
        try:
            loop.run_forever()
        finally:
            loop.close()
