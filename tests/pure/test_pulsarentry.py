"""A Pulsar entry's envelope as the agent reads it, and the deep scrub's check of Pulsar's checksum."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrutiny.agent.servicer import PulsarFramings
from scrutiny.categories import Category
from scrutiny.checks import DeepAnswer, check_checksums, holds_messages
from scrutiny.deepclient import envelopes_of
from scrutiny.metadata import LedgerMetadata, LedgerState, Segment
from scrutiny.pulsar import encode
from scrutiny.pulsar import pulsar_api_pb2 as apipb
from scrutiny.pulsar.entry import LedgerEnvelopes, Stamp, frame, framed, read_envelope
from scrutiny.v1 import bookie_pb2

TOPIC = "persistent://acme/orders/created"


@pytest.mark.parametrize(("form", "stamps", "ids"), [
    ({}, Stamp.CHECKSUM, (7, 7, 1)),
    ({"payloads": [b"a", b"bb", b"ccc"]}, Stamp.CHECKSUM, (7, 9, 3)),
    ({"payloads": [b"a", b"b"], "highest_sequence_id": 20}, Stamp.CHECKSUM, (7, 20, 2)),  # ids the app chose
    ({"compression": "LZ4"}, Stamp.CHECKSUM | Stamp.COMPRESSED, (7, 7, 1)),
    ({"compression": "ZSTD", "payloads": [b"x" * 100] * 4}, Stamp.CHECKSUM | Stamp.COMPRESSED, (7, 10, 4)),
    ({"encrypted": True}, Stamp.CHECKSUM | Stamp.ENCRYPTED, (7, 7, 1)),
    ({"broker_entry": (1_700_000_000_000, 42)}, Stamp.CHECKSUM | Stamp.BROKER_ENTRY, (7, 7, 1)),
    ({"broker_entry": (1, 2), "checksum": False}, Stamp.BROKER_ENTRY, (7, 7, 1)),
    ({"checksum": False}, Stamp(0), (7, 7, 1)),
    ({"chunk": (1, 3)}, Stamp.CHECKSUM | Stamp.CHUNK, (7, 7, 0)),  # a chunked message counts at its last chunk
    ({"chunk": (2, 3)}, Stamp.CHECKSUM | Stamp.CHUNK, (7, 7, 1)),
    ({"transaction": (3, 4)}, Stamp.CHECKSUM | Stamp.TRANSACTION, (7, 7, 1)),
    ({"replicated_from": "west"}, Stamp.CHECKSUM | Stamp.REPLICATED, (7, 7, 1)),
    ({"corrupt": True}, Stamp.CHECKSUM | Stamp.CHECKSUM_BAD, (7, 7, 1)),
    ({"corrupt": True, "broker_entry": (1, 2)}, Stamp.CHECKSUM | Stamp.CHECKSUM_BAD | Stamp.BROKER_ENTRY, (7, 7, 1)),
])
def test_every_form_of_a_stored_entry_reads_as_its_producer_ids_and_stamps(
        form: dict[str, object], stamps: Stamp, ids: tuple[int, int, int]) -> None:
    env = read_envelope(encode.message("orders-1", 7, **form))  # type: ignore[arg-type]
    assert env.is_message and env.producer == "orders-1"
    assert (env.first_sequence_id, env.last_sequence_id, env.messages) == ids
    assert env.stamps == stamps
    assert ("CRC32C" in env.detail) == bool(stamps & Stamp.CHECKSUM_BAD)


def test_a_marker_is_stamped_as_one() -> None:
    env = read_envelope(encode.message("orders-1", 7, marker_type=2))
    assert env.producer == "pulsar.marker" and env.stamps & Stamp.MARKER


def test_the_checksum_covers_the_metadata_and_the_payload_but_not_the_brokers_entry_metadata() -> None:
    good = encode.message("p", 1, [b"payload"], broker_entry=(5, 6))
    bem_end = 6 + struct.unpack_from(">I", good, 2)[0]
    changed_bem = good[:bem_end - 1] + bytes([good[bem_end - 1] ^ 1]) + good[bem_end:]
    assert not read_envelope(changed_bem).stamps & Stamp.CHECKSUM_BAD
    changed_metadata = bytearray(good)
    changed_metadata[bem_end + 6 + 4 + 2] ^= 1  # inside the producer's name
    assert read_envelope(bytes(changed_metadata)).stamps & Stamp.CHECKSUM_BAD


_FORMS = st.fixed_dictionaries({}, optional={
    "payloads": st.lists(st.binary(max_size=40), min_size=1, max_size=4), "compression": st.sampled_from(["LZ4"]),
    "broker_entry": st.tuples(st.integers(0, 2**40), st.integers(0, 2**40)), "checksum": st.booleans(),
    "corrupt": st.booleans(), "chunk": st.sampled_from([(0, 2), (1, 2)])})


@settings(max_examples=300, deadline=None)
@given(_FORMS, st.integers(0, 80), st.binary(max_size=4))
def test_the_agents_shortcut_frames_every_entry_as_the_step_by_step_reading_does(
        form: dict[str, object], cut: int, junk: bytes) -> None:
    whole = encode.message("p-1", 9, **form)  # type: ignore[arg-type]
    for data in (whole, whole[:cut], junk + whole, whole[:6] + junk + whole[6:]):  # cut short, shifted, bent
        assert frame(data) == framed(data)


@pytest.mark.parametrize(("data", "why"), [
    (b"", "shorter than"),
    (b"\x0e\x01\x00\x00", "shorter than"),
    (struct.pack(">I", 1 << 30) + b"xx", "metadata size"),
    (struct.pack(">I", 3) + b"\xff\xff\xff", "MessageMetadata"),
    (struct.pack(">I", 2) + apipb.MessageMetadata(sequence_id=1).SerializeToString(), "without producer_name"),
    (bytes(8) + (5).to_bytes(8, "big") + b"kafka", "without producer_name"),  # KoP's Kafka format
])
def test_what_is_not_a_pulsar_message_is_unreadable_with_a_reason(data: bytes, why: str) -> None:
    env = read_envelope(data)
    assert not env.is_message and why in env.detail


def test_sequence_ids_are_read_as_pulsars_java_longs() -> None:
    env = read_envelope(encode.message("p", (1 << 64) - 1))
    assert env.first_sequence_id == -1


def ledger(custom: tuple[tuple[str, bytes], ...]) -> LedgerMetadata:
    return LedgerMetadata(11, LedgerState.CLOSED, 3, 2, 2, 9, 0, (Segment(0, ("a:1", "b:1", "c:1")),),
                          custom_metadata=custom)


def test_only_a_topics_data_ledgers_hold_messages() -> None:
    assert holds_messages(ledger(encode.ledger_keys("topic", TOPIC)))
    for kind in ("cursor", "compacted-topic", "schema"):
        assert not holds_messages(ledger(encode.ledger_keys(kind, TOPIC, cursor="sub", schema_id="s")))
    assert not holds_messages(ledger(()))


def envelopes(bad: set[int], producer: str = "orders-1") -> LedgerEnvelopes:
    return LedgerEnvelopes.gather((e, read_envelope(encode.message(producer, 100 + e, corrupt=e in bad)))
                                  for e in range(10))


def test_a_checksum_failure_names_each_copy_its_entries_and_the_message() -> None:
    md = ledger(encode.ledger_keys("topic", TOPIC))
    ids = np.arange(10, dtype=np.int64)
    deep = {"a:1": DeepAnswer(ids, envelopes=envelopes({3, 4, 5})), "b:1": DeepAnswer(ids, envelopes=envelopes({4})),
            "c:1": DeepAnswer(ids, envelopes=envelopes(set()))}
    (v,) = check_checksums(md, deep)
    assert v.category is Category.PULSAR_CHECKSUM_MISMATCH and v.bookies == ("a:1", "b:1")
    assert v.details["copies"]["a:1"]["entries"] == [[3, 5]] and v.details["copies"]["b:1"]["count"] == 1
    assert [m["entry_id"] for m in v.details["messages"]] == [3, 4, 5]
    assert v.details["messages"][0] == {"entry_id": 3, "producer": "orders-1", "sequence_ids": [103, 103]}
    assert check_checksums(md, {"c:1": deep["c:1"], "d:1": DeepAnswer(ids)}) == []  # good, or not read


def test_what_the_agent_frames_the_caller_reads_as_the_whole_envelope_and_refuses_when_it_does_not_line_up(
        ) -> None:
    stored = [encode.message("orders-1", 100 + e, corrupt=e == 2, broker_entry=(1, e) if e % 2 else None)
              for e in range(6)] + [b"kafka"]
    framings = PulsarFramings()
    for e, data in enumerate(stored):
        framings.add(e, data)
    msg = framings.answer()
    assert msg.first_problem.startswith("entry 2: Pulsar's CRC32C")
    back = envelopes_of(msg)
    whole = LedgerEnvelopes.gather((e, read_envelope(data)) for e, data in enumerate(stored))
    assert back is not None and back.producers == whole.producers == ("orders-1",)
    for column in ("entry_ids", "first_sequence_ids", "last_sequence_ids", "messages", "stamps", "producer"):
        assert np.array_equal(getattr(back, column), getattr(whole, column)), column
    short = bookie_pb2.PulsarEntries()
    short.CopyFrom(msg)
    del short.stamps[-1]
    assert envelopes_of(short) is None
