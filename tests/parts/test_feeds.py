"""The leader's side of the agents' change feeds (`scrutiny.auditor.feeds`), against real gRPC servers on
loopback: changes arrive in order with the reader's cursor, a stream that goes silent (a host gone without
a word) is taken for dead and followed again, a frozen agent is told by keepalive pings, an agent that cannot
watch is said to be unavailable."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from scrutiny.auditor import feeds
from scrutiny.auditor.feeds import AgentFeeds
from scrutiny.channels import aio_loop
from scrutiny.testing.processes import stop
from scrutiny.v1 import bookie_pb2, bookie_pb2_grpc
from tests.support.helpers import wait_for

Msg = bookie_pb2.HoldingsChange


class Agent(bookie_pb2_grpc.BookieServicer):
    """Answers each WatchHoldings with `script` (one list of messages per call), then says nothing until
    the call ends: a host gone without a word, as far as its reader can tell."""

    def __init__(self, script: list[list[Any]]) -> None:
        self.script, self.requests = script, []  # type: ignore[var-annotated]
        self.released = threading.Event()

    def WatchHoldings(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self.requests.append((request.feed_id, request.after_sequence))
        yield from self.script[min(len(self.requests), len(self.script)) - 1]
        while context.is_active() and not self.released.wait(0.05):
            pass


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[grpc.Server] = []

    def start(servicer: bookie_pb2_grpc.BookieServicer) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        bookie_pb2_grpc.add_BookieServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for s in servers:
        s.stop(0)


def test_changes_in_order_then_a_silent_stream_is_followed_again(serve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(feeds, "FEED_SILENT_SECONDS", 0.5)
    monkeypatch.setattr(feeds, "RECONNECT_SECONDS", 0.1)
    agent = Agent([[Msg(kind=Msg.GAP, feed_id="f1", sequence=0),
                    Msg(kind=Msg.LEDGERS_GONE, feed_id="f1", sequence=1, ledger_ids=[7, 8])],
                   [Msg(kind=Msg.LEDGERS_GONE, feed_id="f1", sequence=2, ledger_ids=[9])]])
    address = serve(agent)
    got: list[tuple[str, str, int, list[int]]] = []
    cursor: dict[str, tuple[str, int]] = {}
    downs: list[str] = []
    states: dict[str, str] = {}

    def on_message(bookie: str, feed_id: str, msg: Any) -> None:
        got.append((bookie, feed_id, msg.sequence, list(msg.ledger_ids)))
        cursor[bookie] = (msg.feed_id, msg.sequence)

    f = AgentFeeds(lambda b: address, lambda b: cursor.get(b, ("", 0)), on_message, downs.append, states)
    try:
        f.follow("b1:3181")
        f.follow("b1:3181")  # followed once
        wait_for(lambda: len(got) == 2, 10)
        assert got == [("b1:3181", "", 0, []), ("b1:3181", "f1", 1, [7, 8])] and states["agent b1:3181"] == "up"
        # then nothing, not even a heartbeat: dead; followed again from the cursor
        wait_for(lambda: len(got) == 3, 10)
        assert downs == ["b1:3181"] and agent.requests == [("", 0), ("f1", 1)]
        assert got[2] == ("b1:3181", "f1", 2, [9])
    finally:
        f.stop()
        agent.released.set()


def test_an_agent_that_cannot_watch_is_unavailable_and_a_stopped_one_down(serve: Any,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(feeds, "RECONNECT_SECONDS", 0.1)

    class Bridge(bookie_pb2_grpc.BookieServicer):
        def WatchHoldings(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "a bridge cannot watch")
            yield from ()

    bridge = serve(Bridge())
    states: dict[str, str] = {}
    downs: list[str] = []
    f = AgentFeeds(lambda b: bridge if b == "bridge" else "127.0.0.1:1", lambda b: ("", 0), lambda *_: None,
                   downs.append, states)
    try:
        f.follow("bridge")
        f.follow("nobody")
        wait_for(lambda: states.get("agent bridge") == "unavailable" and states.get("agent nobody") == "down", 10)
        time.sleep(0.3)
        assert "bridge" not in downs and downs.count("nobody") >= 2  # tried again, and again
    finally:
        f.stop()


AGENT = """
import signal, sys
import scrutiny.agent as agent
from scrutiny.testing.holdings import MutableHoldings
agent.KEEPALIVE_PINGS_AT_MOST_EVERY_MS = 200
a = agent.BookieAgent(MutableHoldings(), bind="127.0.0.1:0", workers=2).start()
print(a.port, flush=True)
signal.sigwait({signal.SIGTERM})
"""


def test_a_frozen_agent_is_told_by_keepalive_pings_without_a_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real agent, frozen (SIGSTOP: its host gone without a word, its sockets open): the reader's
    HTTP/2 pings go unanswered, the stream fails long before FEED_SILENT_SECONDS, and it is followed again
    once the agent thaws. Nothing in Python pings: gRPC's core does."""
    monkeypatch.setattr(feeds, "KEEPALIVE_MS", 500)
    monkeypatch.setattr(feeds, "KEEPALIVE_TIMEOUT_MS", 500)
    monkeypatch.setattr(feeds, "RECONNECT_SECONDS", 0.1)
    assert feeds.FEED_SILENT_SECONDS >= 60
    proc = subprocess.Popen([sys.executable, "-c", AGENT], stdout=subprocess.PIPE, text=True)
    states: dict[str, str] = {}
    downs: list[str] = []
    f = AgentFeeds(lambda b: b, lambda b: ("", 0), lambda *_: None, downs.append, states)
    try:
        address = f"127.0.0.1:{proc.stdout.readline().strip()}"  # type: ignore[union-attr]
        feed = f"agent {address}"
        f.follow(address)
        wait_for(lambda: states.get(feed) == "up", 20)  # nothing changed: no message, but the stream is open
        time.sleep(2)  # pings answered: still up
        assert not downs
        proc.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        wait_for(lambda: downs and states[feed] == "down", 20)
        assert time.monotonic() - frozen < 10
        proc.send_signal(signal.SIGCONT)
        wait_for(lambda: states.get(feed) == "up", 30)
    finally:
        f.stop()
        proc.send_signal(signal.SIGCONT)
        stop(proc)


