"""scrutiny's decoders, and its test tooling's encoders, held to what a real BookKeeper writes: captures from real
clients, bookies and Auditors of each BookKeeper line (`tests/golden/bookkeeper-<version>/`, made by
`python -m scrutiny.testing.golden`; its manifest says what each file holds)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format

from scrutiny import entrylog
from scrutiny.bookkeeper import dbledgerstorage_pb2
from scrutiny.entrysources.layout import ENTRY_KEY, LOCATION
from scrutiny.metadata import (
    BookieRegistration,
    Endpoint,
    LedgerState,
    decode_bookie_service_info,
    decode_ledger_metadata,
    encode_bookie_service_info,
    encode_ledger_metadata,
)
from scrutiny.metadata.marks import decode_ur_mark, encode_ur_mark
from scrutiny.metadata.paths import Layout, format_layout, parse_layout
from scrutiny.testing.clusterwriter import cookie
from scrutiny.testing.dbledgerstorage import ledger_data

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
CAPTURES = sorted(GOLDEN.glob("bookkeeper-*"))


@pytest.fixture(params=CAPTURES, ids=lambda p: p.name)
def golden(request: pytest.FixtureRequest) -> tuple[Path, dict[str, Any]]:
    return request.param, json.loads((request.param / "manifest.json").read_text())


def test_every_bookkeeper_line_has_its_captures() -> None:
    lines = {p.name.removeprefix("bookkeeper-").rsplit(".", 1)[0] for p in CAPTURES}
    assert lines >= {"4.16", "4.17"}


def test_ledger_metadata_as_a_real_client_writes_it(golden: tuple[Path, dict[str, Any]]) -> None:
    where, manifest = golden
    for digest, want in manifest["metadata"].items():
        raw = (where / want["file"]).read_bytes()
        # a real client writes no ctime (storeSystemtimeAsLedgerCreationTime is off): the znode's stands in
        assert decode_ledger_metadata(want["ledger_id"], raw, znode_ctime=1).ctime == 1
        md = decode_ledger_metadata(want["ledger_id"], raw)
        assert encode_ledger_metadata(md) == raw, digest  # our encoder writes BookKeeper's bytes
        if digest == "open":
            assert md.state is LedgerState.OPEN and md.last_entry_id == -1
            continue
        assert md.state is LedgerState.CLOSED and md.last_entry_id == want["last_entry_id"]
        if digest == "recovered":
            continue
        assert (md.ensemble_size, md.write_quorum, md.ack_quorum) == (want["ensemble_size"], want["write_quorum"],
                                                                       want["ack_quorum"])
        assert md.digest_type == {"MAC": "HMAC"}.get(digest, digest) and md.password == want["password"].encode()
        assert dict((k, v.decode()) for k, v in md.custom_metadata) == want["custom_metadata"]
        assert md.length == want["length"] and md.ctime == -1


def test_entries_as_a_real_bookie_stores_them(golden: tuple[Path, dict[str, Any]]) -> None:
    where, manifest = golden
    for digest, e in manifest["entries"].items():
        raw = (where / e["file"]).read_bytes()
        assert entrylog.verify_entry(raw, e["ledger_id"], e["entry_id"], {"MAC": "HMAC"}.get(digest, digest),
                                     b"scrutiny").reason == ""
        packaged = entrylog.package_entry(e["ledger_id"], e["entry_id"], e["last_add_confirmed"], e["length"],
                                          e["payload"].encode(), {"MAC": "HMAC"}.get(digest, digest), b"scrutiny")
        assert packaged == raw, digest
        flipped = raw[:-1] + bytes([raw[-1] ^ 1])
        assert entrylog.verify_entry(flipped, e["ledger_id"], e["entry_id"], {"MAC": "HMAC"}.get(digest, digest),
                                     b"scrutiny").reason == ("" if digest == "DUMMY" else entrylog.BAD_DIGEST)


def test_the_indexes_values_and_the_entry_logs_headers(golden: tuple[Path, dict[str, Any]]) -> None:
    where, manifest = golden
    data = dbledgerstorage_pb2.LedgerData.FromString((where / manifest["ledger_data"]["file"]).read_bytes())
    assert data.exists and data.HasField("fenced") and not data.fenced and len(data.masterKey) == 20
    assert not data.limbo
    assert ledger_data(password=b"scrutiny") == (where / manifest["ledger_data"]["file"]).read_bytes()
    fenced = dbledgerstorage_pb2.LedgerData.FromString((where / manifest["ledger_data_fenced"]["file"]).read_bytes())
    assert fenced.exists and fenced.fenced
    key, value = bytes.fromhex(manifest["location"]["key"]), bytes.fromhex(manifest["location"]["value"])
    assert ENTRY_KEY.unpack(key) == (manifest["ledger_data"]["ledger_id"], 0)
    log_id, pos = entrylog.split_location(LOCATION.unpack(value)[0])
    assert log_id >= 0 and pos >= entrylog.LOG_HEADER_BYTES + entrylog.ENTRY_SIZE.size
    header = (where / manifest["entry_log_header"]["file"]).read_bytes()
    assert entrylog.LOG_HEADER.unpack_from(header)[:2] == (entrylog.LOG_MAGIC, 1)
    assert entrylog.ledgers_map_offset(header) == 0  # the log still being written: no map yet
    direct = (where / manifest["direct_entry_log_header"]["file"]).read_bytes()
    assert entrylog.LOG_HEADER.unpack_from(direct)[:2] == (entrylog.LOG_MAGIC, 1)
    (size,) = entrylog.ENTRY_SIZE.unpack_from(direct, 1024)  # a dummy record spans the rest of its 4 KiB block
    assert size == 4096 - 1024 - entrylog.ENTRY_SIZE.size and direct[1028:1036] == b"\xff" * 8


def test_the_registrations_cookies_layout_and_marks(golden: tuple[Path, dict[str, Any]]) -> None:
    where, manifest = golden
    reg = manifest["registration"]
    raw = (where / reg["file"]).read_bytes()
    decoded = decode_bookie_service_info(reg["bookie_id"], False, raw)
    assert decoded == BookieRegistration(reg["bookie_id"], False,
                                         (Endpoint("bookie", "127.0.0.1", reg["port"], "bookie-rpc"),))
    assert encode_bookie_service_info(decoded) == raw
    znode = (where / manifest["cookie"]["file"]).read_text()
    assert znode == (where / manifest["cookie"]["local_file"]).read_text()  # the same cookie, both places
    assert znode.splitlines()[0] == "5"
    fields = text_format.Parse("\n".join(znode.splitlines()[1:]), _cookie_format())
    assert fields.bookieHost == reg["bookie_id"] and fields.instanceId
    ours = cookie(reg["bookie_id"], fields.instanceId, fields.journalDir, fields.ledgerDirs.split("\t")[1])
    assert ours.decode() == znode  # the test tooling's cookies are BookKeeper's
    layout = (where / manifest["layout"]["file"]).read_bytes()
    assert parse_layout(layout) is Layout.HIERARCHICAL and format_layout(Layout.HIERARCHICAL) == layout
    mark = manifest["mark"]
    raw = (where / mark["file"]).read_bytes()
    decoded_mark = decode_ur_mark(mark["ledger_id"], raw)
    assert decoded_mark.replicas == tuple(mark["replicas"]) and decoded_mark.ctime
    assert encode_ur_mark(decoded_mark) == raw


def _cookie_format() -> Any:
    """BookKeeper's CookieFormat (DataFormats.proto), for reading the captured cookie's fields."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(name="golden_cookie.proto", package="golden")
    msg = proto.message_type.add(name="CookieFormat")
    for number, name in enumerate(("bookieHost", "journalDir", "ledgerDirs", "instanceId"), start=1):
        msg.field.add(name=name, number=number, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                      label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("golden.CookieFormat"))()
