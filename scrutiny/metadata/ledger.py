"""A ledger's metadata znode in every format BookKeeper wrote (v1 text, v2 protobuf text, v3 binary), decoded
into an immutable snapshot (or encoded, for the cluster writer), checked for consistency."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar, dataclass_transform

from google.protobuf import text_format
from google.protobuf.internal import decoder as pb_decoder
from google.protobuf.internal import encoder as pb_encoder
from google.protobuf.message import DecodeError

from scrutiny.bookkeeper import ledger_metadata_pb2
from scrutiny.errors import MetadataError

MAX_ENSEMBLE_SIZE = 1024
HEADER_PREFIX = b"BookieMetadataFormatVersion\t"
IN_RECOVERY_V1 = -102
V3_HEADER = HEADER_PREFIX + b"3\n"
_LMF = ledger_metadata_pb2.LedgerMetadataFormat


class LedgerState(enum.IntEnum):
    OPEN = 1
    IN_RECOVERY = 2
    CLOSED = 3


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
            # a plain slotted class at run time (`snapshot`): set directly, as the generated __init__ does
            self.bookies = frozenset(seg.ensemble)  # type: ignore[misc]
            first = seg.first_entry_id
            self._ranges = ((seg, first, self.last_entry_id),) if first <= self.last_entry_id else ()  # type: ignore[misc]
            return
        self.bookies = frozenset(b for s in segments for b in s.ensemble)  # type: ignore[misc]
        ranges = []
        for i, seg in enumerate(self.segments):
            end = self.segments[i + 1].first_entry_id - 1 if i + 1 < len(self.segments) else self.last_entry_id
            end = min(end, self.last_entry_id)
            if seg.first_entry_id <= end:
                ranges.append((seg, seg.first_entry_id, end))
        self._ranges = tuple(ranges)  # type: ignore[misc]

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
    # what every BookKeeper since 4.9 writes, without the general header's parse
    version, offset = (3, len(V3_HEADER)) if data.startswith(V3_HEADER) else _split_header(ledger_id, data)
    if version == 1:
        md = _decode_v1(ledger_id, data[offset:], znode_ctime, znode_version, znode_mtime)
    elif version in (2, 3):
        msg = _LMF()
        try:
            if version == 3:
                length, pos = pb_decoder._DecodeVarint32(data, offset)  # type: ignore[attr-defined]
                if length > len(data) - pos:
                    raise MetadataError(
                        f"ledger {ledger_id}: v3 metadata says {length} bytes but {len(data) - pos} follow"
                    )
                msg.ParseFromString(data[pos:pos + length])
            else:
                text_format.Parse(data[offset:].decode("utf-8"), msg, allow_unknown_field=True)
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
        members = tuple(s.ensembleMember)
        segments: tuple[Segment, ...] = (Segment(s.firstEntryId, members),)
    else:
        segments = tuple([Segment(s.firstEntryId, tuple(s.ensembleMember)) for s in segs])
        members = tuple([b for seg in segments for b in seg.ensemble])
    try:  # protobuf gives a string that is not UTF-8 as bytes
        "".join(members)
    except TypeError:
        bad = next(b for b in members if not isinstance(b, str))
        raise MetadataError(f"ledger {ledger_id}: bookie id {bad!r} in its ensemble is not UTF-8") from None
    custom = msg.customMetadata
    return LedgerMetadata(  # the fields in their order (an unknown digest type reads as CRC32, its default)
        ledger_id, state, e, wq, aq, last, msg.length, segments, ctime,
        tuple([(_text(c.key), bytes(c.value)) for c in custom]) if custom else (),
        _DIGEST_TYPES.get(msg.digestType, "CRC32"), msg.password, msg.cToken, version, znode_version, znode_mtime)


def _text(key: str | bytes) -> str:
    """A custom metadata key as BookKeeper's Java reads it: what is not UTF-8 replaced."""
    return key if isinstance(key, str) else key.decode("utf-8", "replace")


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
    )
    if md.ctime >= 0:  # BookKeeper sets it only with storeSystemtimeAsLedgerCreationTime (Pulsar: never)
        msg.ctime = md.ctime
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

