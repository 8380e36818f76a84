from __future__ import annotations

import base64
import contextlib
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from scrutiny.metadata import (
    DEFAULT_RACK,
    SHORT_PATH_LIMIT,
    BookieRegistration,
    Endpoint,
    Layout,
    LedgerMetadata,
    LedgerState,
    MetadataError,
    Segment,
    TreeChange,
    UnderreplicationMark,
    decode_bookie_service_info,
    decode_ledger_metadata,
    decode_racks,
    decode_ur_mark,
    encode_bookie_service_info,
    encode_ledger_metadata,
    encode_racks,
    encode_ur_mark,
    format_layout,
    ledger_path,
    ledger_paths,
    parse_layout,
    parse_metadata_service_uri,
    store_scheme,
    tree_change,
    ur_mark_path,
)

SPEC_V3_SAMPLE = (
    "Qm9va2llTWV0YWRhdGFGb3JtYXRWZXJzaW9uCTMKYAgCEAMYACD///////////8BKAEyMgoOMTkyLjAuMi4xOjMxODEKDjE5Mi4w"
    "LjIuMjozMTgxCg4xOTIuMC4yLjM6MzE4MRAAOANCBmZvb2JhckgBUP///////////wFgAA=="
)


def sample(**kw: object) -> LedgerMetadata:
    base = dict(
        ledger_id=7, state=LedgerState.CLOSED, ensemble_size=3, write_quorum=2, ack_quorum=2, last_entry_id=99,
        length=4096,
        segments=(Segment(0, ("a:3181", "b:3181", "c:3181")), Segment(50, ("a:3181", "d:3181", "c:3181"))),
        ctime=1_700_000_000_000, custom_metadata=(("application", b"pulsar"),), password=b"pw",
    )
    base.update(kw)
    return LedgerMetadata(**base)  # type: ignore[arg-type]


def test_spec_v3_sample_decodes_as_stated() -> None:
    md = decode_ledger_metadata(1, base64.b64decode(SPEC_V3_SAMPLE))
    assert (md.write_quorum, md.ensemble_size, md.length, md.last_entry_id) == (2, 3, 0, -1)
    assert md.state is LedgerState.OPEN
    assert md.segments == (Segment(0, ("192.0.2.1:3181", "192.0.2.2:3181", "192.0.2.3:3181")),)
    assert (md.digest_type, md.password, md.ack_quorum, md.ctime, md.ctoken) == ("CRC32C", b"foobar", 1, -1, 0)
    assert md.format_version == 3


@pytest.mark.parametrize("version", [1, 2, 3])
def test_roundtrip_every_format(version: int) -> None:
    md = sample()
    got = decode_ledger_metadata(7, encode_ledger_metadata(md, version), znode_ctime=123, znode_version=4)
    assert got.segments == md.segments
    assert (got.state, got.last_entry_id, got.length, got.ensemble_size, got.write_quorum) == (
        md.state, md.last_entry_id, md.length, md.ensemble_size, md.write_quorum)
    assert got.znode_version == 4
    if version == 1:
        assert got.ack_quorum == got.write_quorum and got.ctime == 123  # v1: AQ = WQ, znode ctime
    else:
        assert (got.ack_quorum, got.ctime, got.password) == (2, md.ctime, b"pw")
        assert got.custom_metadata == md.custom_metadata


def test_v1_states_and_text() -> None:
    body = b"BookieMetadataFormatVersion\t1\n2\n3\n0\n0\ta:1\tb:1\tc:1\n"
    assert decode_ledger_metadata(1, body).state is LedgerState.OPEN
    assert decode_ledger_metadata(1, body + b"-102\tCLOSED\n").state is LedgerState.IN_RECOVERY
    closed = decode_ledger_metadata(1, body + b"41\tCLOSED\n")
    assert (closed.state, closed.last_entry_id, closed.ack_quorum) == (LedgerState.CLOSED, 41, 2)


