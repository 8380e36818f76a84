"""Real BookKeeper for the tests, from a release's own jars (`make peers` fetches them into .peers/): bookie processes
on loopback over the tests' ZooKeeper (or Pulsar's metadata store on etcd, from a Pulsar release's jars), on
DbLedgerStorage (or SortedLedgerStorage, the stock bookie behind the bridge), each started, stopped, killed, wiped
and brought back; AutoRecovery (its Auditor and ReplicationWorker) at a chosen percentage; BookKeeper's shell; and
BookKeeper's own client, driven a command a line (`tests/peers/src/scrutiny/peers/LedgerTool.java`).

Every process is a child that dies with the test (`processes.spawn`); each writes its log to the cluster's work
directory (`<workdir>/<name>.log`), where a failing test's message points."""

from __future__ import annotations

import json
import os
import queue
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scrutiny.testing import processes, store_at
from scrutiny.testing.metadatahome import MetadataHome

PEERS = Path(os.environ.get("SCRUTINY_PEERS", Path(__file__).resolve().parents[2] / ".peers"))
DB_LEDGER_STORAGE = "org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage"
SORTED_LEDGER_STORAGE = "org.apache.bookkeeper.bookie.SortedLedgerStorage"
# bin/common.sh's flags for Java 17; a client JIT and a serial collector: two cores start many JVMs quickly
JVM_FLAGS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Dio.netty.tryReflectionSetAccessible=true",
             "--add-opens", "java.base/java.nio=ALL-UNNAMED", "--add-opens", "java.base/jdk.internal.misc=ALL-UNNAMED",
             "--add-opens", "java.base/java.io=ALL-UNNAMED", "--add-opens", "java.base/java.util.zip=ALL-UNNAMED")
LOG4J2 = """<Configuration status="WARN">
  <Appenders><File name="f" fileName="{log}"><PatternLayout pattern="%d %p [%t] %c{{1}} - %m%n"/></File></Appenders>
  <Loggers><Root level="{level}"><AppenderRef ref="f"/></Root></Loggers>
</Configuration>
"""


class RealBookKeeperError(RuntimeError):
    pass


@dataclass(frozen=True)
class Release:
    """One release's jars (BookKeeper's, or Pulsar's broker with everything it runs with), and for BookKeeper the
    tests' client built against them."""

    version: str
    home: Path

    @classmethod
    def of(cls, version: str, peers: Path = PEERS, project: str = "bookkeeper") -> Release:
        home = peers / f"{project}-{version}"
        if not (home / ".fetched").exists():
            raise RealBookKeeperError(f"{project} {version} is not in {peers}: run `make peers`")
        return cls(version, home)

    @property
    def line(self) -> str:
        """4.17, 4.16: a Pulsar line's BookKeeper."""
        return ".".join(self.version.split(".")[:2])

    def command(self, main: str, *args: str, log: Path, heap: str = "256m", level: str = "INFO",
                jvm: tuple[str, ...] = ()) -> list[str]:
        config = log.with_suffix(".log4j2.xml")
        config.write_text(LOG4J2.format(log=log, level=level))
        return ["java", f"-Xmx{heap}", f"-XX:MaxDirectMemorySize={heap}", *JVM_FLAGS, *jvm,
                f"-Dlog4j.configurationFile={config}", "-cp", f"{self.home}/lib/*:{self.home}/classes", main, *args]


def write_conf(path: Path, values: Mapping[str, object]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


class Process:
    """A JVM of the cluster's, its log in the work directory."""

    def __init__(self, cmd: list[str], log: Path) -> None:
        self.log = log
        with log.with_suffix(".out").open("ab") as out:
            self.proc: subprocess.Popen[bytes] = processes.spawn(cmd, stdout=out, stderr=subprocess.STDOUT)

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace: float = 30.0) -> None:
        processes.stop(self.proc, grace)

    def kill(self) -> None:
        processes.reap(self.proc)

    def tail(self, lines: int = 30) -> str:
        text = "".join(p.read_text(errors="replace") for p in (self.log, self.log.with_suffix(".out")) if p.exists())
        return "\n".join(text.splitlines()[-lines:])