def test_a_follow_racing_the_stop_leaves_nothing_pending(caplog: pytest.LogCaptureFixture) -> None:
    """The leader lists the agents while it steps down (a listing a run's end asked for): a follow that reaches
    the loop after its tasks were cancelled starts nothing, so nothing is destroyed pending with the loop."""
    import gc
    import warnings

    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        for _ in range(20):
            f = AgentFeeds(lambda _: "127.0.0.1:1", lambda _: ("", 0), lambda *_: None, lambda _: None, {})
            stopped = threading.Event()

            def listing(f: AgentFeeds = f, stopped: threading.Event = stopped) -> None:
                n = 0
                while not stopped.is_set():
                    f.follow(f"127.0.0.{n % 250 + 1}:3181")
                    n += 1

            t = threading.Thread(target=listing)
            t.start()
            f.stop()
            stopped.set()
            t.join()
            del f
            gc.collect()
    assert not [w for w in warned if "never awaited" in str(w.message)]
    assert not [r for r in caplog.records if "destroyed but it is pending" in r.getMessage()]


def test_a_stop_that_runs_out_of_time_leaves_nothing_pending(monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """On a loaded machine the streams' cancellation can outlast the stop's wait: the loop then goes on until they
    are done, and only then ends. Stopped at once, it left them pending, destroyed whenever the loop was collected
    (a loaded CI run of `make test`)."""
    import asyncio
    import gc

    def pending() -> set[int]:  # the feeds' tasks not done, alive or awaiting collection
        return {id(o) for o in gc.get_objects() if isinstance(o, asyncio.Task) and not o.done()
                and getattr(o.get_coro(), "__qualname__", "").startswith("AgentFeeds.")}

    before, loops_before = pending(), set(threading.enumerate())
    monkeypatch.setattr(feeds, "STOP_SECONDS", 0)  # every stop outlasted: it waits for nothing
    for _ in range(5):
        f = AgentFeeds(lambda _: "127.0.0.1:1", lambda _: ("", 0), lambda *_: None, lambda _: None, {})
        for n in range(50):
            f.follow(f"127.0.0.{n + 1}:3181")
        time.sleep(0.2)  # the streams under way
        f.stop()
        del f
    for t in set(threading.enumerate()) - loops_before:  # this test's feeds' loops
        if t.name == "continuous-feeds":
            t.join(timeout=30)
            assert not t.is_alive(), "a feeds' loop never ended"
    assert any("did not end within" in r.getMessage() for r in caplog.records)
    assert not pending() - before
    gc.collect()
    assert not [r for r in caplog.records if "destroyed but it is pending" in r.getMessage()]


class PollerHandle:
    """What asyncio names as the callback that raised: grpc.aio's completion queue, as it prints it."""

    def __repr__(self) -> str:
        return "<Handle PollerCompletionQueue._handle_events(<_UnixSelectorEventLoop running=True>)()>"


def test_a_loop_woken_in_vain_by_grpcs_completion_queue_prints_nothing_and_a_real_error_is_still_printed(
        caplog: pytest.LogCaptureFixture) -> None:
    """grpc.aio's one completion queue wakes the feeds' loop and the looks' loop alike (grpc/grpc#25364): the one
    that finds nothing to read, or hands an event to a loop closed since, is no error; anything else still is."""
    loop = aio_loop()
    try:
        with caplog.at_level(logging.DEBUG):
            for exc in (BlockingIOError(11, "Resource temporarily unavailable"), RuntimeError("Event loop is closed"),
                        ValueError("a real error")):
                loop.call_exception_handler({"message": "Exception in callback", "exception": exc,
                                             "handle": PollerHandle()})
            loop.call_exception_handler({"message": "Exception in callback", "exception": BlockingIOError(11, "x"),
                                         "handle": "<Handle something_else()>"})
    finally:
        loop.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [type(r.exc_info[1]).__name__ for r in errors if r.exc_info] == ["ValueError", "BlockingIOError"]
