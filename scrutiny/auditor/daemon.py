"""The auditor: its RPC and pages, its leadership, its runs one at a time, and where their reports go; the
composition of the parts around it."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from concurrent import futures
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import grpc
from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.date import DateTrigger
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from scrutiny.auditor.collector import collectors
from scrutiny.auditor.continuous import Continuous
from scrutiny.auditor.currentstate import CurrentState
from scrutiny.auditor.deeprecord import deep_pass
from scrutiny.auditor.handoffleader import AuditorLeader
from scrutiny.auditor.keptstate import StateKeeper
from scrutiny.auditor.lastrun import RunSummary
from scrutiny.auditor.leadership import Leadership, PeriodicRuns
from scrutiny.auditor.publishing import Leading, Publisher
from scrutiny.auditor.runkinds import (
    DEEP,
    RESCAN,
    UNDERREPLICATION,
    WHATIF,
)
from scrutiny.auditor.runqueue import Later, RunQueue, Ticket
from scrutiny.auditor.service import AuditorServicer, Authenticator, Status
from scrutiny.auditor.sinks import ReportFiles, ReportSink, RunTallies, StatsdSink
from scrutiny.auditor.trigger import RunTrigger, intervals
from scrutiny.checks.remedy import RepairContext
from scrutiny.config import AuditorSettings, MetricsSettings, ScanSettings, StatsdSettings
from scrutiny.errors import NotLeader, RequestError, one_line
from scrutiny.findings import Findings
from scrutiny.httpserver import App, HttpServer, HttpsFiles
from scrutiny.metadata import parse_host_port
from scrutiny.repair.handoff import Handoff
from scrutiny.report import Report
from scrutiny.scan.driver import ScrutinyRun, check_marks
from scrutiny.scan.engines import Engine, make_engine
from scrutiny.store import MetadataStore, open_store
from scrutiny.times import iso_seconds
from scrutiny.tls import read_secret, server_credentials
from scrutiny.v1 import auditor_pb2_grpc

log = logging.getLogger(__name__)
SERVICE_NAME = "scrutiny.v1.Auditor"
HANDOFF_JOB = "handoff"
KEEP_STATE_JOB = "keep-state"
KEEP_STATE_SECONDS = 2.0  # the current state written for the next leader at most this often (when it changed)


class AuditorConfig(NamedTuple):
    scan: ScanSettings
    auditor: AuditorSettings
    statsd: StatsdSettings = StatsdSettings()
    metrics: MetricsSettings = MetricsSettings()


def build_sinks(config: AuditorConfig) -> list[ReportSink]:
    """The report files, and every other sink the configuration asks for."""
    sinks: list[ReportSink] = [ReportFiles(config.auditor.reports_dir, config.auditor.reports_keep)]
    if config.statsd.host:
        sinks.append(StatsdSink(config.statsd.host, config.statsd.port, config.statsd.prefix))
    return sinks


def check_rescan_ids(ledger_ids: list[int], most: int, store: MetadataStore) -> None:
    """A rescan's chosen ledgers: some, not too many, and every one of them in the metadata."""
    if not ledger_ids:
        raise RequestError("ledgers: the list is empty")
    if len(ledger_ids) > most:
        raise RequestError(f"ledgers: {len(ledger_ids)} ids; at most {most}")
    negative = [i for i in ledger_ids if i < 0]
    if negative:
        raise RequestError(f"ledgers: negative ledger id {negative[0]}")
    unknown = [r.ledger_id for r in store.read_ledgers(sorted(set(ledger_ids))) if r.deleted]
    if unknown:
        raise RequestError(f"ledgers: no such ledger {', '.join(map(str, unknown[:10]))}"
                           + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""))


def authenticator(token: str, s: AuditorSettings) -> Authenticator:
    """The RPC's and the HTTP API's one rule for who may call what."""
    return Authenticator(token, bool(s.tls_client_ca), s.insecure_open_rescan)


def _engine_settings(s: ScanSettings) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    return s.engine, s.spark_master, tuple(sorted(s.spark_conf.items()))


