"""The one way scrutiny opens a gRPC channel (to an agent, to an auditor, to etcd), threaded or on asyncio:
over TLS when it has credentials (`scrutiny.tls.channel_credentials`), in clear otherwise."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import grpc
from grpc import aio

log = logging.getLogger(__name__)
Options = Sequence[tuple[str, Any]]

# An agent back after an outage is called again at once. gRPC's own reconnect backoff (1 s, growing 1.6 times to
# 120 s while the address refuses) fails every call fast for as long after the agent is back: a run's re-check 10 s
# later still found it "unavailable" (a false alarm). Our own retries (`retry.BOOKIE_CALL`) pace the calls.
TO_AGENT: Options = (("grpc.initial_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 1000))


def channel(address: str, credentials: grpc.ChannelCredentials | None = None, options: Options = ()) -> grpc.Channel:
    if credentials is not None:
        return grpc.secure_channel(address, credentials, list(options))
    return grpc.insecure_channel(address, list(options))


def aio_channel(address: str, credentials: grpc.ChannelCredentials | None = None,
                options: Options = ()) -> aio.Channel:
    if credentials is not None:
        return aio.secure_channel(address, credentials, list(options))
    return aio.insecure_channel(address, list(options))


def aio_loop() -> asyncio.AbstractEventLoop:
    """A new event loop for grpc.aio's calls, on a thread of their own. grpc.aio's one completion queue wakes every
    loop of the process (grpc/grpc#25364): all but one find nothing to read (BlockingIOError), and one may hand an
    event to a loop closed since (RuntimeError): harmless both, yet printed as tracebacks by asyncio's default
    handler. Those two only are logged at debug."""
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(_grpc_poller_woken_in_vain)
    return loop


def _grpc_poller_woken_in_vain(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    exc = context.get("exception")
    if "PollerCompletionQueue._handle_events" in repr(context.get("handle")) and (
            isinstance(exc, BlockingIOError) or (isinstance(exc, RuntimeError) and "loop is closed" in str(exc))):
        log.debug("grpc.aio's completion queue: %r", exc)
        return
    loop.default_exception_handler(context)