def test_missing_ack_quorum_defaults_to_write_quorum() -> None:
    data = encode_ledger_metadata(sample(ack_quorum=2), 2).replace(b"ackQuorumSize: 2\n", b"")
    assert b"ackQuorumSize" not in data
    assert decode_ledger_metadata(7, data).ack_quorum == 2


def test_a_field_set_to_zero_is_not_an_absent_field() -> None:
    """proto2: an absent field reads as 0 too; absence has its own meaning (the decoder's shortcut for
    non-zero values must keep it)."""
    text = encode_ledger_metadata(sample(), 2)

    def edit(old: bytes, new: bytes) -> bytes:
        assert old in text
        return text.replace(old, new)

    def decoded(data: bytes) -> LedgerMetadata:
        return decode_ledger_metadata(9, data, znode_ctime=5, check=False)

    assert decoded(edit(b"lastEntryId: 99\n", b"")).last_entry_id == -1
    assert decoded(edit(b"lastEntryId: 99\n", b"lastEntryId: 0\n")).last_entry_id == 0
    assert decoded(edit(b"ctime: 1700000000000\n", b"")).ctime == 5
    assert decoded(edit(b"ctime: 1700000000000\n", b"ctime: 0\n")).ctime == 0
    assert decoded(edit(b"ackQuorumSize: 2\n", b"ackQuorumSize: 0\n")).ack_quorum == 0
    assert decoded(edit(b"digestType: CRC32C\n", b"")).digest_type == "CRC32"
    for name in (b"quorumSize: 2\n", b"ensembleSize: 3\n"):
        with pytest.raises(MetadataError, match=f"lacks {name.split(b':')[0].decode()}"):
            decoded(edit(name, b""))
    with pytest.raises(MetadataError, match="write quorum 0"):
        decode_ledger_metadata(9, edit(b"quorumSize: 2\n", b"quorumSize: 0\n"))


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "empty"),
        (b"\x8f\x00random\xff", "does not start"),
        (b"BookieMetadataFormatVersion\tthree\n", "not a number"),
        (b"BookieMetadataFormatVersion\t12345678901\n", "not"),
        (b"BookieMetadataFormatVersion\t4\nxx", "unsupported"),
        (b"BookieMetadataFormatVersion\t3\n\x10\x08\x02", "says 16 bytes"),
        (b"BookieMetadataFormatVersion\t3\n\x03\xff\xff\xff", "undecodable"),
        (b"BookieMetadataFormatVersion\t2\nquorumSize: banana\n", "undecodable"),
        (b"BookieMetadataFormatVersion\t1\n2\n", "needs"),
    ],
)
def test_malformed_metadata_is_refused_naming_the_ledger(data: bytes, words: str) -> None:
    with pytest.raises(MetadataError, match=f"ledger 9.*{words}|{words}") as err:
        decode_ledger_metadata(9, data)
    assert "ledger 9" in str(err.value)


@pytest.mark.parametrize(
    ("md", "words"),
    [
        (sample(write_quorum=4), "write quorum 4"),
        (sample(ack_quorum=3), "ack quorum 3"),
        (sample(segments=(Segment(0, ("a:1", "b:1")),)), "has 2 bookies"),
        (sample(segments=(Segment(0, ("a:1", "a:1", "b:1")),)), "twice"),
        (sample(segments=(Segment(5, ("a:1", "b:1", "c:1")),)), "not 0"),
        (sample(segments=()), "no segment"),
        (sample(ensemble_size=2000, write_quorum=2), "ensemble size 2000"),
    ],
)
def test_inconsistent_metadata_is_refused(md: LedgerMetadata, words: str) -> None:
    with pytest.raises(MetadataError, match=words):
        decode_ledger_metadata(7, encode_ledger_metadata(md, 3))


