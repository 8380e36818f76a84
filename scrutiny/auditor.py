"""The background auditor (`scrutiny auditor`): two or three instances, exactly one active.

- Leader election with kazoo's recipe under scrutiny's own path (never BookKeeper's auditorelection);
  losing the ZooKeeper session stops the leader's scheduling at once.
- APScheduler jobs: the full scrutiny run and the cheap under-replication age check, each on its own
  interval; the time of each kind's last completed run is kept in ZooKeeper so that a new leader keeps
  the cadence (BookKeeper #1683). Runs execute one at a time on one worker; a run still going when the
  next is due is skipped and counted, never stacked. BP-34's delayed re-check is a one-off job.
- Every run's report goes to the reports directory (with retention), to StatsD, and to the RPC.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import logging
import os
import queue
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from scrutiny.checks import Category
from scrutiny.config import ConfigError, ScanSettings
from scrutiny.logsetup import RUN_ID
from scrutiny.metadata import parse_metadata_service_uri
from scrutiny.report import Report
from scrutiny.run import Engine, PendingRun, ScrutinyRun, check_marks, make_engine
from scrutiny.statsd_reporter import StatsdReporter
from scrutiny.tls import read_secret, server_credentials, verified_peer, zk_client_args
from scrutiny.v1 import auditor_pb2, auditor_pb2_grpc
from scrutiny.zkstore import ZkMetadataStore

log = logging.getLogger(__name__)

FULL, UNDERREPLICATION, RESCAN = "full", "underreplication", "rescan"
KINDS = (FULL, UNDERREPLICATION, RESCAN)
PERIODIC = (FULL, UNDERREPLICATION)
DEFAULT_AUDITOR_PORT = 3192
SERVICE_NAME = "scrutiny.v1.Auditor"


@dataclass(frozen=True)
class AuditorSettings:
    """The `auditor` section of the config file."""

    listen: str = f"0.0.0.0:{DEFAULT_AUDITOR_PORT}"
    advertise_address: str = ""  # how other instances and clients reach this one (default: listen)
    full_interval_seconds: float = 86400.0  # 0 = no periodic full run
    underreplication_interval_seconds: float = 900.0  # 0 = no periodic age check
    run_when_replication_disabled: bool = False
    reports_dir: str = "/var/lib/scrutiny/reports"
    reports_keep: int = 50  # per kind
    election_path: str = ""  # default: <scrutiny path>/auditor/election
    max_rescan_ledgers: int = 10_000
    max_queued_runs: int = 8
    rescan_wait_seconds: float = 3600.0  # the longest a Rescan call waits for its report
    shutdown_grace_seconds: float = 30.0
    json_logs: bool = False
    token_file: str = ""  # a bearer token for Rescan (and GetStatus with status_requires_auth)
    tls_cert: str = ""  # serve the RPC over TLS
    tls_key: str = ""
    tls_client_ca: str = ""  # mutual TLS: clients need a certificate from this CA; such a client may Rescan
    insecure_open_rescan: bool = False  # let anyone who reaches the port Rescan (test setups only)
    status_requires_auth: bool = False
    statsd_host: str = ""  # empty: no StatsD
    statsd_port: int = 8125
    statsd_prefix: str = "scrutiny"

    def validate(self) -> AuditorSettings:
        host, _, port = self.listen.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"auditor.listen: {self.listen!r} is not HOST:PORT")
        for key in ("full_interval_seconds", "underreplication_interval_seconds", "shutdown_grace_seconds"):
            if getattr(self, key) < 0:
                raise ConfigError(f"auditor.{key}: must not be negative")
        for key in ("reports_keep", "max_rescan_ledgers", "max_queued_runs"):
            if getattr(self, key) < 1:
                raise ConfigError(f"auditor.{key}: must be at least 1")
        if self.token_file and not Path(self.token_file).is_file():
            raise ConfigError(f"auditor.token_file: {self.token_file} is not a readable file")
        if not (self.token_file or self.tls_client_ca or self.insecure_open_rescan):
            raise ConfigError("auditor: Rescan needs authentication: set token_file or tls_client_ca "
                              "(or insecure_open_rescan: true, for a test setup)")
        return self


class NotLeader(Exception):
    def __init__(self, leader: str) -> None:
        super().__init__(f"this auditor is a standby; the leader is at {leader or 'an unknown address'}")
        self.leader = leader


class Busy(Exception):
    pass


@dataclass
class Ticket:
    """One requested run, from the queue to its report."""

    kind: str
    ledger_ids: tuple[int, ...] | None = None
    bookie_id: str = ""
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    started_ms: int = 0
    finished_ms: int = 0
    ranges_done: int = 0
    ranges_total: int = 0
    report: Report | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def info(self) -> Any:
        msg = auditor_pb2.RunInfo(run_id=self.run_id, kind=self.kind, ranges_done=self.ranges_done,
                                  ranges_total=self.ranges_total, complete=bool(self.report and self.report.complete))
        if self.report is not None:
            msg.started_at, msg.finished_at = self.report.started_at, self.report.finished_at
            msg.counts.update(self.report.counts)
        elif self.started_ms:
            msg.started_at = _iso(self.started_ms / 1000)
        return msg


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class Auditor:
    def __init__(self, scan: ScanSettings, settings: AuditorSettings, engine: Engine | None = None,
                 reload: Callable[[], tuple[ScanSettings, AuditorSettings]] | None = None) -> None:
        self.scan = scan.validate()
        self.settings = settings.validate()
        self.engine = engine or make_engine(scan)
        self._reload = reload
        uri = parse_metadata_service_uri(scan.metadata_service_uri)
        self.uri = uri
        self.base = f"{uri.scrutiny_path}/auditor"
        self.election_path = settings.election_path or f"{self.base}/election"
        self._zk_args = zk_client_args(scan.zk_auth_file, scan.zk_tls_ca, scan.zk_tls_cert, scan.zk_tls_key)
        self.zk = self._new_client()
        self.store = ZkMetadataStore(self.zk, uri)
        self.statsd = (StatsdReporter(settings.statsd_host, settings.statsd_port, settings.statsd_prefix)
                       if settings.statsd_host else None)
        self.scheduler = BackgroundScheduler(timezone=UTC)
        self.stopping = threading.Event()
        self._step_down = threading.Event()
        self.leading = threading.Event()
        self._lock = threading.Lock()
        self._queue: queue.Queue[Ticket | None] = queue.Queue()
        self._queued: list[Ticket] = []
        self._awaiting_recheck: list[Ticket] = []
        self.current: Ticket | None = None
        self.last: dict[str, Ticket] = {}
        self.skipped: Counter[str] = Counter()
        self._token = read_secret(settings.token_file, "auditor.token_file").decode().strip() \
            if settings.token_file else ""
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="auditor-rpc"))
        auditor_pb2_grpc.add_AuditorServicer_to_server(AuditorServicer(self), self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        creds = server_credentials(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
        self.port = (self.server.add_secure_port(settings.listen, creds) if creds
                     else self.server.add_insecure_port(settings.listen))
        if self.port == 0:
            raise OSError(f"cannot listen on {settings.listen}")
        host = settings.listen.rsplit(":", 1)[0]
        self.address = settings.advertise_address or (
            f"{'127.0.0.1' if host in ('0.0.0.0', '[::]') else host}:{self.port}")
        self._threads: list[threading.Thread] = []

    def _new_client(self) -> KazooClient:
        return KazooClient(hosts=self.uri.hosts, timeout=self.scan.zk_session_timeout,
                           connection_retry={"max_tries": -1, "delay": 0.2, "max_delay": 5.0}, **self._zk_args)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Auditor:
        self.server.start()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self.scheduler.start()
        for target, name in ((self._connect_and_elect, "election"), (self._work, "run-worker")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        log.info("auditor listening on %s (advertised as %s)", self.port, self.address)
        return self

    def stop(self) -> None:
        """Release leadership, finish the current run within the grace period (else abandon it)."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        self._step_down.set()
        self.health.enter_graceful_shutdown()
        self._queue.put(None)
        worker = next((t for t in self._threads if t.name == "run-worker"), None)
        if worker is not None:
            worker.join(self.settings.shutdown_grace_seconds)
            if worker.is_alive():
                log.warning("abandoning the current run at shutdown")
        self.scheduler.shutdown(wait=False)
        try:
            self.zk.stop()
            self.zk.close()
        except Exception as exc:
            log.debug("closing ZooKeeper: %s", exc)
        self.server.stop(2).wait()

    def reload(self) -> None:
        """SIGHUP: new settings for the next runs; new intervals rescheduled at once."""
        if self._reload is None:
            return
        try:
            scan, settings = self._reload()
        except Exception as exc:
            log.error("reload refused, keeping the running settings: %s", exc)
            return
        if settings.listen != self.settings.listen:
            log.warning("auditor.listen changed: takes effect at the next restart")
        self.scan, self.settings = scan, dataclasses.replace(settings, listen=self.settings.listen)
        if self.leading.is_set():
            self._schedule_periodic()
        log.info("configuration reloaded")

    def _on_zk_state(self, state: str) -> None:
        # On kazoo's event thread: only flag, never block.
        if state == KazooState.LOST:
            log.warning("ZooKeeper session lost: stepping down")
            self._step_down.set()

    def _connect(self) -> bool:
        """The first connection; ZooKeeper may be down at start: back off, never crash-loop."""
        delay = 1.0
        while not self.stopping.is_set():
            try:
                self.zk.start(timeout=self.scan.zk_connect_timeout)
                self.zk.add_listener(self._on_zk_state)
                return True
            except KazooTimeoutError:
                log.warning("ZooKeeper at %s unreachable; retrying in %.0f s", self.uri.hosts, delay)
                self.zk = self._new_client()  # a timed-out start closes its client
                self.store = ZkMetadataStore(self.zk, self.uri)
                self.stopping.wait(delay)
                delay = min(delay * 2, 30.0)
        return False

    def _connect_and_elect(self) -> None:
        if not self._connect():
            return
        delay = 1.0
        while not self.stopping.is_set():
            if not self.zk.connected:  # kazoo reconnects (with a new session after expiry) by itself
                self.stopping.wait(0.2)
                continue
            try:
                self.zk.Election(self.election_path, self.address).run(self._lead)
                delay = 1.0
            except Exception as exc:
                if self.stopping.is_set():
                    return
                log.warning("leader election interrupted (%s); again in %.0f s", exc, delay)
                self.stopping.wait(delay)
                delay = min(delay * 2, 30.0)

    def _lead(self) -> None:
        self._step_down.clear()
        if self.stopping.is_set():
            return
        self.leading.set()
        log.info("leading (%s)", self.address)
        try:
            self._schedule_periodic()
            self._step_down.wait()
        finally:
            self.leading.clear()
            for kind in PERIODIC:
                if self.scheduler.get_job(kind):
                    self.scheduler.remove_job(kind)
            log.info("no longer leading")

    def leader_address(self) -> str:
        if self.leading.is_set():
            return self.address
        try:
            contenders = self.zk.Election(self.election_path).contenders()
        except Exception:
            return ""
        return str(contenders[0]) if contenders else ""

    # -- scheduling ---------------------------------------------------------------------------

    def _cadence(self, kind: str) -> int | None:
        try:
            data, _ = self.zk.get(f"{self.base}/cadence/{kind}")
            return int(data.decode())
        except (NoNodeError, ValueError):
            return None

    def _schedule_periodic(self) -> None:
        now = time.time()
        for kind, interval in ((FULL, self.settings.full_interval_seconds),
                               (UNDERREPLICATION, self.settings.underreplication_interval_seconds)):
            if self.scheduler.get_job(kind):
                self.scheduler.remove_job(kind)
            if interval <= 0:
                continue
            last = self._cadence(kind)
            first = now if last is None else max(now, last / 1000 + interval)
            self.scheduler.add_job(self._due, IntervalTrigger(seconds=interval), args=[kind], id=kind,
                                   next_run_time=datetime.fromtimestamp(first, UTC), coalesce=True,
                                   max_instances=1, misfire_grace_time=None)
            log.info("%s runs every %s s, next at %s", kind, interval, _iso(first))

    def next_runs(self) -> dict[str, str]:
        out = {}
        for kind in PERIODIC:
            job = self.scheduler.get_job(kind)
            if job is not None and job.next_run_time is not None:
                out[kind] = job.next_run_time.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        return out

    def _due(self, kind: str) -> None:
        if not self.leading.is_set():
            return
        try:
            disabled = self.store.replication_disabled()
        except Exception as exc:
            log.warning("cannot tell whether replication is disabled (%s): skipping the %s run", exc, kind)
            self._skip(kind, "zookeeper_unavailable")
            return
        if disabled and not self.settings.run_when_replication_disabled:
            log.info("ledger replication is disabled: skipping the %s run", kind)
            self._skip(kind, "replication_disabled")
            return
        with self._lock:
            busy = any(t.kind == kind for t in [*self._queued, *self._awaiting_recheck, self.current] if t)
        if busy:
            log.warning("the previous %s run is still going: skipping this one", kind)
            self._skip(kind, "still_running")
            return
        self.submit(Ticket(kind))

    def _skip(self, kind: str, reason: str) -> None:
        with self._lock:
            self.skipped[f"{kind}.{reason}"] += 1
        if self.statsd:
            self.statsd.skipped(kind, reason)

    # -- runs ---------------------------------------------------------------------------------

    def submit(self, ticket: Ticket) -> tuple[Ticket, bool]:
        """Queue a run; returns it and whether it waits behind another."""
        with self._lock:
            if len(self._queued) >= self.settings.max_queued_runs:
                raise Busy(f"{len(self._queued)} runs already queued; try again later")
            waits = self.current is not None or bool(self._queued)
            self._queued.append(ticket)
        self._queue.put(ticket)
        return ticket, waits

    def _work(self) -> None:
        while True:
            ticket = self._queue.get()
            if ticket is None or self.stopping.is_set():
                return
            with self._lock:
                self._queued.remove(ticket)
                self.current = ticket
            token = RUN_ID.set(ticket.run_id)
            try:
                self._run(ticket)
            except Exception as exc:
                log.exception("run %s failed", ticket.run_id)
                self._publish(ticket, self._failed(ticket, exc))
            finally:
                RUN_ID.reset(token)
                with self._lock:
                    self.current = None

    def _run(self, ticket: Ticket) -> None:
        ticket.started_ms = int(time.time() * 1000)
        if ticket.kind == UNDERREPLICATION:
            self._publish(ticket, check_marks(self.scan, ticket.run_id))
            return

        def progress(done: int, total: int) -> None:
            ticket.ranges_done, ticket.ranges_total = done, total

        def pause(seconds: float) -> None:  # ends early at shutdown
            self.stopping.wait(seconds)

        run = ScrutinyRun(self.scan, self.engine, progress=progress, run_id=ticket.run_id, sleep=pause)
        pending = run.start(ticket.ledger_ids, ticket.bookie_id)
        if not pending.faulty:
            self._publish(ticket, run.finish(pending))
            return
        # BP-34: re-check after the delay, as its own job; the worker serves other runs meanwhile.
        with self._lock:
            self._awaiting_recheck.append(ticket)
        when = datetime.now(UTC) + timedelta(seconds=self.scan.recheck_delay)
        self.scheduler.add_job(self._finish, DateTrigger(run_date=when), args=[ticket, run, pending],
                               misfire_grace_time=None)

    def _finish(self, ticket: Ticket, run: ScrutinyRun, pending: PendingRun) -> None:
        token = RUN_ID.set(ticket.run_id)
        try:
            report = run.finish(pending)
        except Exception as exc:
            log.exception("run %s failed in its re-check", ticket.run_id)
            report = self._failed(ticket, exc)
        finally:
            RUN_ID.reset(token)
            with self._lock:
                self._awaiting_recheck.remove(ticket)
        self._publish(ticket, report)

    def _failed(self, ticket: Ticket, exc: Exception) -> Report:
        now = _iso(time.time())
        return Report(ticket.run_id, _iso(ticket.started_ms / 1000), now, False, {}, [],
                      errors=[f"{type(exc).__name__}: {exc}"])

    def _publish(self, ticket: Ticket, report: Report) -> None:
        ticket.finished_ms = int(time.time() * 1000)
        ticket.report = report
        self._write_report(ticket.kind, report)
        if self.statsd:
            cats = (Category.UNDERREPLICATED_ELAPSED_GRACE_PERIOD,) if ticket.kind == UNDERREPLICATION else None
            try:
                self.statsd.publish(report, ticket.kind, ticket.finished_ms - ticket.started_ms, cats)
            except OSError as exc:
                log.warning("StatsD: %s", exc)
        if ticket.kind in PERIODIC and report.complete and self.leading.is_set():
            self._set_cadence(ticket.kind, ticket.started_ms)
        with self._lock:
            self.last[ticket.kind] = ticket
        ticket.done.set()

    def _set_cadence(self, kind: str, ms: int) -> None:
        path = f"{self.base}/cadence/{kind}"
        try:
            if self.zk.exists(path):
                self.zk.set(path, str(ms).encode())
            else:
                self.zk.create(path, str(ms).encode(), makepath=True)
        except Exception as exc:
            log.warning("could not record the %s cadence: %s", kind, exc)

    def _write_report(self, kind: str, report: Report) -> None:
        folder = Path(self.settings.reports_dir) / kind
        try:
            folder.mkdir(parents=True, exist_ok=True)
            name = f"{report.started_at.replace(':', '')}-{report.run_id}.json"
            tmp = folder / f".{name}.tmp"
            tmp.write_text(report.dumps())
            os.replace(tmp, folder / name)
            for old in sorted(folder.glob("*.json"))[:-self.settings.reports_keep]:
                old.unlink()
        except OSError as exc:
            log.error("could not write the report of run %s: %s", report.run_id, exc)

    # -- what the RPC asks ----------------------------------------------------------------------

    def authenticated(self, context: grpc.ServicerContext) -> bool:
        """A verified client certificate (mutual TLS) or the bearer token; open only when configured so."""
        if not self._token and not self.settings.tls_client_ca:
            return self.settings.insecure_open_rescan
        if self.settings.tls_client_ca and verified_peer(context):
            return True
        if self._token:
            given = dict(context.invocation_metadata()).get("authorization", "")
            if isinstance(given, bytes):
                given = given.decode("utf-8", "replace")
            return hmac.compare_digest(given.encode(), f"Bearer {self._token}".encode())
        return False

    def rescan(self, ledger_ids: list[int] | None, bookie_id: str) -> tuple[Ticket, bool]:
        if not self.leading.is_set():
            raise NotLeader(self.leader_address())
        if ledger_ids is not None:
            if not ledger_ids:
                raise ValueError("ledgers: the list is empty")
            if len(ledger_ids) > self.settings.max_rescan_ledgers:
                raise ValueError(f"ledgers: {len(ledger_ids)} ids; at most {self.settings.max_rescan_ledgers}")
            negative = [i for i in ledger_ids if i < 0]
            if negative:
                raise ValueError(f"ledgers: negative ledger id {negative[0]}")
            unknown = [r.ledger_id for r in self.store.read_ledgers(sorted(set(ledger_ids))) if r.deleted]
            if unknown:
                raise ValueError(f"ledgers: no such ledger {', '.join(map(str, unknown[:10]))}"
                                 + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""))
        ticket = Ticket(RESCAN, tuple(ledger_ids) if ledger_ids is not None else None, bookie_id)
        return self.submit(ticket)

    def status(self) -> Any:
        with self._lock:
            current = self.current
            resp = auditor_pb2.GetStatusResponse(
                role=auditor_pb2.LEADER if self.leading.is_set() else auditor_pb2.STANDBY,
                queued_runs=len(self._queued), runs_awaiting_recheck=len(self._awaiting_recheck))
            resp.last_runs.extend(t.info() for t in self.last.values())
            resp.skipped_runs.update(self.skipped)
        if current is not None:
            resp.current_run.CopyFrom(current.info())
        resp.leader_address = self.leader_address()
        resp.next_runs.update(self.next_runs())
        return resp


