"""A private standalone ZooKeeper server from Debian's jars, for the demo and the tests."""

from __future__ import annotations

import contextlib
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Collection
from pathlib import Path
from types import TracebackType
from typing import Self

from scrutiny.testing import processes

JAVA_DIR = Path("/usr/share/java")
CLASSPATH_JARS = ("zookeeper.jar", "slf4j-log4j12.jar", "log4j-1.2.jar")
# The Netty connection factory (needed for TLS) wants these too; zookeeper.jar's manifest omits them.
TLS_JARS = ("netty-codec.jar", "netty-resolver.jar", "netty-transport-native-unix-common.jar")


class LocalZooKeeperError(RuntimeError):
    pass


_PICK = random.SystemRandom()  # never the tests' seeded sequence: two workers would pick alike


def _ephemeral_start() -> int:
    """Where the kernel's range of ports for outgoing connections starts."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port free now, below the kernel's ephemeral range: a server started again on it later (a broker, a
    bookie, ZooKeeper) finds it free, where an ephemeral port may by then be some connection's own end."""
    top = _ephemeral_start()
    for _ in range(200):
        port = _PICK.randrange(10_000, top) if top > 11_000 else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise LocalZooKeeperError("no free port below the ephemeral range")


def free_ports(n: int, besides: Collection[int] = ()) -> list[int]:
    """`n` ports free now, none the same nor among `besides`: each `free_port` is free only when picked, so two
    picks can be one port (an ensemble whose peer had one port for quorum and election would not start)."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port not in ports and port not in besides:
            ports.append(port)
    return ports


def _answers(port: int) -> bool:
    """True when the server answers the `srvr` four-letter word (the port alone can accept early)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.1) as s:
            s.settimeout(0.5)
            s.sendall(b"srvr")
            return s.recv(64).startswith(b"Zookeeper version")
    except OSError:
        return False