def test_a_string_that_is_not_utf8_is_a_bookie_id_refused_and_a_key_read_as_java_reads_it() -> None:
    """protobuf gives a proto2 string that is not UTF-8 as bytes: a bookie's id so is refused, naming it (a check
    would fail on it far from the znode); a custom metadata key is read as BookKeeper's Java reads it."""
    v3 = encode_ledger_metadata(sample(custom_metadata=(("applicati\u00f6n", b"pulsar"),)), 3)
    with pytest.raises(MetadataError, match=r"ledger 7: bookie id b'\\xff:3181' in its ensemble is not UTF-8"):
        decode_ledger_metadata(7, v3.replace(b"a:3181", b"\xff:3181"))
    md = decode_ledger_metadata(7, v3.replace("\u00f6".encode(), b"\xff\xff"))
    assert md.custom_metadata == (("applicati\ufffd\ufffdn", b"pulsar"),)


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_random_bytes_never_crash_the_decoder(data: bytes) -> None:
    for payload in (data, b"BookieMetadataFormatVersion\t3\n" + data, b"BookieMetadataFormatVersion\t2\n" + data,
                    b"BookieMetadataFormatVersion\t1\n" + data):
        with contextlib.suppress(MetadataError):
            decode_ledger_metadata(3, payload)


def test_segment_ranges_skip_empty_segments() -> None:
    md = sample(last_entry_id=60, segments=(Segment(0, ("a", "b", "c")), Segment(10, ("a", "b", "d")),
                                            Segment(10, ("a", "e", "d")), Segment(70, ("f", "e", "d"))))
    assert [(s.ensemble, lo, hi) for s, lo, hi in md.segment_ranges()] == [
        (("a", "b", "c"), 0, 9), (("a", "e", "d"), 10, 60)]


def test_ledger_paths_per_layout() -> None:
    assert ledger_path(Layout.FLAT, "/ledgers", 1) == "/ledgers/L0000000001"
    assert ledger_path(Layout.HIERARCHICAL, "/ledgers", 21234561) == "/ledgers/00/2123/L4561"
    assert ledger_path(Layout.HIERARCHICAL, "/ledgers", 2147483646) == "/ledgers/21/4748/L3646"
    assert ledger_path(Layout.HIERARCHICAL, "/ledgers", 2147483647) == "/ledgers/000/0000/0021/4748/L3647"
    assert ledger_path(Layout.HIERARCHICAL, "/ledgers", 2147483648) == "/ledgers/000/0000/0021/4748/L3648"
    assert ledger_path(Layout.LONG_HIERARCHICAL, "/ledgers", 1) == "/ledgers/000/0000/0000/0000/L0001"


@given(st.sampled_from(Layout), st.lists(st.one_of(
    st.integers(0, 2**63 - 1), st.integers(SHORT_PATH_LIMIT - 20_000, SHORT_PATH_LIMIT + 20_000),
    st.integers(0, 30_000)), max_size=60), st.booleans())
# (a leaf bucket that straddles the short form's limit)
@example(Layout.HIERARCHICAL, [SHORT_PATH_LIMIT - 1, SHORT_PATH_LIMIT, SHORT_PATH_LIMIT - 1], False)
def test_a_ledgers_path_is_the_same_made_alone_or_among_others(layout: Layout, ids: list[int], ordered: bool) -> None:
    ids = sorted(ids) if ordered else ids  # a range's ids are ascending; any order gives the same paths
    assert list(ledger_paths(layout, "/ledgers", ids)) == [(lid, ledger_path(layout, "/ledgers", lid)) for lid in ids]


def test_layout_znode() -> None:
    raw = b"2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1"
    assert format_layout(Layout.HIERARCHICAL) == raw
    assert parse_layout(raw) is Layout.HIERARCHICAL
    legacy = b"2\norg.apache.bookkeeper.meta.LegacyHierarchicalLedgerManagerFactory:1"
    assert parse_layout(legacy) is Layout.HIERARCHICAL
    for layout in Layout:
        assert parse_layout(format_layout(layout)) is layout
    with pytest.raises(MetadataError, match="unknown ledger manager"):
        parse_layout(b"2\norg.example.MysteryFactory:1")


