"""A running agent: the gRPC server with its health service, its registration in the metadata store, its /metrics,
the thread that looks at the bookie for changes, and its life until a signal."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from scrutiny.agent.limits import AgentStopping, Rate
from scrutiny.agent.servicer import ANSWERS_PER_MESSAGE, UNARY_CATCH_UP_SECONDS, BookieServicer
from scrutiny.agent.watching import WATCH_LINGER_SECONDS, Watching
from scrutiny.config import DEFAULT_AGENT_PORT
from scrutiny.daemon import Signals, serve
from scrutiny.entrysources import EntrySource
from scrutiny.httpserver import HttpServer
from scrutiny.store import MetadataStore, Registration
from scrutiny.v1 import bookie_pb2_grpc

log = logging.getLogger(__name__)
SERVICE_NAME = "scrutiny.v1.Bookie"
KEEPALIVE_PINGS_AT_MOST_EVERY_MS = 10_000  # the readers ping every 30 s (scrutiny.auditor.feeds)
WATCH_INTERVAL_SECONDS = 5.0  # the agent looks at its bookie for changes this often (0: never)
GIVE_UP_AFTER_GRACE = 3.0  # seconds past the stop's grace after which the process ends regardless


class BookieAgent:
    """A running agent: gRPC server, health service, optional ZooKeeper registration."""

    def __init__(self, source: EntrySource, bind: str = f"0.0.0.0:{DEFAULT_AGENT_PORT}", workers: int = 8,
                 max_concurrent_calls: int = 64, max_message_bytes: int = 64 * 1024 * 1024,
                 answers_per_message: int = ANSWERS_PER_MESSAGE,
                 credentials: grpc.ServerCredentials | None = None,
                 deep_bytes_per_second: float = 32 * 1024 * 1024, entries_per_second: float = 0,
                 unary_catch_up_seconds: float = UNARY_CATCH_UP_SECONDS,
                 watch_interval_seconds: float = WATCH_INTERVAL_SECONDS,
                 watch_linger_seconds: float = WATCH_LINGER_SECONDS) -> None:
        self.source = source
        self.watch_interval = watch_interval_seconds
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="agent"),
            maximum_concurrent_rpcs=max_concurrent_calls,
            options=[("grpc.max_send_message_length", max_message_bytes),
                     ("grpc.max_receive_message_length", 4 * 1024 * 1024),
                     # gRPC's default takes a ping more often than every 5 minutes for abuse
                     ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_PINGS_AT_MOST_EVERY_MS),
                     ("grpc.http2.max_ping_strikes", 0)],
        )
        self.servicer = BookieServicer(source, answers_per_message=answers_per_message,
                                       deep_rate=Rate(deep_bytes_per_second),
                                       accepts_passwords=credentials is not None,
                                       entry_rate=Rate(entries_per_second),
                                       unary_catch_up_seconds=unary_catch_up_seconds,
                                       watch_linger_seconds=watch_linger_seconds)
        bookie_pb2_grpc.add_BookieServicer_to_server(self.servicer, self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = (self.server.add_secure_port(bind, credentials) if credentials
                     else self.server.add_insecure_port(bind))
        if self.port == 0:
            raise OSError(f"cannot listen on {bind}")
        self.registration: Registration | None = None
        self.metrics_endpoint: HttpServer | None = None
        self._stopped = threading.Event()

    def start(self) -> BookieAgent:
        self.server.start()
        if self.watch_interval > 0 and self.servicer.watching is not None:
            threading.Thread(target=self._watch, args=(self.servicer.watching,), name="agent-watch",
                             daemon=True).start()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return self

    def _watch(self, watching: Watching) -> None:
        """Look at the bookie for changes every `watch_interval` seconds until the agent stops."""
        stopping = self.servicer.stopping
        while not stopping.wait(self.watch_interval):
            try:
                watching.look()
            except AgentStopping:
                return
            except Exception:  # the bookie's index mid-rewrite, say: the next look tries again
                log.exception("looking at the bookie for changes")

    def serve_metrics(self, listen: str) -> int:
        """Prometheus' /metrics on `listen`; the port bound."""
        self.metrics_endpoint = HttpServer(listen, self.servicer.metrics.registry)
        return self.metrics_endpoint.port

    def register(self, store: MetadataStore, bookie_id: str, address: str) -> None:
        """Tell scans where this agent listens: an ephemeral registration, kept until `stop`."""
        self.registration = store.register_agent(bookie_id, address)

    def stop(self, grace: float = 5.0) -> bool:
        """Stop serving within about `grace` seconds, whatever the calls are doing: a call waiting for
        its budget or between two messages ends at once (UNAVAILABLE), the others have the grace.
        Whether every call had ended, and so the source could be closed."""
        if self._stopped.is_set():
            return True
        self.servicer.stopping.set()
        if self.servicer.watching is not None:
            self.servicer.watching.feed.close()  # WatchHoldings streams end at once
        self.health.enter_graceful_shutdown()
        if self.registration is not None:
            self.registration.close()
        self.server.stop(grace).wait(grace + 1)
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.close()
        drained = self.servicer.calls.wait_idle(1.0)
        if drained:  # a call still inside the source (a long index read) must not see it closed
            self.source.close()
        else:
            log.warning("%d calls still running %.1f s after the stop began", self.servicer.calls.running, grace)
        self._stopped.set()
        return drained

    def serve_until_signalled(self, grace: float, after: Callable[[], None] | None = None,
                              signals: Signals | None = None) -> int:
        """The agent process's life: serve until SIGTERM or SIGINT, then stop within `grace` (and, past
        it, whatever holds the stop up: a store that does not answer the deregistration, a call deep in
        the source, a few seconds more at most); a second signal ends the process at once. `after`
        runs once the agent has stopped. `signals`: handlers installed before the agent said it listens (else
        here). The exit status."""
        serve(signals or Signals())
        watchdog = threading.Timer(grace + GIVE_UP_AFTER_GRACE, _exit_now, (1, f"the agent did not stop within "
                                                                          f"{grace + GIVE_UP_AFTER_GRACE:.0f} s"))
        watchdog.daemon = True
        watchdog.start()
        drained = self.stop(grace)
        if after is not None:
            after()
        if not drained:  # the interpreter would wait at exit for the gRPC threads still in those calls
            _exit_now(0, "calls still running at the end of the grace were cut off")
        watchdog.cancel()
        return 0


def _exit_now(status: int, why: str) -> None:
    (log.error if status else log.warning)("%s: exiting", why)
    logging.shutdown()
    sys.stdout.flush()
    os._exit(status)

