"""scrutiny's readers of Pulsar's bytes held to what a real broker writes: captures of each Pulsar line
(`tests/golden/pulsar-<version>/`, made by `python -m scrutiny.testing.pulsargolden`; its manifest says what each
file holds)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scrutiny import entrylog
from scrutiny.pulsar import codec as codec_magic
from scrutiny.pulsar.entry import Stamp, read_envelope
from scrutiny.pulsar.records import CursorRecord, ManagedLedgerRecord, Position, SchemaRecord, position_entry

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
CAPTURES = sorted(GOLDEN.glob("pulsar-*"))


@pytest.fixture(params=CAPTURES, ids=lambda p: p.name)
def golden(request: pytest.FixtureRequest) -> tuple[Path, dict[str, Any]]:
    return request.param, json.loads((request.param / "manifest.json").read_text())


def test_every_pulsar_line_has_its_captures() -> None:
    assert {p.name.removeprefix("pulsar-").rsplit(".", 1)[0] for p in CAPTURES} >= {"4.0"}


def test_a_managed_ledgers_record_in_every_codec(golden: tuple[Path, dict[str, Any]]) -> None:
    where, manifest = golden
    assert set(manifest["managed_ledgers"]) == {"NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY"}
    for codec, want in manifest["managed_ledgers"].items():
        raw = (where / want["file"]).read_bytes()
        assert raw.startswith(codec_magic.MAGIC) == (codec != "NONE"), codec  # compressed: Pulsar's envelope
        record = ManagedLedgerRecord.from_node("public/golden/persistent/x", raw)
        *closed, head = want["ledgers"]  # as stats-internal gave them: the head still open in the record
        assert [(li.ledger_id, li.entries) for li in record.ledgers] == [*map(tuple, closed), (head[0], None)], codec


def test_cursors_live_and_closed(golden: tuple[Path, dict[str, Any]]) -> None:
    where, manifest = golden
    live = CursorRecord.from_node("plain/sub", "sub", (where / manifest["cursor_live"]["file"]).read_bytes())
    assert live.ledger_id == manifest["cursor_live"]["ledger_id"] and live.mark_delete is None
    dedup = manifest["dedup_live"]
    closed = CursorRecord.from_node("plain/pulsar.dedup", "pulsar.dedup",
                                    (where / manifest["cursor_closed"]["file"]).read_bytes())
    assert closed.ledger_id == -1  # its position inline: the one its own ledger held while live
    assert (closed.mark_delete, dict(closed.properties)) == (Position.parse(dedup["mark_delete"]), dedup["properties"])
    e = manifest["entries"]["position"]
    stored = (where / e["file"]).read_bytes()
    verdict = entrylog.verify_entry(stored, e["ledger_id"], e["entry_id"], "CRC32C")
    assert verdict.reason == ""
    assert position_entry("the dedup cursor's ledger", verdict.payload) == (Position.parse(dedup["mark_delete"]),
                                                                           dedup["properties"])


def test_a_schemas_locator(golden: tuple[Path, dict[str, Any]]) -> None:
    where, manifest = golden
    want = manifest["schema"]
    record = SchemaRecord.from_node(want["schema_id"], (where / want["file"]).read_bytes())
    assert record.versions == ((0, want["ledger_id"]),)


@pytest.mark.parametrize(("name", "producer", "ids", "messages", "stamps"), [
    ("message", "plain", (1, 1), 1, Stamp.CHECKSUM),
    ("batch-NONE", "p-NONE", (1, 3), 3, Stamp.CHECKSUM),
    *[(f"batch-{c}", f"p-{c}", (1, 3), 3, Stamp.CHECKSUM | Stamp.COMPRESSED)
      for c in ("LZ4", "ZLIB", "ZSTD", "SNAPPY")],
    ("chunk-first", "chunker", (1, 1), 0, Stamp.CHECKSUM | Stamp.CHUNK),  # a chunked message counts once
    ("chunk-last", "chunker", (1, 1), 1, Stamp.CHECKSUM | Stamp.CHUNK),
])
def test_entries_as_the_broker_gave_them_and_a_bookie_stores_them(golden: tuple[Path, dict[str, Any]], name: str,
                                                                  producer: str, ids: tuple[int, int], messages: int,
                                                                  stamps: Stamp) -> None:
    where, manifest = golden
    e = manifest["entries"][name]
    stored = (where / e["file"]).read_bytes()
    verdict = entrylog.verify_entry(stored, e["ledger_id"], e["entry_id"], "CRC32C")  # Pulsar's digest type
    assert verdict.reason == ""
    env = read_envelope(verdict.payload)
    assert (env.producer, (env.first_sequence_id, env.last_sequence_id), env.messages, Stamp(env.stamps)) == \
        (producer, ids, messages, stamps)
    flipped = verdict.payload[:-1] + bytes([verdict.payload[-1] ^ 1])  # the message's own checksum catches it
    assert Stamp(read_envelope(flipped).stamps) & Stamp.CHECKSUM_BAD