def test_metadata_service_uri() -> None:
    u = parse_metadata_service_uri("zk+hierarchical://h1:2181;h2:2181/ledgers")
    assert (u.servers, u.root, u.layout, u.hosts) == (("h1:2181", "h2:2181"), "/ledgers", Layout.HIERARCHICAL,
                                                      "h1:2181,h2:2181")
    assert u.racks_path == "/bookies"
    assert parse_metadata_service_uri("zk://h:1/a/ledgers").layout is None
    assert parse_metadata_service_uri("zk+null://h:1/a/ledgers").racks_path == "/a/bookies"
    assert parse_metadata_service_uri("zk+longhierarchical://h:1").root == "/ledgers"
    for bad in ("http://h:1/ledgers", "zk+weird://h:1/l", "zk+flat://h/l", "zk+flat://h:99999/l"):
        with pytest.raises(MetadataError):
            parse_metadata_service_uri(bad)


def test_pulsars_metadata_store_uri_on_zookeeper() -> None:
    """Pulsar's driver (PIP-45): `metadata-store:zk:` then ZooKeeper's connect string; a path after the
    hosts is a chroot, the ledgers are at /ledgers under it, in the hybrid hierarchical layout."""
    u = parse_metadata_service_uri("metadata-store:zk:zk1:2181,zk2:2181;zk3:2181/pulsar-a")
    assert (u.servers, u.root, u.layout) == (("zk1:2181", "zk2:2181", "zk3:2181"), "/pulsar-a/ledgers",
                                             Layout.HIERARCHICAL)
    assert (u.racks_path, u.managed_ledgers_path) == ("/pulsar-a/bookies", "/pulsar-a/managed-ledgers")
    assert parse_metadata_service_uri("metadata-store:zk:zk1:2181").root == "/ledgers"
    assert parse_metadata_service_uri("metadata-store:zk:zk1:2181/?sessionTimeoutMillis=30000").root == "/ledgers"
    assert parse_layout(b"2\norg.apache.pulsar.metadata.bookkeeper.PulsarLedgerManagerFactory:1") is Layout.HIERARCHICAL
    for bad, words in [("metadata-store:oxia://o1:6648/default", "'oxia' is not supported"),
                       ("metadata-store:zk:zk1/chroot", "not HOST:PORT")]:
        with pytest.raises(MetadataError, match=words):
            parse_metadata_service_uri(bad)


def test_the_store_a_uri_names_is_read_in_one_place() -> None:
    """The stores' registry key: BookKeeper's scheme before any layout, Pulsar's store after its prefix."""
    cases = {"zk+hierarchical://h:1/ledgers": "zk", "zk://h:1": "zk", " metadata-store:zk:h:1/c ": "metadata-store:zk",
             "metadata-store:etcd:http://h:2379": "metadata-store:etcd",
             "metadata-store:oxia://o:6648/ns": "metadata-store:oxia", "etcd://h:2379/ledgers": "etcd",
             "mem://c1": "mem"}
    assert {uri: store_scheme(uri) for uri in cases} == cases


def test_underreplication_mark_path_and_payload() -> None:
    assert ur_mark_path("/ledgers", 1) == "/ledgers/underreplication/ledgers/0000/0000/0000/0001/urL0000000001"
    assert ur_mark_path("/l", 0x0001_0002_0003_0004).endswith("/0001/0002/0003/0004/urL281483566841860")
    text = b'replica: "10.0.0.1:3181"\nreplica: "10.0.0.2:3181"\nctime: 1700000000000\n'
    mark = decode_ur_mark(5, text)
    assert mark == UnderreplicationMark(5, ("10.0.0.1:3181", "10.0.0.2:3181"), 1700000000000)
    assert decode_ur_mark(5, encode_ur_mark(mark)) == mark
    assert decode_ur_mark(5, b'replica: "x:1"\n').ctime is None
    assert mark.age_seconds(1700000010999) == 10


