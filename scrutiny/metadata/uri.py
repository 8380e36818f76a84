"""Where the metadata is: BookKeeper's metadataServiceUri (`zk+hierarchical://host:2181;.../ledgers`) and
Pulsar's metadata store (PIP-45: `metadata-store:zk:...`, `metadata-store:etcd:...`), and the one HOST:PORT
parser."""

from __future__ import annotations

import re
from dataclasses import dataclass

from scrutiny.errors import MetadataError
from scrutiny.metadata.paths import DEFAULT_ROOT, Layout


@dataclass(frozen=True, slots=True)
class MetadataServiceUri:
    servers: tuple[str, ...]  # host:port for ZooKeeper; http(s)://host:port endpoints for etcd
    root: str
    layout: Layout | None  # None: read it from the LAYOUT znode
    store: str = "zk"  # zk | etcd (Pulsar's metadata-store:etcd:)

    @property
    def hosts(self) -> str:
        return ",".join(self.servers)

    @property
    def racks_path(self) -> str:
        """Pulsar's rack znode sits beside the ledgers root (`/bookies` for `/ledgers`)."""
        return f"{self.root.rsplit('/', 1)[0]}/bookies"

    @property
    def managed_ledgers_path(self) -> str:
        """Pulsar's managed ledgers (topics) sit beside the ledgers root too."""
        return f"{self.root.rsplit('/', 1)[0]}/managed-ledgers"

    @property
    def schemas_path(self) -> str:
        """Pulsar's schema locators, beside the managed ledgers."""
        return f"{self.root.rsplit('/', 1)[0]}/schemas"

    @property
    def scrutiny_path(self) -> str:
        """scrutiny's own znodes (agents, auditor election, cadence), beside the ledgers root."""
        return f"{self.root.rsplit('/', 1)[0]}/scrutiny"


def parse_host_port(text: str, what: str, error: type[Exception] = MetadataError) -> tuple[str, int]:
    """The one HOST:PORT parser (bookie ids, agent and auditor addresses, ZooKeeper servers)."""
    host, _, port = text.strip().rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise error(f"{what}: {text!r} is not HOST:PORT")
    return host, int(port)


_URI = re.compile(r"^zk(?:\+(?P<type>[a-z]+))?://(?P<servers>[^/]+)(?P<root>/.*)?$")


# Pulsar's metadata-store driver (PIP-45) on ZooKeeper: `metadata-store:zk:host:port[,...][/chroot][?params]`.
# The ledgers are always at /ledgers under the chroot, in the hybrid hierarchical layout.
_PULSAR_ZK = re.compile(r"^metadata-store:zk:(?P<servers>[^/?]+)(?P<chroot>/[^?]*)?(?:\?.*)?$")
PULSAR_STORE_PREFIX = "metadata-store:"


def store_scheme(uri: str) -> str:
    """The store a metadata service URI names, as the stores' registry keys it: `zk` (BookKeeper's
    `zk+<layout>://`), `metadata-store:<store>` (Pulsar's, PIP-45), else whatever precedes `://`."""
    text = uri.strip()
    if text.startswith(PULSAR_STORE_PREFIX):
        return PULSAR_STORE_PREFIX + text[len(PULSAR_STORE_PREFIX):].split(":", 1)[0]
    return text.split("://", 1)[0].split("+", 1)[0]


def parse_metadata_service_uri(uri: str) -> MetadataServiceUri:
    scheme = store_scheme(uri)
    if scheme.startswith(PULSAR_STORE_PREFIX):
        return _parse_pulsar_store_uri(uri.strip(), scheme.removeprefix(PULSAR_STORE_PREFIX))
    m = _URI.match(uri.strip())
    if not m:
        raise MetadataError(f"metadata service URI {uri!r} is not of the form zk+<layout>://host:port;.../root "
                            "or metadata-store:zk:host:port,.../chroot")
    kind = m.group("type")
    layouts = {"flat": Layout.FLAT, "hierarchical": Layout.HIERARCHICAL,
               "longhierarchical": Layout.LONG_HIERARCHICAL, "null": None, None: None}
    if kind not in layouts:
        raise MetadataError(f"metadata service URI {uri!r}: unknown layout {kind!r}")
    servers = tuple(s for s in re.split(r"[;,]", m.group("servers")) if s)
    for s in servers:
        parse_host_port(s, f"metadata service URI {uri!r}", MetadataError)
    root = (m.group("root") or DEFAULT_ROOT).rstrip("/") or DEFAULT_ROOT
    return MetadataServiceUri(servers, root, layouts[kind])


def _parse_pulsar_store_uri(uri: str, store: str) -> MetadataServiceUri:
    if store == "etcd":
        return _parse_pulsar_etcd_uri(uri)
    m = _PULSAR_ZK.match(uri)
    if not m:
        if store != "zk":
            raise MetadataError(f"metadata service URI {uri!r}: Pulsar's metadata store on {store!r} is not "
                                "supported by this version (metadata-store:zk: and metadata-store:etcd: are)")
        raise MetadataError(f"metadata service URI {uri!r} is not of the form metadata-store:zk:host:port,.../chroot")
    servers = tuple(s for s in re.split(r"[;,]", m.group("servers")) if s)
    for s in servers:
        parse_host_port(s, f"metadata service URI {uri!r}", MetadataError)
    chroot = (m.group("chroot") or "").rstrip("/")
    return MetadataServiceUri(servers, f"{chroot}{DEFAULT_ROOT}", Layout.HIERARCHICAL)


def _parse_pulsar_etcd_uri(uri: str) -> MetadataServiceUri:
    """`metadata-store:etcd:http://host:2379[,https://host:2379...]` (jetcd's endpoints; a bare host:port is
    http). Pulsar's etcd store has no chroot: the ledgers are at /ledgers."""
    endpoints = []
    # `;` too: Pulsar's driver turns it into `,` for every store, and BookKeeper's metadataServiceUri needs it
    for e in (e.strip() for e in re.split(r"[;,]", uri[len(PULSAR_STORE_PREFIX) + len("etcd:"):])):
        scheme, sep, rest = e.partition("://")
        if not sep:
            scheme, rest = "http", e
        host_port = rest.rstrip("/")
        if scheme not in ("http", "https") or "/" in host_port:
            raise MetadataError(f"metadata service URI {uri!r}: etcd endpoint {e!r} is not http(s)://host:port")
        parse_host_port(host_port, f"metadata service URI {uri!r}", MetadataError)
        endpoints.append(f"{scheme}://{host_port}")
    return MetadataServiceUri(tuple(endpoints), DEFAULT_ROOT, Layout.HIERARCHICAL, store="etcd")

