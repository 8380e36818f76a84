"""Under-replication marks as BookKeeper's Auditor writes them: their paths and their text payload."""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import text_format

from scrutiny.bookkeeper import ledger_metadata_pb2
from scrutiny.errors import MetadataError


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

