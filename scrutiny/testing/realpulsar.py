"""A real Pulsar broker for the tests, from a release's own jars (`make peers` fetches them into .peers/), on a real
BookKeeper cluster of the tests (`RealBookKeeper`): its metadata in the same store, beside BookKeeper's root (on
ZooKeeper `<root's parent>/managed-ledgers`, `/schemas`, `/admin`), as a production broker keeps it; its clients the
Python `pulsar-client` wheel. Started, stopped, killed and started again; its admin REST API for what a test sets and
for what the broker itself says (`stats-internal`)."""

from __future__ import annotations

import json
import logging
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pulsar
from pulsar.schema import Record, String

from scrutiny.testing.localzk import free_port
from scrutiny.testing.realbookkeeper import Process, RealBookKeeper, RealBookKeeperError, Release, write_conf

# bin/pulsar's, besides BookKeeper's
JVM_FLAGS = ("--add-opens", "java.base/sun.net=ALL-UNNAMED",
             "--add-opens", "java.management/sun.management=ALL-UNNAMED",
             "--add-opens", "jdk.management/com.sun.management.internal=ALL-UNNAMED")
CLUSTER = "scrutiny"
STARTUP_SECONDS = 120.0
SESSION_EXPIRY_SECONDS = 90.0  # the broker's ZooKeeper session: metadataStoreSessionTimeoutMillis, 30 s, and a margin
# Pulsar's codecs, by the names of the broker's settings, as the client names them
CODECS = {"NONE": pulsar.CompressionType.NONE, "LZ4": pulsar.CompressionType.LZ4,
          "ZLIB": pulsar.CompressionType.ZLib, "ZSTD": pulsar.CompressionType.ZSTD,
          "SNAPPY": pulsar.CompressionType.SNAPPY}


class Order(Record):
    """The tests' message with a schema (JSON): its topic gets a schema ledger."""

    item = String()


def records_in(codec: str) -> dict[str, object]:
    """The broker's settings for writing every managed-ledger and cursor record compressed with `codec`."""
    return {"managedLedgerInfoCompressionType": codec, "managedLedgerInfoCompressionThresholdInBytes": 0,
            "managedCursorInfoCompressionType": codec, "managedCursorInfoCompressionThresholdInBytes": 0}


