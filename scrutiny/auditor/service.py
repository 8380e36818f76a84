"""The Auditor RPC: translates requests into calls on the auditor and results (or errors, through
their kind's gRPC code) into replies. Nothing here reads the store or runs anything."""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

import grpc
from google.protobuf import any_pb2
from google.rpc import status_pb2
from grpc_status import rpc_status

from scrutiny.auditor.lastrun import RunSummary
from scrutiny.auditor.runkinds import KINDS
from scrutiny.auditor.runqueue import Ticket
from scrutiny.errors import NotFound, NotLeader, RequestError, ScrutinyError, Unauthenticated, one_line
from scrutiny.times import iso_seconds
from scrutiny.tls import verified_peer
from scrutiny.v1 import auditor_pb2, auditor_pb2_grpc


@dataclass(frozen=True)
class Status:
    leading: bool
    leader_address: str
    current: Ticket | None = None
    last: tuple[Ticket, ...] = ()
    next_runs: Mapping[str, str] = field(default_factory=dict)
    skipped: Mapping[str, int] = field(default_factory=dict)
    queued_runs: int = 0
    runs_awaiting_recheck: int = 0
    inherited: tuple[RunSummary, ...] = ()  # newer than this auditor's own runs of their kinds

    def own_last(self) -> tuple[Ticket, ...]:
        """This auditor's last runs of the kinds it has inherited no newer run of."""
        replaced = {i.kind for i in self.inherited}
        return tuple(t for t in self.last if t.kind not in replaced)


class AuditorApi(Protocol):
    def rescan(self, ledger_ids: list[int] | None, bookie_id: str) -> tuple[Ticket, bool]: ...

    def whatif(self, bookie_ids: list[str], racks: list[str]) -> tuple[Ticket, bool]: ...

    def status(self) -> Status: ...

    def last_report(self, kind: str) -> dict[str, Any] | None: ...


class Authenticator:
    """A verified client certificate (mutual TLS) or the bearer token; open only when configured so."""

    def __init__(self, token: str, client_ca: bool, insecure_open: bool) -> None:
        self.token, self.client_ca, self.insecure_open = token, client_ca, insecure_open

    def check(self, context: grpc.ServicerContext) -> None:
        given = dict(context.invocation_metadata()).get("authorization", "")
        if isinstance(given, bytes):
            given = given.decode("utf-8", "replace")
        if not self.allows(given, bool(self.client_ca) and verified_peer(context)):
            raise Unauthenticated("a valid bearer token is required")

    def allows(self, authorization: str, verified_client: bool = False) -> bool:
        """The one rule, for the RPC and the HTTP API: `authorization` is the header's value."""
        if not self.token and not self.client_ca:
            return self.insecure_open
        if verified_client:
            return True
        return bool(self.token) and hmac.compare_digest(authorization.encode(), f"Bearer {self.token}".encode())


def run_fields(ticket: Ticket) -> dict[str, Any]:
    """One run of this auditor's as GetStatus tells it (RunInfo's fields), and the HTTP API too."""
    fields: dict[str, Any] = {"run_id": ticket.run_id, "kind": ticket.kind, "ranges_done": ticket.ranges_done,
                              "ranges_total": ticket.ranges_total,
                              "complete": bool(ticket.report and ticket.report.complete)}
    if ticket.report is not None:
        fields |= {"started_at": ticket.report.started_at, "finished_at": ticket.report.finished_at,
                   "counts": dict(ticket.report.counts)}
    elif ticket.started_ms:
        fields["started_at"] = iso_seconds(ticket.started_ms / 1000)
    return fields


def inherited_fields(summary: RunSummary) -> dict[str, Any]:
    """The last complete run of a kind, as an earlier leader left it."""
    return {"run_id": summary.run_id, "kind": summary.kind, "started_at": summary.started_at,
            "finished_at": summary.finished_at, "complete": True, "counts": dict(summary.counts),
            "ran_by": summary.ran_by}


def status_json(s: Status) -> dict[str, Any]:
    """GetStatus's answer as the HTTP API tells it (the same fields; the role in words)."""
    # a standby that has not learned who leads yet (just started: the store not reached, the election under way)
    role = "leader" if s.leading else "standby" if s.leader_address else "electing"
    return {"role": role, "leader_address": s.leader_address,
            "current_run": run_fields(s.current) if s.current else None,
            "last_runs": [run_fields(t) for t in s.own_last()] + [inherited_fields(i) for i in s.inherited],
            "next_runs": dict(s.next_runs), "skipped_runs": dict(s.skipped), "queued_runs": s.queued_runs,
            "runs_awaiting_recheck": s.runs_awaiting_recheck}


