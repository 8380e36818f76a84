"""A private etcd from Debian's `etcd-server` (test tooling, like `localzk`), and the cluster's writer's
view of it: the ZooKeeper-client calls `ClusterWriter` makes, done as Pulsar's etcd store does them (one
key per path, no parent keys made, ephemeral keys on a lease), so every cluster the tests and the demo
write on ZooKeeper can be written on etcd as Pulsar would keep it."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import NamedTuple

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from scrutiny.store.etcdkv import MAX_TXN_OPS, EtcdKV, Session
from scrutiny.testing import processes
from scrutiny.testing.localzk import LocalServer, free_port

ETCD = "/usr/bin/etcd"


class LocalEtcdError(RuntimeError):
    pass


class LocalEtcd(LocalServer):
    """Start/stop a one-member etcd on loopback ports with a private data dir."""

    def __init__(self, workdir: str | Path | None = None, quota_bytes: int = 2 << 30,
                 tls: tuple[Path, Path] | None = None, client_ca: Path | None = None,
                 extra_args: tuple[str, ...] = ()) -> None:
        """`quota_bytes`: etcd's backend quota (its default, 2 GiB, is a few million ledgers' revisions);
        `tls`: (certificate, key) to serve https; `client_ca`: require client certificates from it."""
        if not Path(ETCD).exists():
            raise LocalEtcdError(f"no {ETCD}: Debian's etcd-server is missing; run `make setup`")
        self.port, self.peer_port = free_port(), free_port()
        self.quota_bytes, self.tls, self.client_ca, self.extra_args = quota_bytes, tls, client_ca, extra_args
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="scrutiny-etcd-"))
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def uri(self) -> str:
        """The metadata service URI of a cluster kept here by Pulsar's metadata store."""
        return f"metadata-store:etcd:{self.endpoint}"

    def start(self, timeout: float = 30.0) -> None:
        if self.running:
            return
        peer = f"http://127.0.0.1:{self.peer_port}"
        cmd = [ETCD, "--name", "scrutiny-test", "--data-dir", str(self.workdir / "data"),
               "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
               "--initial-cluster", f"scrutiny-test={peer}", "--log-level", "warn",
               "--quota-backend-bytes", str(self.quota_bytes), *self.extra_args]
        if self.tls:
            cmd += ["--cert-file", str(self.tls[0]), "--key-file", str(self.tls[1])]
        if self.client_ca:
            cmd += ["--client-cert-auth", "--trusted-ca-file", str(self.client_ca)]
        env = dict(os.environ)
        if platform.machine() in ("aarch64", "arm64"):
            env["ETCD_UNSUPPORTED_ARCH"] = "arm64"  # etcd 3.4 runs there only when told to
        out = open(self.workdir / "etcd.log", "ab")  # noqa: SIM115 - the child keeps it open
        self._proc = processes.spawn(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        out.close()
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self._proc.poll() is not None:
                raise LocalEtcdError(f"etcd exited with status {self._proc.returncode}; see {self.workdir}/etcd.log")
            if time.monotonic() > deadline:
                self.stop()
                raise LocalEtcdError(f"etcd did not answer on {self.endpoint} within {timeout} s")
            time.sleep(0.1)

    def _answers(self) -> bool:
        """etcd's /health on its client port; with TLS the port alone (the client retries until served)."""
        try:
            if self.tls:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            else:
                urllib.request.urlopen(f"{self.endpoint}/health", timeout=0.5).read()
            return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    @property
    def pid(self) -> int:
        assert self._proc is not None, "etcd is not running"
        return self._proc.pid


class EtcdTree:
    """The kazoo calls the cluster's writer makes, on etcd. Ephemeral keys go on this tree's own lease,
    as a bookie's registration goes on its metadata store's session."""

    def __init__(self, endpoint: str, lease_ttl: int = 10) -> None:
        self.kv = EtcdKV([endpoint], timeout=10.0, retry_deadline=30.0)
        self._lease_ttl = lease_ttl
        self._session: Session | None = None

    @property
    def session(self) -> Session:
        if self._session is None:
            self._session = Session(self.kv, self._lease_ttl)
        return self._session

    def exists(self, path: str) -> bool:
        return self.kv.get(path.encode()) is not None

    def get(self, path: str) -> tuple[bytes, ZnodeStat]:
        """The value, and kazoo's stat's version (etcd counts a key's writes from 1, ZooKeeper from 0)."""
        got = self.kv.get(path.encode())
        if got is None:
            raise NoNodeError(path)
        return got.value, ZnodeStat(got.version - 1)

    def get_children(self, path: str) -> list[str]:
        """The names one level below `path` (etcd has no parents: every key below it counts)."""
        prefix = path.rstrip("/").encode() + b"/"
        names = {kv.key[len(prefix):].split(b"/", 1)[0].decode() for kv in self.kv.scan_prefix(prefix, keys_only=True)}
        if not names and not self.exists(path):
            raise NoNodeError(path)
        return sorted(names)

    def create(self, path: str, value: bytes = b"", makepath: bool = False, ephemeral: bool = False) -> str:
        if not self.kv.create(path.encode(), value, lease=self.session.lease if ephemeral else 0):
            raise NodeExistsError(path)
        return path

    def ensure_path(self, path: str) -> None:
        self.kv.create(path.encode(), b"")  # the key alone: etcd has no parents to make

    def set(self, path: str, value: bytes, version: int = -1) -> None:
        if version < 0:
            self.kv.put(path.encode(), value)
        elif not self.kv.at_version(path.encode(), version + 1, value):
            raise BadVersionError(path)

    def delete(self, path: str, version: int = -1) -> None:
        if version >= 0:
            if not self.kv.at_version(path.encode(), version + 1, None):
                raise BadVersionError(path) if self.exists(path) else NoNodeError(path)
        elif not self.kv.delete(path.encode()):
            raise NoNodeError(path)

    def transaction(self) -> _Transaction:
        return _Transaction(self.kv)

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
        self.kv.close()


class ZnodeStat(NamedTuple):
    """What the tests' writers read of kazoo's stat (etcd keeps no creation time)."""

    version: int
    ctime: int = -1


class _Transaction:
    """kazoo's transaction of creates, as Txns of at most etcd's op limit (each all or nothing)."""

    def __init__(self, kv: EtcdKV) -> None:
        self.kv = kv
        self.items: list[tuple[bytes, bytes]] = []

    def create(self, path: str, value: bytes = b"") -> None:
        self.items.append((path.encode(), value))

    def commit_async(self) -> _Done:
        results: list[object] = []
        for i in range(0, len(self.items), MAX_TXN_OPS):
            chunk = self.items[i:i + MAX_TXN_OPS]
            ok = self.kv.put_many(chunk, only_new=True)
            results += [True] * len(chunk) if ok else [NodeExistsError(chunk[0][0].decode())] * len(chunk)
        return _Done(results)


class _Done:
    def __init__(self, results: list[object]) -> None:
        self.results = results

    def get(self) -> list[object]:
        return self.results