class RealPulsar:
    """One broker of cluster `scrutiny` on `bookkeeper`'s bookies: ledgers of a few entries, rolled over at once,
    kept (infinite retention), deduplication off unless a namespace turns it on, a deduplication snapshot every few
    entries, cursors' positions persisted as they move; `settings` over those."""

    def __init__(self, release: Release, bookkeeper: RealBookKeeper, **settings: object) -> None:
        self.release, self.bookkeeper = release, bookkeeper
        self.workdir = bookkeeper.workdir
        self.chroot, self.metadata_url = bookkeeper.home.pulsar_root, bookkeeper.home.pulsar_store
        self.web_port, self.port = free_port(), free_port()
        self.web = f"http://127.0.0.1:{self.web_port}"
        self.url = f"pulsar://127.0.0.1:{self.port}"
        self.settings: dict[str, object] = {
            "clusterName": CLUSTER, "metadataStoreUrl": self.metadata_url,
            "configurationMetadataStoreUrl": self.metadata_url, "bookkeeperMetadataServiceUri": bookkeeper.uri,
            "brokerServicePort": self.port, "webServicePort": self.web_port, "advertisedAddress": "127.0.0.1",
            "bindAddress": "127.0.0.1", "managedLedgerDefaultEnsembleSize": 2, "managedLedgerDefaultWriteQuorum": 2,
            "managedLedgerDefaultAckQuorum": 2, "managedLedgerMaxEntriesPerLedger": 5,
            "managedLedgerMinLedgerRolloverTimeMinutes": 0, "defaultRetentionTimeInMinutes": -1,
            "defaultRetentionSizeInMB": -1, "brokerDeduplicationEntriesInterval": 5,
            "brokerDeleteInactiveTopicsEnabled": "false", "functionsWorkerEnabled": "false",
            "webSocketServiceEnabled": "false", "systemTopicEnabled": "false", "topicLevelPoliciesEnabled": "false",
            "brokerShutdownTimeoutMs": 5000, "allowAutoTopicCreationType": "non-partitioned",
            # every cursor's position persisted at once (by default at most once a second, the rest flushed within
            # managedLedgerCursorPositionFlushSeconds, 60): a compaction's ledger named durably when it is done
            "managedLedgerDefaultMarkDeleteRateLimit": 0,
            # Pulsar 3.0's load balancer refuses to start where it cannot read the NIC's speed (as here)
            "loadBalancerOverrideBrokerNicSpeedGbps": 1, **settings}
        self.conf = self.workdir / "broker.conf"
        self.process: Process | None = None
        self._killed = False
        self._setup()
        self.start()

    def _java(self, main: str, *args: str, log: Path, heap: str = "256m") -> list[str]:
        return self.release.command(main, *args, log=log, heap=heap, jvm=JVM_FLAGS + self.bookkeeper.home.jvm)

    def _setup(self) -> None:
        """`pulsar initialize-cluster-metadata` on the existing BookKeeper cluster."""
        cmd = self._java("org.apache.pulsar.PulsarClusterMetadataSetup", "--cluster", CLUSTER,
                         "--metadata-store", self.metadata_url, "--configuration-metadata-store", self.metadata_url,
                         "--existing-bk-metadata-service-uri", self.bookkeeper.uri, "--web-service-url", self.web,
                         "--broker-service-url", self.url, log=self.workdir / "pulsar-setup.log")
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            raise RealBookKeeperError(f"initialize-cluster-metadata: exit {done.returncode}: "
                                      f"{(done.stdout + done.stderr)[-2000:]}")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.running

    def start(self, **settings: object) -> RealPulsar:
        """Started with `settings` over the broker's, and serving (its health check answers) within two minutes.
        After `kill`, once the killed broker's metadata session has expired (its registration gone): Pulsar 3.0.7
        started at the same address before then answers every admin call about a bundle the dead session still
        owns with a redirect to itself, until it expires (pulsar-admin gives up after five)."""
        self.settings.update(settings)
        self._wait_for_the_killed_session()
        write_conf(self.conf, self.settings)
        log = self.workdir / "broker.log"
        self.process = Process(self._java("org.apache.pulsar.PulsarBrokerStarter", "-c", str(self.conf), log=log,
                                          heap="384m"), log)
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            try:
                if self.admin("GET", "/admin/v2/brokers/health") == "ok":
                    return self
            except (OSError, RealBookKeeperError):
                pass
            if not self.process.running or time.monotonic() > deadline:
                raise RealBookKeeperError(f"the broker did not start: {self.process.tail()}")
            time.sleep(0.3)

    def stop(self) -> None:
        """SIGTERM: the broker closes its topics (their heads, their cursors: positions inline in the records)."""
        if self.process is not None:
            self.process.stop(grace=60)

    def kill(self) -> None:
        """SIGKILL: what the broker was doing stops where it was."""
        if self.process is not None:
            self.process.kill()
            self._killed = True

    def _wait_for_the_killed_session(self) -> None:
        if not self._killed:
            return
        registration = f"{self.chroot}/loadbalance/brokers/127.0.0.1:{self.web_port}"  # ephemeral: its session's
        deadline = time.monotonic() + SESSION_EXPIRY_SECONDS
        while self.bookkeeper.tree.exists(registration):
            if time.monotonic() > deadline:
                raise RealBookKeeperError(f"the killed broker's registration {registration} outlived its session")
            time.sleep(0.5)
        self._killed = False

    def admin(self, method: str, path: str, body: object = None, timeout: float = 60.0) -> Any:
        """The admin REST API (what `pulsar-admin` calls): the answer's JSON, its text, or None."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.web + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with _ADMIN.open(req, timeout=timeout) as got:
                text = got.read().decode()
        except urllib.error.HTTPError as exc:
            where = f" (to {exc.headers['Location']})" if exc.headers.get("Location") else ""
            raise RealBookKeeperError(f"{method} {path}: {exc.code}{where} {exc.read().decode()[:500]}") from None
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return text

    def stats_internal(self, topic: str) -> dict[str, Any]:
        """`pulsar-admin topics stats-internal`: the broker's own view of the topic's ledgers and cursors."""
        stats: dict[str, Any] = self.admin("GET", f"/admin/v2/{_rest(topic)}/internalStats")
        return stats

    def unload(self, topic: str) -> None:
        """`pulsar-admin topics unload`: the topic closed (its head, its cursors) and loaded again when next used."""
        self.admin("PUT", f"/admin/v2/{_rest(topic)}/unload")

    def tenant(self, name: str) -> str:
        """A tenant of the cluster (`pulsar-admin tenants create`): `public` is there from the start."""
        self.admin("PUT", f"/admin/v2/tenants/{name}", {"adminRoles": [], "allowedClusters": [CLUSTER]})
        return name

    def namespace(self, name: str, tenant: str = "public", **policies: object) -> str:
        """A namespace of the tenant, with policies (each `PUT/POST /admin/v2/namespaces/<ns>/<policy>`)."""
        ns = f"{tenant}/{name}"
        self.admin("PUT", f"/admin/v2/namespaces/{ns}", {"replication_clusters": [CLUSTER]})
        for policy, value in policies.items():
            self.admin("POST", f"/admin/v2/namespaces/{ns}/{policy}", value)
        return ns

    def transactions(self, command: str, *args: object) -> dict[str, Any]:
        """Pulsar's own Java client writing or acknowledging in transactions (the Python client has none):
        `tests/peers/pulsar/src/scrutiny/peers/TransactionTool.java`'s command on this broker, and its answer."""
        cmd = self._java("scrutiny.peers.TransactionTool", command, self.url, *map(str, args),
                         log=self.workdir / "transactions.log")
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            raise RealBookKeeperError(f"transactions {command}: exit {done.returncode}: "
                                      f"{(done.stdout + done.stderr)[-2000:]}")
        answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return answer

    def client(self) -> pulsar.Client:
        """A client of the Python `pulsar-client` wheel, logging warnings only."""
        quiet = logging.getLogger("pulsar-client")
        quiet.setLevel(logging.WARNING)
        return pulsar.Client(self.url, logger=quiet, operation_timeout_seconds=60)

    def close(self) -> None:
        if self.process is not None:
            self.process.stop(grace=10)