def _abort(context: grpc.ServicerContext, exc: ScrutinyError) -> NoReturn:
    if isinstance(exc, NotLeader):
        # The redirect twice: the `leader-address` trailer (scrutiny rescan reads it) and, for clients that
        # follow the proto, a RescanResponse with leader_address in the standard rich error details.
        detail = any_pb2.Any()
        detail.Pack(auditor_pb2.RescanResponse(leader_address=exc.leader))
        status = rpc_status.to_status(status_pb2.Status(code=exc.grpc_code.value[0], message=one_line(exc),
                                                        details=[detail]))
        context.set_trailing_metadata((("leader-address", exc.leader), *status.trailing_metadata))
    context.abort(exc.grpc_code, one_line(exc))
    raise AssertionError("abort returns only by raising")


class AuditorServicer(auditor_pb2_grpc.AuditorServicer):
    def __init__(self, api: AuditorApi, auth: Authenticator, max_wait_seconds: float,
                 status_requires_auth: bool) -> None:
        self.api, self.auth = api, auth
        self.max_wait_seconds, self.status_requires_auth = max_wait_seconds, status_requires_auth

    def Rescan(self, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            self.auth.check(context)
            ledger_ids, bookie_id = _scope(request)
            ticket, queued = self.api.rescan(ledger_ids, bookie_id)
        except ScrutinyError as exc:
            _abort(context, exc)
        return self._reply(ticket, queued, request, context)

    def WhatIf(self, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            self.auth.check(context)
            bookies = [b.strip() for b in request.bookie_ids]
            racks = [r.strip() for r in request.racks]
            if not any(bookies) and not any(racks):
                raise RequestError("say which bookie_ids or racks would be down")
            if request.wait_timeout_seconds < 0:
                raise RequestError("wait_timeout_seconds is negative")
            ticket, queued = self.api.whatif([b for b in bookies if b], [r for r in racks if r])
        except ScrutinyError as exc:
            _abort(context, exc)
        return self._reply(ticket, queued, request, context)

    def _reply(self, ticket: Ticket, queued: bool, request: Any, context: grpc.ServicerContext) -> Any:
        resp = auditor_pb2.RescanResponse(run_id=ticket.run_id, queued=queued)
        if request.wait:
            timeout = min(request.wait_timeout_seconds or self.max_wait_seconds, self.max_wait_seconds)
            if not ticket.done.wait(timeout):
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                              f"run {ticket.run_id} is still going; its report will be served by GetLastReport")
            assert ticket.report is not None
            resp.report_json = json.dumps(ticket.report.to_json())
        return resp

    def GetStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            if self.status_requires_auth:
                self.auth.check(context)
        except ScrutinyError as exc:
            _abort(context, exc)
        s = self.api.status()
        resp = auditor_pb2.GetStatusResponse(role=auditor_pb2.LEADER if s.leading else auditor_pb2.STANDBY,
                                             leader_address=s.leader_address, queued_runs=s.queued_runs,
                                             runs_awaiting_recheck=s.runs_awaiting_recheck)
        resp.last_runs.extend(auditor_pb2.RunInfo(**run_fields(t)) for t in s.own_last())
        resp.last_runs.extend(auditor_pb2.RunInfo(**inherited_fields(i)) for i in s.inherited)
        resp.skipped_runs.update(s.skipped)
        resp.next_runs.update(s.next_runs)
        if s.current is not None:
            resp.current_run.CopyFrom(auditor_pb2.RunInfo(**run_fields(s.current)))
        return resp

    def GetLastReport(self, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            if self.status_requires_auth:
                self.auth.check(context)
            if request.kind not in KINDS:
                raise RequestError(f"kind must be one of {', '.join(KINDS)}")
            report = self.api.last_report(request.kind)
            if report is None:
                raise NotFound(f"no {request.kind} run has finished here yet")
        except ScrutinyError as exc:
            _abort(context, exc)
        return auditor_pb2.GetLastReportResponse(report_json=json.dumps(report))


def _scope(request: Any) -> tuple[list[int] | None, str]:
    """What a RescanRequest asks for: (ledger ids or None, bookie id)."""
    scope = request.WhichOneof("scope")
    if request.wait_timeout_seconds < 0:
        raise RequestError("wait_timeout_seconds is negative")
    if scope == "ledgers":
        return list(request.ledgers.ledger_ids), ""
    if scope == "bookie_id":
        if not request.bookie_id.strip():
            raise RequestError("bookie_id is empty")
        return None, request.bookie_id.strip()
    if scope != "all_ledgers" or not request.all_ledgers:
        raise RequestError("say what to rescan: all_ledgers, ledgers or bookie_id")
    return None, ""