class LocalServer:
    """A server process of the tests' own (ZooKeeper, etcd): stopped with SIGTERM (then killed), its
    private data dir removed on close."""

    _proc: subprocess.Popen[bytes] | None = None
    workdir: Path
    _own_workdir: bool

    def start(self, timeout: float = 30.0) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def close(self) -> None:
        self.stop()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class LocalZooKeeper(LocalServer):
    """Start/stop/restart a standalone server on a loopback port with a private data dir."""

    def __init__(self, port: int | None = None, workdir: str | Path | None = None, heap: str = "512m",
                 tls_keystore: str | Path | None = None, tls_truststore: str | Path | None = None) -> None:
        """With `tls_keystore` (PEM: key and certificate) the server also listens with TLS on
        `secure_port`; `tls_truststore` (PEM CA) makes it require client certificates."""
        missing = [j for j in CLASSPATH_JARS if not (JAVA_DIR / j).exists()]
        if missing:
            raise LocalZooKeeperError(
                f"Debian's zookeeper jars are missing from {JAVA_DIR} ({', '.join(missing)}): run `make setup`"
            )
        if shutil.which("java") is None:
            raise LocalZooKeeperError("no `java` on PATH: run `make setup`")
        self.port = port or free_port()
        # A port picked here may be taken by another process before the server binds it (the tests run on
        # several workers): until the server has served once, it starts again on another.
        self._pick_port = port is None and not tls_keystore
        self._log_mark = 0
        self.heap = heap  # about 0.6 KB per znode: a million ledgers want 2g
        self.tls_keystore, self.tls_truststore = tls_keystore, tls_truststore
        self.secure_port = free_port() if tls_keystore else None
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="scrutiny-zk-"))
        self._proc: subprocess.Popen[bytes] | None = None
        self.peers: list[tuple[int, int, int]] = []  # (server id, quorum port, election port): an ensemble
        self.myid = 0

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The server's JVM (what it costs is measured on it)."""
        assert self._proc is not None, "start() it first"
        return self._proc.pid

    def _write_config(self) -> Path:
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        if self.peers:
            (data / "myid").write_text(f"{self.myid}\n")
        cfg = self.workdir / "zoo.cfg"
        cfg.write_text(
            "tickTime=2000\n"
            f"dataDir={data}\n"
            f"clientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\n"
            "admin.enableServer=false\n"
            "maxClientCnxns=0\n"
            "4lw.commands.whitelist=srvr,stat\n"
            # Small session bounds so that expiry tests do not wait long.
            "minSessionTimeout=1000\n"
            "maxSessionTimeout=60000\n"
        )
        if self.peers:
            with cfg.open("a") as f:
                f.write("initLimit=5\nsyncLimit=2\n")
                for sid, quorum, election in self.peers:
                    f.write(f"server.{sid}=127.0.0.1:{quorum}:{election}\n")
        if self.tls_keystore:
            with cfg.open("a") as f:
                f.write(f"secureClientPort={self.secure_port}\n"
                        "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n"
                        f"ssl.keyStore.location={self.tls_keystore}\nssl.keyStore.type=PEM\n")
                if self.tls_truststore:
                    f.write(f"ssl.trustStore.location={self.tls_truststore}\nssl.trustStore.type=PEM\n"
                            "ssl.clientAuth=need\n")
                else:
                    f.write("ssl.clientAuth=none\n")
        log4j = self.workdir / "log4j.properties"
        log4j.write_text(
            "log4j.rootLogger=WARN, FILE\n"
            "log4j.appender.FILE=org.apache.log4j.FileAppender\n"
            f"log4j.appender.FILE.File={self.workdir / 'zookeeper.log'}\n"
            "log4j.appender.FILE.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.FILE.layout.ConversionPattern=%d %p %c{1}: %m%n\n"
        )
        return cfg

    def start(self, timeout: float = 30.0, wait: bool = True) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        for _ in range(3):
            self._spawn()
            if not wait:
                return
            try:
                self.wait_serving(timeout)
            except LocalZooKeeperError:
                if not (self._pick_port and self._lost_its_port()):
                    raise
                self.port = free_port()
                continue
            self._pick_port = False  # clients know this port now: a restart keeps it
            return
        raise LocalZooKeeperError(f"ZooKeeper found no free port to bind; see {self.workdir}/zookeeper.log")

    def _lost_its_port(self) -> bool:
        """Did the server just started fail to bind its port (its log since the start says so)?"""
        log = self.workdir / "zookeeper.log"
        if not log.exists():
            return False
        with log.open("rb") as f:
            f.seek(self._log_mark)
            return b"Address already in use" in f.read()

    def _spawn(self) -> None:
        log = self.workdir / "zookeeper.log"
        self._log_mark = log.stat().st_size if log.exists() else 0
        cfg = self._write_config()
        jars = CLASSPATH_JARS + (TLS_JARS if self.tls_keystore else ())
        cp = ":".join(str(JAVA_DIR / j) for j in jars)
        cmd = [
            "java", f"-Xmx{self.heap}",
            f"-Dzookeeper.log.dir={self.workdir}",
            f"-Dlog4j.configuration=file:{self.workdir / 'log4j.properties'}",
            "-cp", cp, "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(cfg),
        ]
        out = open(self.workdir / "stdout.log", "ab")  # noqa: SIM115 - the child keeps it open
        self._proc = processes.spawn(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()

    def wait_serving(self, timeout: float = 30.0) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise LocalZooKeeperError(
                    f"ZooKeeper exited with status {self._proc.returncode}; see {self.workdir}/stdout.log"
                )
            if _answers(self.port):
                return
            time.sleep(0.05)
        self.stop()
        raise LocalZooKeeperError(f"ZooKeeper did not answer on port {self.port} within {timeout} s")

    def restart(self) -> None:
        self.stop()
        self.start()


def _srvr(port: int) -> dict[str, str]:
    """The server's `srvr` four-letter answer as fields ({} when it does not answer)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.settimeout(1.0)
            s.sendall(b"srvr")
            text = s.recv(4096).decode("ascii", "replace")
    except OSError:
        return {}
    return {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in text.splitlines()) if v}


def mode(port: int) -> str:
    """`leader`, `follower`, `standalone`, or "" when the server does not answer."""
    return _srvr(port).get("Mode", "")


def packets_received(port: int) -> int:
    """The server's own count of the packets (requests and pings) it has received."""
    return int(_srvr(port)["Received"])


class LocalEnsemble:
    """Three (or more) servers on loopback forming one ensemble (kazoo's harness does the same)."""

    def __init__(self, size: int = 3, workdir: str | Path | None = None) -> None:
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="scrutiny-zk-ensemble-"))
        self.members = [LocalZooKeeper(workdir=self.workdir / f"zk{i + 1}", heap="256m") for i in range(size)]
        ports = free_ports(2 * size, besides={m.port for m in self.members})
        peers = [(i + 1, ports[2 * i], ports[2 * i + 1]) for i in range(size)]
        for i, m in enumerate(self.members):
            m.peers, m.myid = peers, i + 1

    @property
    def hosts(self) -> str:
        return ",".join(m.hosts for m in self.members)

    def start(self, timeout: float = 60.0) -> None:
        for m in self.members:
            m.start(wait=False)
        for m in self.members:
            m.wait_serving(timeout)

    def leader(self) -> LocalZooKeeper:
        for m in self.members:
            if m.running and mode(m.port) == "leader":
                return m
        raise LocalZooKeeperError("no member of the ensemble leads")

    def kill(self, member: LocalZooKeeper) -> None:
        """SIGKILL: no goodbye to the followers or the clients."""
        proc, member._proc = member._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        for m in self.members:
            m.close()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def expire_session(hosts: str, session_id: int, password: bytes, timeout: float = 10.0) -> None:
    """Make the server expire a session: a second client attaches to it and closes it (the method
    of kazoo's own test harness)."""
    from kazoo.client import KazooClient

    other = KazooClient(hosts=hosts, client_id=(session_id, password), timeout=timeout)
    other.start(timeout=timeout)
    with contextlib.suppress(Exception):
        other.stop()
    other.close()

