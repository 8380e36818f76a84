"""The bookie agent: serves scrutiny.v1.Bookie next to one bookie, from one entry source."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import NodeExistsError

from scrutiny.entrysources import EntrySource, SourceError
from scrutiny.v1 import bookie_pb2, bookie_pb2_grpc

log = logging.getLogger(__name__)

DEFAULT_AGENT_PORT = 3191
MAX_LEDGERS_PER_CALL = 100_000
ANSWERS_PER_MESSAGE = 100
SERVICE_NAME = "scrutiny.v1.Bookie"

Answer = bookie_pb2.GetListOfEntriesOfALedgerResponse


class BookieServicer(bookie_pb2_grpc.BookieServicer):
    def __init__(self, source: EntrySource, max_ledgers_per_call: int = MAX_LEDGERS_PER_CALL,
                 answers_per_message: int = ANSWERS_PER_MESSAGE,
                 credentials: grpc.ServerCredentials | None = None) -> None:
        self.source = source
        self.max_ledgers_per_call = max_ledgers_per_call
        self.answers_per_message = answers_per_message

    def answer(self, ledger_id: int) -> Any:
        try:
            data = self.source.availability(ledger_id)
        except SourceError as exc:
            return Answer(status=bookie_pb2.EIO, ledger_id=ledger_id, message=str(exc))
        except Exception as exc:  # a source bug must not kill the stream for every other ledger
            log.exception("source failed on ledger %d", ledger_id)
            return Answer(status=bookie_pb2.EIO, ledger_id=ledger_id, message=f"{type(exc).__name__}: {exc}")
        if data is None:
            return Answer(status=bookie_pb2.ENOLEDGER, ledger_id=ledger_id)
        return Answer(status=bookie_pb2.EOK, ledger_id=ledger_id, availability_of_entries_of_ledger=data)

    def GetListOfEntriesOfALedger(self, request: Any, context: grpc.ServicerContext) -> Any:
        if request.ledger_id < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ledger_id {request.ledger_id} is negative")
        return self.answer(request.ledger_id)

    def GetListOfEntriesOfLedgers(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        ids = list(dict.fromkeys(request.ledger_ids))  # one answer per ledger, asked once or twice
        if len(ids) > self.max_ledgers_per_call:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{len(ids)} ledger ids in one call; at most {self.max_ledgers_per_call}")
        negative = next((i for i in ids if i < 0), None)
        if negative is not None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ledger_id {negative} is negative")
        batch = []
        for lid in ids:
            if not context.is_active():
                return
            batch.append(self.answer(lid))
            if len(batch) >= self.answers_per_message:
                yield bookie_pb2.GetListOfEntriesOfLedgersResponse(ledgers=batch)
                batch = []
        if batch:
            yield bookie_pb2.GetListOfEntriesOfLedgersResponse(ledgers=batch)


class AgentRegistration:
    """An ephemeral znode `<scrutiny path>/agents/<bookie id>` naming the agent's address, kept
    across session loss."""

    def __init__(self, client: KazooClient, path: str, bookie_id: str, address: str) -> None:
        self.client, self.bookie_id, self.address = client, bookie_id, address
        self.node = f"{path.rstrip('/')}/agents/{bookie_id}"
        self._closed = False
        client.add_listener(self._on_state)

    def _payload(self) -> bytes:
        return json.dumps({"bookie_id": self.bookie_id, "address": self.address}).encode()

    def register(self) -> None:
        try:
            self.client.create(self.node, self._payload(), ephemeral=True, makepath=True)
        except NodeExistsError:
            # A previous session's node may linger until it expires: take it over.
            self.client.delete(self.node)
            self.client.create(self.node, self._payload(), ephemeral=True, makepath=True)

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's event thread: never block it.
        if state == KazooState.CONNECTED and not self._closed:
            self.client.handler.spawn(self._reregister)

    def _reregister(self) -> None:
        try:
            if not self.client.exists(self.node):
                self.register()
        except Exception as exc:
            log.warning("could not re-register %s: %s", self.node, exc)

    def close(self) -> None:
        self._closed = True
        self.client.remove_listener(self._on_state)
        try:
            if self.client.connected and self.client.exists(self.node):
                self.client.delete(self.node)
        except Exception as exc:
            log.warning("could not remove %s: %s", self.node, exc)


class BookieAgent:
    """A running agent: gRPC server, health service, optional ZooKeeper registration."""

    def __init__(self, source: EntrySource, bind: str = f"0.0.0.0:{DEFAULT_AGENT_PORT}", workers: int = 8,
                 max_concurrent_calls: int = 64, max_message_bytes: int = 64 * 1024 * 1024,
                 answers_per_message: int = ANSWERS_PER_MESSAGE,
                 credentials: grpc.ServerCredentials | None = None) -> None:
        self.source = source
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="agent"),
            maximum_concurrent_rpcs=max_concurrent_calls,
            options=[("grpc.max_send_message_length", max_message_bytes),
                     ("grpc.max_receive_message_length", 4 * 1024 * 1024)],
        )
        self.servicer = BookieServicer(source, answers_per_message=answers_per_message)
        bookie_pb2_grpc.add_BookieServicer_to_server(self.servicer, self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = (self.server.add_secure_port(bind, credentials) if credentials
                     else self.server.add_insecure_port(bind))
        if self.port == 0:
            raise OSError(f"cannot listen on {bind}")
        self.registration: AgentRegistration | None = None
        self._stopped = threading.Event()

    def start(self) -> BookieAgent:
        self.server.start()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return self

    def register(self, client: KazooClient, scrutiny_path: str, bookie_id: str, address: str) -> None:
        self.registration = AgentRegistration(client, scrutiny_path, bookie_id, address)
        self.registration.register()

    def stop(self, grace: float = 5.0) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.health.enter_graceful_shutdown()
        if self.registration is not None:
            self.registration.close()
        self.server.stop(grace).wait()
        self.source.close()

    def wait(self) -> None:
        self._stopped.wait()