class RealBookie:
    """One bookie process: its id (`127.0.0.1:<port>`), its journal and ledger directories, its configuration, and
    its admin HTTP endpoints on loopback when asked for (`admin_port`)."""

    def __init__(self, cluster: RealBookKeeper, name: str, port: int, storage: str, settings: Mapping[str, object],
                 admin_port: int = 0) -> None:
        self.cluster, self.name, self.port, self.admin_port = cluster, name, port, admin_port
        self.bookie_id = f"127.0.0.1:{port}"
        self.base = cluster.workdir / name
        self.journal_dir, self.ledger_dir = self.base / "journal", self.base / "ledgers"
        admin = {"httpServerEnabled": "true", "httpServerPort": admin_port, "httpServerHost": "127.0.0.1",
                 "httpServerClass": "org.apache.bookkeeper.http.vertx.VertxHttpServer"} if admin_port else {}
        self.settings = {**cluster.bookie_settings(), "bookiePort": port, "journalDirectories": self.journal_dir,
                         "ledgerDirectories": self.ledger_dir, "ledgerStorageClass": storage, **admin, **settings}
        self.conf = write_conf(cluster.workdir / f"{name}.conf", self.settings)
        self.process: Process | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.running

    def start(self, timeout: float = 90.0) -> RealBookie:
        """Started, and registered as writable (so a client can place ledgers on it)."""
        if self.running:
            return self
        log = self.cluster.workdir / f"{self.name}.log"
        self.process = Process(self.cluster.command("org.apache.bookkeeper.server.Main", "--conf", str(self.conf),
                                                    log=log), log)
        path = f"{self.cluster.root}/available/{self.bookie_id}"
        deadline = time.monotonic() + timeout
        while not self.cluster.tree.exists(path) or not self._admin_answers():  # (the admin server starts after)
            if not self.process.running or time.monotonic() > deadline:
                raise RealBookKeeperError(f"bookie {self.bookie_id} did not register: {self.process.tail()}")
            time.sleep(0.1)
        return self

    def _admin_answers(self) -> bool:
        if not self.admin_port:
            return True
        try:
            socket.create_connection(("127.0.0.1", self.admin_port), timeout=1).close()
            return True
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM: the bookie flushes its write cache and index, and unregisters."""
        if self.process is not None:
            self.process.stop()

    def kill(self, timeout: float = 60.0) -> None:
        """SIGKILL: what it had not flushed is in its journal only. Returns once its registration is gone (its session
        expired): a bookie started again before that waits for the old registration, and may give up."""
        if self.process is not None:
            self.process.kill()
        deadline = time.monotonic() + timeout
        while any(self.cluster.tree.exists(f"{self.cluster.root}/available{sub}/{self.bookie_id}")
                  for sub in ("", "/readonly")):
            if time.monotonic() > deadline:
                raise RealBookKeeperError(f"bookie {self.bookie_id}'s registration outlived its session")
            time.sleep(0.2)

    def force_gc(self, timeout: float = 120.0) -> None:
        """A garbage collection now, compaction included, as an operator asks for one (`PUT /api/v1/bookie/gc`, the
        admin endpoint's TriggerGCService), waited for until the bookie says it is done (`GET`: is_in_force_gc)."""
        url = f"http://127.0.0.1:{self.admin_port}/api/v1/bookie/gc"
        body = json.dumps({"forceMajor": True, "forceMinor": True}).encode()
        with urllib.request.urlopen(urllib.request.Request(url, data=body, method="PUT"), timeout=30):
            pass
        deadline = time.monotonic() + timeout
        while True:
            with urllib.request.urlopen(url, timeout=30) as r:
                if json.loads(r.read()).get("is_in_force_gc") != "true":
                    return
            if time.monotonic() > deadline:
                raise RealBookKeeperError(f"bookie {self.bookie_id}'s forced garbage collection did not end in "
                                          f"{timeout:.0f} s: {self.process.tail() if self.process else ''}")
            time.sleep(0.2)

    def lose_entries(self, ledger_id: int, entry_ids: list[int] | None = None) -> None:
        """Copies lost while the bookie is down (stopped here, started again): the given entries' keys, or with none
        given the ledger's own key (its whole share: the bookie answers it holds no such ledger), deleted from its
        DbLedgerStorage indexes with RocksDB's `ldb`, and its journal emptied so that the restart does not replay
        them back (a bookie whose index lost keys and whose journal disk was replaced, say)."""
        self.stop()
        current = self.ledger_dir / "current"
        keys = ([("locations", struct.pack(">qq", ledger_id, e)) for e in entry_ids] if entry_ids is not None
                else [("ledgers", struct.pack(">q", ledger_id))])
        for db, key in keys:
            processes.run(["ldb", f"--db={current / db}", "delete", "--key_hex", f"0x{key.hex()}"], check=True,
                          capture_output=True, timeout=60)
        for journal in (self.journal_dir / "current").glob("*.txn"):
            journal.unlink()
        (current / "lastMark").unlink(missing_ok=True)
        self.start()

    def wipe(self) -> None:
        """Its disks lost, and the bookie formatted to come back under its id (`bookieformat -deleteCookie`, as an
        operator does: a bookie whose cookie is in the metadata and not on its disks refuses to start)."""
        self.kill()
        shutil.rmtree(self.base, ignore_errors=True)
        self.cluster.shell("bookieformat", "-nonInteractive", "-force", "-deleteCookie", conf=self.conf)


class LedgerClient:
    """BookKeeper's own client in a process of its own (LedgerTool), a command a line: every ledger it writes has
    the password "scrutiny" and payloads that name their ledger and entry."""

    def __init__(self, cluster: RealBookKeeper, log: Path) -> None:
        cmd = cluster.command("scrutiny.peers.LedgerTool", cluster.uri, log=log, level="WARN")
        self.log = log
        self.proc: subprocess.Popen[str] = processes.spawn(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                           stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True, name="ledger-client").start()
        self._lock = threading.Lock()
        self._answer(120.0)  # {"ready": true}

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self._lines.put(line)
        self._lines.put(None)

    def _answer(self, timeout: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise RealBookKeeperError(f"the ledger client said nothing for {timeout:.0f} s; see {self.log}") from None
        if line is None:
            raise RealBookKeeperError(f"the ledger client ended; see {self.log}")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RealBookKeeperError(f"the ledger client: {answer['error']}")
        return answer

    def call(self, *words: object, timeout: float = 120.0) -> dict[str, Any]:
        with self._lock:
            assert self.proc.stdin is not None
            self.proc.stdin.write(" ".join(map(str, words)) + "\n")
            self.proc.stdin.flush()
            return self._answer(timeout)

    def create(self, ensemble: int, write_quorum: int, ack_quorum: int, digest: str = "CRC32C", entries: int = 10,
               size: int = 100, metadata: Mapping[str, str] | None = None) -> tuple[int, int]:
        """A ledger written and closed: its id and last entry id."""
        got = self.call("create", ensemble, write_quorum, ack_quorum, digest, entries, size,
                        *(f"{k}={v}" for k, v in (metadata or {}).items()))
        return int(got["ledger"]), int(got["last"])

    def open(self, ensemble: int, write_quorum: int, ack_quorum: int, digest: str = "CRC32C",
             metadata: Mapping[str, str] | None = None) -> int:
        return int(self.call("open", ensemble, write_quorum, ack_quorum, digest,
                             *(f"{k}={v}" for k, v in (metadata or {}).items()))["ledger"])

    def add(self, ledger_id: int, count: int, size: int = 100) -> int:
        return int(self.call("add", ledger_id, count, size)["last"])

    def close_ledger(self, ledger_id: int) -> int:
        return int(self.call("close", ledger_id)["last"])

    def recover(self, ledger_id: int) -> int:
        """Opened by a second client with recovery: the writer fenced, the ledger closed at what recovery found."""
        return int(self.call("recover", ledger_id)["last"])

    def read(self, ledger_id: int, first: int, last: int) -> int:
        return int(self.call("read", ledger_id, first, last)["entries"])

    def delete(self, ledger_id: int) -> None:
        self.call("delete", ledger_id)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                processes.reap(self.proc)


class AutoRecovery:
    """BookKeeper's AutoRecoveryMain: its Auditor (elected in BookKeeper's own election) and a ReplicationWorker."""

    def __init__(self, cluster: RealBookKeeper, name: str, settings: Mapping[str, object]) -> None:
        conf = write_conf(cluster.workdir / f"{name}.conf", {**cluster.bookie_settings(), **settings})
        log = cluster.workdir / f"{name}.log"
        self.process = Process(cluster.command("org.apache.bookkeeper.replication.AutoRecoveryMain", "--conf",
                                               str(conf), log=log), log)

    def stop(self) -> None:
        self.process.stop()


class RealBookKeeper:
    """A cluster of real bookies with its metadata at `home` (which it closes with itself)."""

    def __init__(self, release: Release, home: MetadataHome, workdir: Path | None = None, **settings: object) -> None:
        self.release, self.home, self.root, self.uri, self.tree = release, home, home.root, home.uri, home.tree
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="scrutiny-bk-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.settings = settings  # every process's, over bookie_settings()
        self.bookies: list[RealBookie] = []
        self.recoveries: list[AutoRecovery] = []
        self.clients: list[LedgerClient] = []
        self.conf = write_conf(self.workdir / "cluster.conf", self.bookie_settings())
        self.shell("initnewcluster")

    def command(self, main: str, *args: str, log: Path, level: str = "INFO") -> list[str]:
        """A JVM of the cluster's: the release's jars, with what its metadata's home asks for."""
        return self.release.command(main, *args, log=log, level=level, jvm=self.home.jvm)

    def bookie_settings(self) -> dict[str, object]:
        """What every bookie (and AutoRecovery, the shell) is configured with: small caches, short flush and GC
        intervals, loopback allowed, BookKeeper's own tests' disk thresholds."""
        return {"metadataServiceUri": self.uri, "advertisedAddress": "127.0.0.1", "allowLoopback": "true",
                "zkTimeout": 10000, "httpServerEnabled": "false", "flushInterval": 1000, "gcWaitTime": 1000,
                "diskUsageThreshold": 0.999, "diskUsageWarnThreshold": 0.99, "journalSyncData": "false",
                "dbStorage_writeCacheMaxSizeMb": 4, "dbStorage_readAheadCacheMaxSizeMb": 4,
                "dbStorage_rocksDB_blockCacheSize": 4 * 1024 * 1024, "logSizeLimit": 4 * 1024 * 1024,
                # the direct-I/O entry logger: each of its 8 read threads' reader cache must hold one read buffer,
                # or every reader is evicted as it is made ("Entry logger misconfigured", "Cached reader already
                # closed" on every read): its defaults assume a larger direct memory than these JVMs'
                "dbStorage_directIOEntryLoggerTotalReadBufferSizeMB": 16,
                "dbStorage_directIOEntryLoggerReadBufferSizeMB": 1,
                "dbStorage_directIOEntryLoggerTotalWriteBufferSizeMB": 16,
                "autoRecoveryDaemonEnabled": "false", "lostBookieRecoveryDelay": 0, **self.settings}

    def add_bookie(self, storage: str = DB_LEDGER_STORAGE, start: bool = True, admin: bool = False,
                   **settings: object) -> RealBookie:
        """A bookie (`admin`: with its admin HTTP endpoints, for `force_gc`)."""
        from scrutiny.testing.localzk import free_port

        bookie = RealBookie(self, f"bookie{len(self.bookies) + 1}", free_port(), storage, settings,
                            free_port() if admin else 0)
        self.bookies.append(bookie)
        return bookie.start() if start else bookie

    def lose_ledger(self, ledger_id: int) -> None:
        """The ledger's copies lost on every bookie of its ensembles (`RealBookie.lose_entries`, each in turn)."""
        with store_at(self.uri) as store:
            md = next(iter(store.read_ledgers([ledger_id]))).metadata
        if md is None:
            raise RealBookKeeperError(f"ledger {ledger_id} has no metadata")
        for bookie in self.bookies:
            if bookie.bookie_id in md.bookies:
                bookie.lose_entries(ledger_id)

    def autorecovery(self, percentage: int = 0, **settings: object) -> AutoRecovery:
        recovery = AutoRecovery(self, f"autorecovery{len(self.recoveries) + 1}",
                                {"auditorLedgerVerificationPercentage": percentage, **settings})
        self.recoveries.append(recovery)
        return recovery

    def client(self) -> LedgerClient:
        c = LedgerClient(self, self.workdir / f"client{len(self.clients) + 1}.log")
        self.clients.append(c)
        return c

    def shell(self, *args: str, conf: Path | None = None, answer: str = "", timeout: float = 180.0
              ) -> subprocess.CompletedProcess[str]:
        """`bookkeeper shell ARGS` (`answer`: what an operator types at its prompts, e.g. "Y\n"): its output, or
        RealBookKeeperError with it (the log, WARN and up, is the work directory's shell.log)."""
        log = self.workdir / "shell.log"
        cmd = self.command("org.apache.bookkeeper.bookie.BookieShell", "-conf", str(conf or self.conf), *args,
                           log=log, level="WARN")
        done = processes.run(cmd, input=answer, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RealBookKeeperError(f"bookkeeper shell {' '.join(args)}: exit {done.returncode}: "
                                      f"{(done.stdout + done.stderr)[-2000:]}")
        return done

    def close(self) -> None:
        for c in self.clients:
            c.close()
        for r in self.recoveries:
            r.stop()
        for b in self.bookies:
            if b.process is not None:
                b.process.stop(grace=10)
        self.home.close()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
