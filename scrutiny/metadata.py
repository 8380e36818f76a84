"""BookKeeper's metadata as it is stored in ZooKeeper: pure parsing and formatting, no I/O.

Everything here turns znode bytes into immutable snapshots (or back, for the cluster writer), and
raises MetadataError with a message that names the znode or ledger when the bytes are wrong.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar, dataclass_transform

from google.protobuf import text_format
from google.protobuf.internal import decoder as pb_decoder
from google.protobuf.internal import encoder as pb_encoder
from google.protobuf.message import DecodeError

from scrutiny.bookkeeper import bookie_service_info_pb2, ledger_metadata_pb2
from scrutiny.errors import DataError

DEFAULT_ROOT = "/ledgers"
DEFAULT_RACK = "/default-rack"
DEFAULT_ZONE_LOCATION = "/default-zone/default-upgradedomain"
DEFAULT_REGION_LOCATION = "/default-region/default-rack"
MAX_ENSEMBLE_SIZE = 1024
SHORT_PATH_LIMIT = 2147483647  # ids from here on take the long (3-4-4-4-4) hierarchical path
HEADER_PREFIX = b"BookieMetadataFormatVersion\t"
NON_LEDGER_CHILDREN = frozenset(
    {"available", "cookies", "LAYOUT", "INSTANCEID", "underreplication", "idgen", "idgen-long"}
)
IN_RECOVERY_V1 = -102

_LMF = ledger_metadata_pb2.LedgerMetadataFormat


class MetadataError(DataError):
    """Metadata that cannot be decoded or is inconsistent."""


class LedgerState(enum.IntEnum):
    OPEN = 1
    IN_RECOVERY = 2
    CLOSED = 3


class Layout(enum.StrEnum):
    FLAT = "flat"
    HIERARCHICAL = "hierarchical"
    LONG_HIERARCHICAL = "longhierarchical"


class Segment(NamedTuple):
    """From this entry on, the ledger's entries are written to this ensemble."""

    first_entry_id: int
    ensemble: tuple[str, ...]


_T = TypeVar("_T")


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def snapshot(cls: type[_T]) -> type[_T]:
    """A dataclass the type checker treats as frozen (an assignment to a field fails `make lint`) and
    that is a plain slotted one at run time: a frozen dataclass sets each field through
    object.__setattr__, which cost 5 of a scan's ~100 us per ledger for LedgerMetadata's 18 fields."""
    return dataclass(slots=True, unsafe_hash=True)(cls)