class _SameRequestRedirect(urllib.request.HTTPRedirectHandler):
    """A 307 or 308 followed with its method and body, as `pulsar-admin` follows them: a broker that does not own
    a topic's bundle sends its admin calls (a DELETE, say) to the one that does; urllib follows only a GET's."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> urllib.request.Request | None:
        if code in (307, 308):
            return urllib.request.Request(newurl, data=req.data, method=req.get_method(),
                                          headers=dict(req.header_items()))
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_ADMIN = urllib.request.build_opener(_SameRequestRedirect)


def _rest(topic: str) -> str:
    """persistent://tenant/ns/local → persistent/tenant/ns/<local, URL-encoded>."""
    domain, rest = topic.split("://", 1)
    tenant, ns, local = rest.split("/", 2)
    return f"{domain}/{tenant}/{ns}/{urllib.parse.quote(local, safe='')}"


def topic_ledgers(stats: Mapping[str, Any]) -> dict[int, tuple[str, str]]:
    """Every ledger `stats-internal` names, with what for: ("topic", ""), ("cursor", <name>), ("schema", ""),
    ("compacted", "")."""
    out: dict[int, tuple[str, str]] = {int(li["ledgerId"]): ("topic", "") for li in stats.get("ledgers", [])}
    for name, cursor in stats.get("cursors", {}).items():
        if int(cursor.get("cursorLedger", -1)) >= 0:
            out[int(cursor["cursorLedger"])] = ("cursor", name)
    for li in stats.get("schemaLedgers", []):
        out[int(li["ledgerId"])] = ("schema", "")
    compacted = int(stats.get("compactedLedger", {}).get("ledgerId", -1))
    if compacted >= 0:
        out[compacted] = ("compacted", "")
    return out