class Auditor:
    def __init__(self, scan: ScanSettings, settings: AuditorSettings, statsd: StatsdSettings | None = None,
                 metrics: MetricsSettings | None = None, engine: Engine | None = None,
                 reload: Callable[[], AuditorConfig] | None = None,
                 web: Callable[[Auditor], App] | None = None) -> None:
        self.config = AuditorConfig(scan.validate(), settings.validate(), (statsd or StatsdSettings()).validate(),
                                    (metrics or MetricsSettings()).validate())
        self._reload, self._web = reload, web  # web: the console beside /metrics, as the composition root wires it
        self._own_engine = engine is None
        self.engine = engine or make_engine(scan)
        self._engine_built_for = _engine_settings(scan)
        self.tallies = RunTallies()  # what /metrics exports of the runs, across reloads
        self.http: HttpServer | None = None
        self._http_listen = ""
        self._token = (read_secret(settings.token_file, "auditor.token_file").decode().strip()
                       if settings.token_file else "")
        self.scheduler = BackgroundScheduler(timezone=UTC)
        self.queue = RunQueue(self._execute, self._publish, self._later, failed_run, settings.max_queued_runs)
        self.stopping = threading.Event()
        self.server: grpc.Server | None = None
        self.port = 0
        self.address = settings.advertise_address
        self.leadership: Leadership | None = None
        self.periodic: PeriodicRuns | None = None
        self.current = CurrentState()
        # the remedies' context before a full run tells it (the hand-off judges with the same percentage)
        self.current.repair = RepairContext(self.config.scan.auditor_ledger_verification_percentage)
        self.publisher = Publisher(self.current)  # where finished runs go
        self.keeper = StateKeeper(self.current)  # ... and the current state, for the next leader
        self._kept: list[int] = []  # the ledgers of what the last leader kept, to look at again once leading
        self.trigger = RunTrigger(self)  # whether a run asked for starts
        # its safety net: a full run (unless one is queued or running)
        self.handoff = Handoff(AuditorLeader(self))
        self.continuous = (Continuous(self.config.scan, self.config.auditor, self.current, self.trigger.full_run_asked)
                           if settings.continuous else None)

    # -- what tests and the RPC look at --------------------------------------------------------

    @property
    def leading(self) -> threading.Event:
        assert self.leadership is not None, "start() the auditor first"
        return self.leadership.leading

    @property
    def last(self) -> dict[str, Ticket]:
        return self.queue.last

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Auditor:
        s = self.config.auditor
        self.engine.open()  # before any gRPC thread exists
        self.publisher.sinks = [*build_sinks(self.config), self.tallies]
        self._serve_http()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="auditor-rpc"))
        servicer = AuditorServicer(self, self.authenticator(), s.rescan_wait_seconds, s.status_requires_auth)
        auditor_pb2_grpc.add_AuditorServicer_to_server(servicer, self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        creds = server_credentials(s.tls_cert, s.tls_key, s.tls_client_ca)
        self.port = (self.server.add_secure_port(s.listen, creds) if creds else self.server.add_insecure_port(s.listen))
        if self.port == 0:
            raise OSError(f"cannot listen on {s.listen}")
        host, _ = parse_host_port(s.listen, "auditor.listen")
        self.address = s.advertise_address or f"{'127.0.0.1' if host in ('0.0.0.0', '[::]') else host}:{self.port}"
        self.leadership = Leadership(lambda: open_store(self.config.scan), self.address, s.election_path,
                                     self._elected, self._deposed, self._taking_over)
        self.periodic = PeriodicRuns(self.scheduler, self.leadership.connected_store, self.trigger.due)
        self.server.start()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self.scheduler.start()
        self.queue.start()
        self.leadership.start()
        log.info("auditor RPC on %s, port %d (advertised as %s); %s", s.listen, self.port, self.address,
                 "; ".join([sink.destination() for sink in self.publisher.sinks if sink is not self.tallies]
                           + ([f"/metrics on {self.config.metrics.listen}, port {self.http.port} "
                               f"({self.http.scheme}; the console at /)"] if self.http is not None else [])))
        return self

    def stop(self) -> None:
        """Release leadership, finish the current run within the grace period (else abandon it)."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        if self.server is not None:
            self.health.enter_graceful_shutdown()
        if not self.queue.stop(self.config.auditor.shutdown_grace_seconds):
            log.warning("abandoning the current run at shutdown")
        self.scheduler.shutdown(wait=False)
        self.queue.abandon_rechecks()
        if self.continuous is not None:
            self.continuous.stop()
        if self.leadership is not None:
            self.leadership.stop()
        for sink in self.publisher.sinks:
            sink.close()
        if self.http is not None:
            self.http.close()
        if self.server is not None:
            self.server.stop(2).wait()
        if self._own_engine:
            self.engine.close()

    def reload(self) -> None:
        """SIGHUP: the whole configuration again; new intervals at once, new sinks at once, a new
        engine from the next run on (`listen` only at the next restart)."""
        if self._reload is None:
            return
        try:
            new = self._reload()
        except Exception as exc:
            log.error("reload refused, keeping the running settings: %s", one_line(exc))
            return
        if new.auditor.listen != self.config.auditor.listen:
            log.warning("auditor.listen changed: takes effect at the next restart")
        for sink in self.publisher.sinks:
            if sink is not self.tallies:  # what /metrics counts goes on
                sink.close()
        self.publisher.sinks = [*build_sinks(new), self.tallies]
        self.config = new
        self.current.repair = dataclasses.replace(
            self.current.repair, verification_percentage=new.scan.auditor_ledger_verification_percentage)
        self._serve_http()
        leading = self.leadership is not None and self.leading.is_set()
        for sink in self.publisher.sinks:
            if sink is not self.tallies:
                sink.leadership(leading)
        if self.leading.is_set() and self.periodic is not None:
            self.periodic.schedule(intervals(self.config.auditor))
            self._schedule_handoff()
        log.info("configuration reloaded")

    def _serve_http(self) -> None:
        """/metrics (`scrutiny.auditor.collector`) and the console with its API (what `web` makes of the auditor:
        `scrutiny.console.web`, wired in `main`) on metrics.listen; a reload that moves it moves the server (a
        moved port is freed before the new binds)."""
        listen, s = self.config.metrics.listen, self.config.auditor
        if self.http is not None and listen != self._http_listen:
            self.http.close()
            self.http = None
        if listen and self.http is None:
            # the page and its API carry the token: HTTPS with the RPC's own certificate
            https = HttpsFiles(s.tls_cert, s.tls_key, s.tls_client_ca) if s.tls_cert or s.tls_key else None
            registry = CollectorRegistry(auto_describe=False)
            for collector in collectors(self.tallies, self.current, self.continuous):
                registry.register(collector)
            self.http, self._http_listen = HttpServer(listen, registry, https=https), listen
        if self.http is not None and self._web is not None:
            self.http.app = self._web(self)  # again at a reload: the token rule and the limits as reloaded

    # -- leadership ---------------------------------------------------------------------------

    def _taking_over(self) -> None:
        self._kept = self.keeper.restore(self.connected_store())

    def _elected(self) -> None:
        assert self.periodic is not None
        store = self.connected_store()
        self.publisher.elected(store, {kind: t.finished_ms for kind, t in self.queue.last.items()})
        if self.continuous is not None:  # first: the full run it asks for is then the period's, if one is due
            self.continuous.start(store, self._kept)
        self.periodic.schedule(intervals(self.config.auditor))
        self._schedule_handoff()
        self.scheduler.add_job(lambda: self.keeper.keep(self.connected_store()), "interval",
                               seconds=KEEP_STATE_SECONDS, id=KEEP_STATE_JOB, replace_existing=True, max_instances=1,
                               coalesce=True)

    def _schedule_handoff(self) -> None:
        """The hand-off to autorecovery (`scrutiny.repair`), while leading; it does nothing while `repair` is off."""
        self.scheduler.add_job(self.handoff.tick, "interval", seconds=self.config.auditor.repair_interval_seconds,
                               id=HANDOFF_JOB, replace_existing=True, max_instances=1, coalesce=True)

    def _deposed(self) -> None:
        assert self.periodic is not None
        if self.continuous is not None:
            self.continuous.stop()
        self.periodic.clear()
        for job in (HANDOFF_JOB, KEEP_STATE_JOB):
            with contextlib.suppress(JobLookupError):
                self.scheduler.remove_job(job)
        self.publisher.deposed()

    # -- runs ---------------------------------------------------------------------------------

    def _current_engine(self) -> Engine:
        """The engine for the next run: rebuilt when a reload changed its settings and no run still
        needs the old one for its re-check."""
        wanted = _engine_settings(self.config.scan)
        if self._own_engine and wanted != self._engine_built_for and not self.queue.awaiting_recheck:
            self.engine.close()
            self.engine = make_engine(self.config.scan)
            self._engine_built_for = wanted
        return self.engine

    def _execute(self, ticket: Ticket) -> Report | Later:
        ticket.started_ms = int(time.time() * 1000)
        if ticket.kind == UNDERREPLICATION:
            return check_marks(self.config.scan, ticket.run_id)

        def progress(done: int, total: int, ledgers: int) -> None:
            ticket.ranges_done, ticket.ranges_total = done, total

        settings = self.config.scan
        if ticket.kind == DEEP:  # the next slice of the deep pass, wherever the last leader left it
            cursor = deep_pass(self.connected_store(), self.config.auditor)
            ticket.deep_slice = cursor.next_slice
            settings = dataclasses.replace(settings, deep=True, deep_slices=cursor.slices,
                                           deep_slice=cursor.next_slice)
        run = ScrutinyRun(settings, self._current_engine(), progress=progress, run_id=ticket.run_id,
                          sleep=self._pause, kind=ticket.kind, record_sightings=True, checkpoints=True)
        pending = run.start(ticket.ledger_ids, ticket.bookie_id, ticket.without, ticket.without_racks)
        if not pending.faulty:
            return run.finish(pending)
        return Later(self.config.scan.recheck_delay, lambda: run.finish(pending), pending.store.close)

    def _pause(self, seconds: float) -> None:
        self.stopping.wait(seconds)  # ends early at shutdown

    def _later(self, delay: float, fn: Callable[[], None]) -> None:
        self.scheduler.add_job(fn, DateTrigger(run_date=datetime.now(UTC) + timedelta(seconds=delay)),
                               misfire_grace_time=None)

    def _publish(self, ticket: Ticket, report: Report) -> None:
        leading = (Leading(self.connected_store(), self.config.auditor, self.periodic)
                   if self.leading.is_set() and self.periodic is not None else None)
        self.publisher.published(ticket, report, self.address, leading)
        if self.continuous is not None and ticket.judged_every_ledger(report):
            self.continuous.runs_sighted(ticket.started_ms)  # a bookie it found gone, not yet due: looked at when due

    # -- what the RPC asks ----------------------------------------------------------------------

    def rescan(self, ledger_ids: list[int] | None, bookie_id: str) -> tuple[Ticket, bool]:
        assert self.leadership is not None
        if not self.leading.is_set():
            raise NotLeader(self.leadership.leader_address())
        if ledger_ids is not None:
            check_rescan_ids(ledger_ids, self.config.auditor.max_rescan_ledgers, self.connected_store())
        return self.queue.submit(Ticket(RESCAN, tuple(ledger_ids) if ledger_ids is not None else None, bookie_id))

    def whatif(self, bookie_ids: list[str], racks: list[str]) -> tuple[Ticket, bool]:
        assert self.leadership is not None
        if not self.leading.is_set():
            raise NotLeader(self.leadership.leader_address())
        return self.queue.submit(Ticket(WHATIF, without=tuple(bookie_ids), without_racks=tuple(racks)))

    def status(self) -> Status:
        q = self.queue
        leader = self.leadership.leader_address() if self.leadership is not None else ""
        return Status(leading=self.leading.is_set(), leader_address=leader, current=q.current,
                      last=tuple(q.last.values()), next_runs=self.periodic.next_runs() if self.periodic else {},
                      skipped=dict(self.trigger.skipped), queued_runs=len(q.queued),
                      runs_awaiting_recheck=len(q.awaiting_recheck),
                      inherited=tuple(self.publisher.inherited.values()))

    def last_run(self, kind: str) -> Report | RunSummary | None:
        """The last run of this kind here, or the summary of a newer one an earlier leader ran."""
        ticket = self.queue.last.get(kind)
        inherited = self.publisher.inherited.get(kind)
        if inherited is not None and (ticket is None or ticket.finished_ms < inherited.finished_ms):
            return inherited
        return ticket.report if ticket is not None else None

    def last_report(self, kind: str) -> dict[str, Any] | None:
        run = self.last_run(kind)
        return run.report_json() if isinstance(run, RunSummary) else run.to_json() if run is not None else None

    def current_state(self, most: int = 1000, newest_first: bool = False) -> dict[str, Any]:
        feeds = dict(self.continuous.feeds) if self.continuous is not None else None
        return {"leading": self.leading.is_set(), **self.current.to_json(feeds, most, newest_first)}

    def leader_address(self) -> str:
        return self.leadership.leader_address() if self.leadership is not None else ""

    def connected_store(self) -> MetadataStore:
        assert self.leadership is not None
        return self.leadership.connected_store()

    def scan_settings(self) -> ScanSettings:
        return self.config.scan

    def auditor_settings(self) -> AuditorSettings:
        return self.config.auditor

    def authenticator(self) -> Authenticator:
        return authenticator(self._token, self.config.auditor)


def failed_run(ticket: Ticket, exc: Exception) -> Report:
    """What a run that raised reports: incomplete, with the error."""
    return Report(ticket.run_id, iso_seconds(ticket.started_ms / 1000), iso_seconds(time.time()), False, {},
                  Findings(), errors=[f"{type(exc).__name__}: {one_line(exc)}"])