@snapshot
class LedgerMetadata:
    ledger_id: int
    state: LedgerState
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    last_entry_id: int
    length: int
    segments: tuple[Segment, ...]
    ctime: int = -1
    custom_metadata: tuple[tuple[str, bytes], ...] = ()
    digest_type: str = "CRC32C"
    password: bytes = b""
    ctoken: int = 0
    format_version: int = 3
    znode_version: int = -1
    modified_ms: int = -1  # the znode's mtime: for a closed ledger, about when it was closed (-1: unknown, etcd)
    # Derived once: every check asks for them, several times per ledger.
    bookies: frozenset[str] = field(init=False, repr=False, compare=False)
    _ranges: tuple[tuple[Segment, int, int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        segments = self.segments
        if len(segments) == 1:  # most ledgers
            seg = segments[0]
            object.__setattr__(self, "bookies", frozenset(seg.ensemble))
            object.__setattr__(self, "_ranges", ((seg, seg.first_entry_id, self.last_entry_id),)
                               if seg.first_entry_id <= self.last_entry_id else ())
            return
        object.__setattr__(self, "bookies", frozenset(b for s in segments for b in s.ensemble))
        ranges = []
        for i, seg in enumerate(self.segments):
            end = self.segments[i + 1].first_entry_id - 1 if i + 1 < len(self.segments) else self.last_entry_id
            end = min(end, self.last_entry_id)
            if seg.first_entry_id <= end:
                ranges.append((seg, seg.first_entry_id, end))
        object.__setattr__(self, "_ranges", tuple(ranges))

    @property
    def closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    def segment_ranges(self) -> tuple[tuple[Segment, int, int], ...]:
        """(segment, first, last) for every non-empty segment of a closed ledger, per the spec:
        segment i covers [first_i, first_{i+1} - 1], the last one [first_last, lastEntryId]."""
        return self._ranges


def inconsistencies(md: LedgerMetadata) -> list[str]:
    """What makes a decoded ledger's metadata impossible to check (empty when it is sound)."""
    e, wq, aq = md.ensemble_size, md.write_quorum, md.ack_quorum
    segments = md.segments
    if (len(segments) == 1 and 1 <= wq <= e <= MAX_ENSEMBLE_SIZE and 1 <= aq <= wq and segments[0].first_entry_id == 0
            and len(segments[0].ensemble) == e == len(md.bookies) and all(segments[0].ensemble)
            and md.last_entry_id >= -1):
        return []  # most ledgers: one sound segment, every rule below at once
    problems = []
    if e < 1 or e > MAX_ENSEMBLE_SIZE:
        problems.append(f"ensemble size {e} outside 1..{MAX_ENSEMBLE_SIZE}")
    if wq < 1 or wq > e:
        problems.append(f"write quorum {wq} outside 1..ensemble size {e}")
    if aq < 1 or aq > wq:
        problems.append(f"ack quorum {aq} outside 1..write quorum {wq}")
    if not md.segments:
        problems.append("no segment (ensemble) at all")
    elif md.segments[0].first_entry_id != 0:
        problems.append(f"first segment starts at entry {md.segments[0].first_entry_id}, not 0")
    previous = 0
    for seg in md.segments:
        if seg.first_entry_id < previous:
            problems.append(f"segment at entry {seg.first_entry_id} is out of order")
        previous = seg.first_entry_id
        if len(seg.ensemble) != e:
            problems.append(
                f"segment at entry {seg.first_entry_id} has {len(seg.ensemble)} bookies, ensemble size is {e}"
            )
        if len(set(seg.ensemble)) != len(seg.ensemble):
            problems.append(f"segment at entry {seg.first_entry_id} names a bookie twice")
        if any(not b for b in seg.ensemble):
            problems.append(f"segment at entry {seg.first_entry_id} has an empty bookie id")
    if md.last_entry_id < -1:
        problems.append(f"lastEntryId {md.last_entry_id} is below -1")
    return problems


# ---------------------------------------------------------------------------------------------
# Ledger metadata znode payloads (formats v1, v2, v3)


def _split_header(ledger_id: int, data: bytes) -> tuple[int, int]:
    """The format version and the offset of the body."""
    if not data:
        raise MetadataError(f"ledger {ledger_id}: empty metadata znode")
    if not data.startswith(HEADER_PREFIX):
        raise MetadataError(f"ledger {ledger_id}: metadata does not start with 'BookieMetadataFormatVersion'")
    nl = data.find(b"\n", len(HEADER_PREFIX), len(HEADER_PREFIX) + 12)
    if nl < 0:
        raise MetadataError(f"ledger {ledger_id}: metadata version line is not terminated within 10 digits")
    digits = data[len(HEADER_PREFIX):nl]
    if not digits or len(digits) > 10 or not digits.isdigit():
        raise MetadataError(f"ledger {ledger_id}: metadata version {digits[:16]!r} is not a number of 1-10 digits")
    return int(digits), nl + 1


def decode_ledger_metadata(
    ledger_id: int, data: bytes, znode_ctime: int = -1, znode_version: int = -1, *, check: bool = True,
    znode_mtime: int = -1,
) -> LedgerMetadata:
    """Decode a ledger metadata znode. With `check`, inconsistent metadata is refused too."""
    version, offset = _split_header(ledger_id, data)
    body = data[offset:]
    if version == 1:
        md = _decode_v1(ledger_id, body, znode_ctime, znode_version, znode_mtime)
    elif version in (2, 3):
        msg = _LMF()
        try:
            if version == 3:
                length, pos = pb_decoder._DecodeVarint32(body, 0)  # type: ignore[attr-defined]
                if length > len(body) - pos:
                    raise MetadataError(
                        f"ledger {ledger_id}: v3 metadata says {length} bytes but {len(body) - pos} follow"
                    )
                msg.ParseFromString(body[pos:pos + length])
            else:
                text_format.Parse(body.decode("utf-8"), msg, allow_unknown_field=True)
        except MetadataError:
            raise
        except (DecodeError, text_format.ParseError, UnicodeDecodeError, IndexError, ValueError) as exc:
            raise MetadataError(f"ledger {ledger_id}: undecodable v{version} metadata: {exc}") from None
        md = _from_proto(ledger_id, msg, version, znode_ctime, znode_version, znode_mtime)
    else:
        raise MetadataError(f"ledger {ledger_id}: unsupported metadata format version {version} (known: 1, 2, 3)")
    if check:
        problems = inconsistencies(md)
        if problems:
            raise MetadataError(f"ledger {ledger_id}: inconsistent metadata: {'; '.join(problems)}")
    return md


_STATES = {int(s): s for s in LedgerState}
_DIGEST_TYPES = {number: name for name, number in _LMF.DigestType.items()}


def _from_proto(ledger_id: int, msg: Any, version: int, znode_ctime: int, znode_version: int,
                znode_mtime: int) -> LedgerMetadata:
    # Every ledger of a scan comes through here: each field read once, HasField only where a present
    # zero and an absent field mean different things, and the constructor called positionally.
    wq, e = msg.quorumSize, msg.ensembleSize
    if not (wq and e):
        for name in ("quorumSize", "ensembleSize"):
            if not msg.HasField(name):
                raise MetadataError(f"ledger {ledger_id}: v{version} metadata lacks {name}")
    state = _STATES.get(msg.state)
    if state is None:
        raise MetadataError(f"ledger {ledger_id}: unknown ledger state {msg.state}")
    aq, last, ctime = msg.ackQuorumSize, msg.lastEntryId, msg.ctime
    if not aq and not msg.HasField("ackQuorumSize"):
        aq = wq
    if not last and not msg.HasField("lastEntryId"):
        last = -1
    if not ctime and not msg.HasField("ctime"):
        ctime = znode_ctime
    segs = msg.segment
    if len(segs) == 1:
        s = segs[0]
        segments: tuple[Segment, ...] = (Segment(s.firstEntryId, tuple(s.ensembleMember)),)
    else:
        segments = tuple([Segment(s.firstEntryId, tuple(s.ensembleMember)) for s in segs])
    custom = msg.customMetadata
    return LedgerMetadata(  # the fields in their order (an unknown digest type reads as CRC32, its default)
        ledger_id, state, e, wq, aq, last, msg.length, segments, ctime,
        tuple([(c.key, bytes(c.value)) for c in custom]) if custom else (),
        _DIGEST_TYPES.get(msg.digestType, "CRC32"), msg.password, msg.cToken, version, znode_version, znode_mtime)


def _decode_v1(ledger_id: int, body: bytes, znode_ctime: int, znode_version: int, znode_mtime: int
               ) -> LedgerMetadata:
    try:
        lines = body.decode("ascii").split("\n")
    except UnicodeDecodeError:
        raise MetadataError(f"ledger {ledger_id}: v1 metadata is not ASCII text") from None
    lines = [ln for ln in lines if ln != ""]
    if len(lines) < 3:
        raise MetadataError(f"ledger {ledger_id}: v1 metadata needs quorumSize, ensembleSize and length lines")
    try:
        wq, e, length = int(lines[0]), int(lines[1]), int(lines[2])
        state, last = LedgerState.OPEN, -1
        segments = []
        for ln in lines[3:]:
            fields = ln.split("\t")
            if len(fields) == 2 and fields[1] == "CLOSED":
                last = int(fields[0])
                state = LedgerState.IN_RECOVERY if last == IN_RECOVERY_V1 else LedgerState.CLOSED
                if state is LedgerState.IN_RECOVERY:
                    last = -1
            else:
                segments.append(Segment(int(fields[0]), tuple(fields[1:])))
    except ValueError as exc:
        raise MetadataError(f"ledger {ledger_id}: malformed v1 metadata: {exc}") from None
    return LedgerMetadata(ledger_id, state, e, wq, wq, last, length, tuple(segments), znode_ctime,
                          format_version=1, znode_version=znode_version, digest_type="CRC32",
                          modified_ms=znode_mtime)


def encode_ledger_metadata(md: LedgerMetadata, version: int = 3) -> bytes:
    """The znode payload BookKeeper would write for `md` in format `version`."""
    header = HEADER_PREFIX + str(version).encode() + b"\n"
    if version == 1:
        lines = [str(md.write_quorum), str(md.ensemble_size), str(md.length)]
        lines += ["\t".join([str(s.first_entry_id), *s.ensemble]) for s in md.segments]
        if md.state is LedgerState.CLOSED:
            lines.append(f"{md.last_entry_id}\tCLOSED")
        elif md.state is LedgerState.IN_RECOVERY:
            lines.append(f"{IN_RECOVERY_V1}\tCLOSED")
        return header + ("\n".join(lines) + "\n").encode("ascii")
    msg = _LMF(
        quorumSize=md.write_quorum,
        ensembleSize=md.ensemble_size,
        length=md.length,
        lastEntryId=md.last_entry_id,
        state=md.state.name,
        digestType=md.digest_type,
        password=md.password,
        ackQuorumSize=md.ack_quorum,
        ctime=md.ctime,
    )
    for seg in md.segments:
        msg.segment.add(ensembleMember=list(seg.ensemble), firstEntryId=seg.first_entry_id)
    for key, value in md.custom_metadata:
        msg.customMetadata.add(key=key, value=value)
    if version == 2:
        return header + text_format.MessageToString(msg).encode("utf-8")
    if version != 3:
        raise ValueError(f"unknown metadata format version {version}")
    msg.cToken = md.ctoken
    body = msg.SerializeToString()
    return header + pb_encoder._VarintBytes(len(body)) + body  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------
# Paths and layouts


def ledger_path(layout: Layout, root: str, ledger_id: int) -> str:
    if ledger_id < 0:
        raise ValueError(f"negative ledger id {ledger_id}")
    if layout is Layout.FLAT:
        return f"{root}/L{ledger_id:010d}"
    if layout is Layout.HIERARCHICAL and ledger_id < SHORT_PATH_LIMIT:
        s = f"{ledger_id:010d}"
        return f"{root}/{s[0:2]}/{s[2:6]}/L{s[6:10]}"
    s = f"{ledger_id:019d}"
    return f"{root}/{s[0:3]}/{s[3:7]}/{s[7:11]}/{s[11:15]}/L{s[15:19]}"


def is_ledger_child(name: str) -> bool:
    """Children of the root that can be ledgers or ledger buckets."""
    return name not in NON_LEDGER_CHILDREN and not name.startswith("ID-")


_LAYOUT_CLASSES = {
    "HierarchicalLedgerManagerFactory": Layout.HIERARCHICAL,
    "LegacyHierarchicalLedgerManagerFactory": Layout.HIERARCHICAL,
    "LongHierarchicalLedgerManagerFactory": Layout.LONG_HIERARCHICAL,
    "FlatLedgerManagerFactory": Layout.FLAT,
    "PulsarLedgerManagerFactory": Layout.HIERARCHICAL,  # Pulsar's metadata-store driver: the same hybrid tree
}


def parse_layout(data: bytes) -> Layout:
    """The LAYOUT znode: `2\\n<factory class>:<version>`."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise MetadataError("LAYOUT znode is not text") from None
    lines = text.strip().split("\n")
    if len(lines) != 2 or ":" not in lines[1]:
        raise MetadataError(f"LAYOUT znode is not '<version>\\n<factory>:<version>': {text[:80]!r}")
    cls = lines[1].rsplit(":", 1)[0].rsplit(".", 1)[-1]
    if cls not in _LAYOUT_CLASSES:
        raise MetadataError(f"LAYOUT names an unknown ledger manager factory {cls!r}")
    return _LAYOUT_CLASSES[cls]


def format_layout(layout: Layout) -> bytes:
    cls = {
        Layout.HIERARCHICAL: "HierarchicalLedgerManagerFactory",
        Layout.LONG_HIERARCHICAL: "LongHierarchicalLedgerManagerFactory",
        Layout.FLAT: "FlatLedgerManagerFactory",
    }[layout]
    return f"2\norg.apache.bookkeeper.meta.{cls}:1".encode()


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


def parse_metadata_service_uri(uri: str) -> MetadataServiceUri:
    if uri.strip().startswith(PULSAR_STORE_PREFIX):
        return _parse_pulsar_store_uri(uri.strip())
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


def _parse_pulsar_store_uri(uri: str) -> MetadataServiceUri:
    store = uri[len(PULSAR_STORE_PREFIX):].split(":", 1)[0]
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


# ---------------------------------------------------------------------------------------------
# Under-replication marks


def ur_mark_path(root: str, ledger_id: int) -> str:
    parts = [(ledger_id >> shift) & 0xFFFF for shift in (48, 32, 16, 0)]
    return f"{root}/underreplication/ledgers/" + "/".join(f"{p:04x}" for p in parts) + f"/urL{ledger_id:010d}"


@dataclass(frozen=True, slots=True)
class UnderreplicationMark:
    ledger_id: int
    replicas: tuple[str, ...]
    ctime: int | None  # ms since epoch; None when the mark has none (older BookKeeper)

    def age_seconds(self, now_ms: int) -> int | None:
        return None if self.ctime is None else (now_ms - self.ctime) // 1000


def decode_ur_mark(ledger_id: int, data: bytes) -> UnderreplicationMark:
    msg = ledger_metadata_pb2.UnderreplicatedLedgerFormat()
    try:
        text_format.Parse(data.decode("utf-8"), msg, allow_unknown_field=True)
    except (text_format.ParseError, UnicodeDecodeError) as exc:
        raise MetadataError(f"under-replication mark of ledger {ledger_id}: {exc}") from None
    return UnderreplicationMark(ledger_id, tuple(msg.replica), msg.ctime if msg.HasField("ctime") else None)


def encode_ur_mark(mark: UnderreplicationMark) -> bytes:
    msg = ledger_metadata_pb2.UnderreplicatedLedgerFormat(replica=list(mark.replicas))
    if mark.ctime is not None:
        msg.ctime = mark.ctime
    return text_format.MessageToString(msg).encode()


def ledger_id_of_mark(name: str) -> int | None:
    return int(name[3:]) if name.startswith("urL") and name[3:].isdigit() else None


@dataclass(frozen=True, slots=True)
class TreeChange:
    """A change below the ledgers root that continuous scrutiny acts on."""

    # "ledger" (its metadata), "mark" (its under-replication mark), "registration" (a bookie's), "cookie"
    # (a bookie's), "replication" (lostBookieRecoveryDelay, or re-replication disabled)
    what: str
    event: str  # created | changed | deleted
    ledger_id: int = -1
    bookie_id: str = ""


def tree_change(root: str, event: str, path: str) -> TreeChange | None:
    """What a create, change or delete at `path` (below `root`) is, in any ledger layout; None for the rest
    (buckets, locks, cookies, the layout...)."""
    if not path.startswith(root + "/"):
        return None
    parts = path[len(root) + 1:].split("/")
    if parts[0] == "available" and len(parts) in (2, 3) and parts[-1] != "readonly" \
            and (len(parts) == 2 or parts[1] == "readonly"):
        return TreeChange("registration", event, bookie_id=parts[-1])
    if parts[0] == "cookies" and len(parts) == 2:
        return TreeChange("cookie", event, bookie_id=parts[1])
    if parts in (["underreplication", "lostBookieRecoveryDelay"], ["underreplication", "disable"]):
        return TreeChange("replication", event)
    if parts[:2] == ["underreplication", "ledgers"] and len(parts) == 7:
        lid = ledger_id_of_mark(parts[-1])
        return None if lid is None else TreeChange("mark", event, lid)
    last = parts[-1]
    if is_ledger_child(parts[0]) and last.startswith("L") and last[1:].isdigit() \
            and all(p.isdigit() for p in parts[:-1]) and len(parts) in (1, 3, 5):
        return TreeChange("ledger", event, int("".join(parts[:-1]) + last[1:]))
    return None


# ---------------------------------------------------------------------------------------------
# Bookie registrations and racks


@dataclass(frozen=True, slots=True)
class Endpoint:
    id: str
    host: str
    port: int
    protocol: str


@dataclass(frozen=True, slots=True)
class BookieRegistration:
    bookie_id: str
    readonly: bool
    endpoints: tuple[Endpoint, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict)


def decode_bookie_service_info(bookie_id: str, readonly: bool, data: bytes) -> BookieRegistration:
    """An empty payload is a legacy bookie: registered, no endpoint list."""
    if not data:
        return BookieRegistration(bookie_id, readonly)
    msg = bookie_service_info_pb2.BookieServiceInfoFormat()
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        raise MetadataError(f"registration of bookie {bookie_id}: undecodable BookieServiceInfo: {exc}") from None
    eps = tuple(Endpoint(e.id, e.host, e.port, e.protocol) for e in msg.endpoints)
    return BookieRegistration(bookie_id, readonly, eps, dict(msg.properties))


def encode_bookie_service_info(reg: BookieRegistration) -> bytes:
    msg = bookie_service_info_pb2.BookieServiceInfoFormat()
    for e in reg.endpoints:
        msg.endpoints.add(id=e.id, host=e.host, port=e.port, protocol=e.protocol)
    msg.properties.update(reg.properties)
    return msg.SerializeToString()


def normalize_rack(rack: str) -> str:
    rack = rack.strip()
    if rack in ("", "/"):
        return DEFAULT_RACK
    return rack if rack.startswith("/") else "/" + rack


def decode_racks(data: bytes, where: str = "/bookies") -> tuple[dict[str, str], list[str]]:
    """Pulsar's rack-awareness JSON: {group: {bookie: {"rack": ..., "hostname": ...}}}.
    Returns the racks and a list of problems with single entries (those entries are left out)."""
    if not data:
        return {}, []
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MetadataError(f"rack znode {where}: not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise MetadataError(f"rack znode {where}: expected an object of groups, got {type(doc).__name__}")
    racks: dict[str, str] = {}
    problems = []
    for group, members in doc.items():
        if not isinstance(members, dict):
            problems.append(f"rack znode {where}: group {group!r} is not an object")
            continue
        for bookie, info in members.items():
            rack = info.get("rack") if isinstance(info, dict) else None
            if not isinstance(rack, str):
                problems.append(f"rack znode {where}: bookie {bookie!r} of group {group!r} has no rack string")
                continue
            racks[bookie] = normalize_rack(rack)
    return racks, problems


def encode_racks(racks: Mapping[str, str], group: str = "default") -> bytes:
    return json.dumps(
        {group: {b: {"rack": r, "hostname": b.rsplit(":", 1)[0]} for b, r in sorted(racks.items())}}
    ).encode()


# ---------------------------------------------------------------------------------------------
# Bookie agents' own registrations (scrutiny's znodes, `<scrutiny path>/agents/<bookie id>`)


def encode_agent_registration(bookie_id: str, address: str) -> bytes:
    return json.dumps({"bookie_id": bookie_id, "address": address}).encode()


def decode_agent_registration(where: str, data: bytes) -> tuple[str, str]:
    """(bookie id, agent address) of one registration."""
    try:
        doc = json.loads(data)
        bookie_id, address = str(doc["bookie_id"]), str(doc["address"])
    except (ValueError, KeyError, TypeError) as exc:
        raise MetadataError(f"agent registration {where}: not {{bookie_id, address}} JSON: {exc}") from None
    parse_host_port(address, f"agent registration {where}")
    return bookie_id, address