def test_bookie_service_info() -> None:
    reg = BookieRegistration("b1:3181", False, (Endpoint("grpc", "b1", 4181, "grpc"),), {"rack": "/r1"})
    assert decode_bookie_service_info("b1:3181", False, encode_bookie_service_info(reg)) == reg
    assert decode_bookie_service_info("b1:3181", True, b"") == BookieRegistration("b1:3181", True)
    with pytest.raises(MetadataError, match="b1:3181"):
        decode_bookie_service_info("b1:3181", False, b"\xff\xff\xff")


def test_pulsar_rack_json() -> None:
    data = b'{"default": {"b1:3181": {"rack": "/r1", "hostname": "b1"}, "b2:3181": {"rack": ""},' \
           b' "b3:3181": {"rack": "r3"}, "b4:3181": {"rack": "/"}, "b5:3181": 7}}'
    racks, problems = decode_racks(data)
    assert racks == {"b1:3181": "/r1", "b2:3181": DEFAULT_RACK, "b3:3181": "/r3", "b4:3181": DEFAULT_RACK}
    assert len(problems) == 1 and "b5:3181" in problems[0]
    assert decode_racks(encode_racks({"x:1": "/a/b"}))[0] == {"x:1": "/a/b"}
    with pytest.raises(MetadataError, match="not JSON"):
        decode_racks(b"{nope")


@settings(max_examples=200)
@given(st.binary(max_size=200))
def test_random_rack_json_never_crashes(data: bytes) -> None:
    with contextlib.suppress(MetadataError):
        decode_racks(data)


def test_ledger_metadata_is_frozen_to_the_type_checker(tmp_path: Path) -> None:
    """A plain slotted dataclass at run time (see `snapshot`), so immutability rests on mypy."""
    from mypy import api

    snippet = tmp_path / "assign.py"
    snippet.write_text("from scrutiny.metadata import LedgerMetadata, LedgerState, Segment\n"
                       "md = LedgerMetadata(1, LedgerState.CLOSED, 1, 1, 1, 0, 0, (Segment(0, ('b:1',)),))\n"
                       "md.last_entry_id = 5\n")
    out, _, status = api.run([str(snippet), "--ignore-missing-imports", "--no-error-summary"])
    assert status == 1 and 'Property "last_entry_id" defined in "LedgerMetadata" is read-only' in out, out
    md = decode_ledger_metadata(7, encode_ledger_metadata(sample()), sample().ctime)
    assert md == sample() and hash(md) == hash(sample())


def test_the_changes_continuous_scrutiny_acts_on() -> None:
    r = "/c/ledgers"
    assert tree_change(r, "changed", f"{r}/00/0000/L0042") == TreeChange("ledger", "changed", 42)
    assert tree_change(r, "deleted", f"{r}/available/readonly/b1:3181") == \
        TreeChange("registration", "deleted", bookie_id="b1:3181")
    assert tree_change(r, "created", f"{r}/cookies/b1:3181") == TreeChange("cookie", "created", bookie_id="b1:3181")
    assert tree_change(r, "changed", f"{r}/underreplication/lostBookieRecoveryDelay") == \
        TreeChange("replication", "changed")
    assert tree_change(r, "created", f"{r}/underreplication/disable") == TreeChange("replication", "created")
    for other in ("underreplication/locks/urL0001", "available/readonly", "LAYOUT", "idgen/ID-0000000001",
                  "cookies/b1:3181/x", "underreplication/auditorelection"):
        assert tree_change(r, "created", f"{r}/{other}") is None, other
    assert tree_change(r, "created", "/other/ledgers/00/0000/L0001") is None