class AuditorServicer(auditor_pb2_grpc.AuditorServicer):
    def __init__(self, auditor: Auditor) -> None:
        self.auditor = auditor

    def _authenticate(self, context: grpc.ServicerContext) -> None:
        if not self.auditor.authenticated(context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "a valid bearer token is required")

    def Rescan(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._authenticate(context)
        scope = request.WhichOneof("scope")
        ledger_ids: list[int] | None = None
        bookie_id = ""
        if scope == "ledgers":
            ledger_ids = list(request.ledgers.ledger_ids)
        elif scope == "bookie_id":
            bookie_id = request.bookie_id.strip()
            if not bookie_id:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bookie_id is empty")
        elif scope != "all_ledgers" or not request.all_ledgers:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "say what to rescan: all_ledgers, ledgers or bookie_id")
        if request.wait_timeout_seconds < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "wait_timeout_seconds is negative")
        try:
            ticket, queued = self.auditor.rescan(ledger_ids, bookie_id)
        except NotLeader as exc:
            context.set_trailing_metadata((("leader-address", exc.leader),))
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Busy as exc:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        resp = auditor_pb2.RescanResponse(run_id=ticket.run_id, queued=queued)
        if request.wait:
            timeout = request.wait_timeout_seconds or self.auditor.settings.rescan_wait_seconds
            if not ticket.done.wait(min(timeout, self.auditor.settings.rescan_wait_seconds)):
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                              f"run {ticket.run_id} is still going; its report will be served by GetLastReport")
            assert ticket.report is not None
            resp.report_json = json.dumps(ticket.report.to_json())
        return resp

    def GetStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        if self.auditor.settings.status_requires_auth:
            self._authenticate(context)
        return self.auditor.status()

    def GetLastReport(self, request: Any, context: grpc.ServicerContext) -> Any:
        if self.auditor.settings.status_requires_auth:
            self._authenticate(context)
        if request.kind not in KINDS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"kind must be one of {', '.join(KINDS)}")
        ticket = self.auditor.last.get(request.kind)
        report = ticket.report if ticket is not None else None
        if report is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no {request.kind} run has finished here yet")
        assert report is not None
        return auditor_pb2.GetLastReportResponse(report_json=json.dumps(report.to_json()))
