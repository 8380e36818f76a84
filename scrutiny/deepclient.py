"""The deep scrub's calls to the agents (each copy's stored entries verified; a ledger's last entry read), on a
BookieClient's channels, per-bookie bounds and retries."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from scrutiny.bookieclient import BookieClient
from scrutiny.checks import DeepAnswer, holds_messages
from scrutiny.codec import EMPTY_ANSWER, CodecError, decode
from scrutiny.entrylog import PAYLOAD_HASH_BYTES
from scrutiny.metadata import LedgerMetadata
from scrutiny.pulsar.entry import LedgerEnvelopes, envelope
from scrutiny.v1 import bookie_pb2


def interpret_verification(bookie_id: str, msg: Any) -> DeepAnswer:
    """One LedgerVerification as a deep answer (not verified when it cannot be read)."""
    if msg.status == bookie_pb2.ENOLEDGER:
        return DeepAnswer(np.empty(0, np.int64))
    if msg.status != bookie_pb2.EOK:
        return DeepAnswer(reason=f"{bookie_pb2.StatusCode.Name(msg.status)}: {msg.message}".rstrip(": "))
    try:
        verified = decode(msg.verified_entries or EMPTY_ANSWER).entry_ids(limit=1 << 40)
    except CodecError as exc:
        return DeepAnswer(reason=f"bookie {bookie_id}, ledger {msg.ledger_id}: {exc}")
    if len(msg.payload_hashes) != PAYLOAD_HASH_BYTES * verified.size:
        return DeepAnswer(reason=f"bookie {bookie_id}, ledger {msg.ledger_id}: {len(msg.payload_hashes)} bytes of "
                                 f"payload hashes for {verified.size} verified entries")
    return DeepAnswer(verified, np.frombuffer(msg.payload_hashes, dtype=">u8").astype(np.uint64),
                      tuple((c.entry_id, c.reason, c.detail) for c in msg.corrupt), msg.bytes_read,
                      not msg.digest_unchecked, envelopes=envelopes_of(msg.pulsar) if msg.HasField("pulsar") else None)


def envelopes_of(msg: Any) -> LedgerEnvelopes | None:
    """An agent's Pulsar framing, each message's metadata parsed here; None (not read) when its columns do not
    line up."""
    if not len(msg.entry_ids) == len(msg.stamps) == len(msg.metadata):
        return None
    return LedgerEnvelopes.gather(((e, envelope((s, m, ""))) for e, s, m in
                                   zip(msg.entry_ids, msg.stamps, msg.metadata, strict=True)), msg.first_problem)


def ledger_to_verify(md: LedgerMetadata, send_password: bool, pulsar_messages: bool = False) -> Any:
    """How a deep call names a ledger: an HMAC ledger's password only where it may be sent (over TLS)."""
    return bookie_pb2.LedgerToVerify(ledger_id=md.ledger_id, digest_type=md.digest_type,
                                     password=md.password if send_password and md.digest_type == "HMAC" else b"",
                                     pulsar_messages=pulsar_messages)



class DeepScrubClient:
    """A deep scrub's verification of copies and a cursor ledger's last entry, asked of the agents."""

    def __init__(self, client: BookieClient) -> None:
        self.client = client

    def verify_many(self, wanted: Mapping[str, Sequence[LedgerMetadata]],
                    send_passwords: bool = False) -> dict[str, dict[int, DeepAnswer]]:
        """Ask every bookie to verify its copies of its ledgers; every (bookie, ledger) gets one answer."""
        tasks = []
        for bookie_id, ledgers in wanted.items():
            asks = [ledger_to_verify(md, send_passwords, pulsar_messages=holds_messages(md))
                    for md in sorted(ledgers, key=lambda m: m.ledger_id)]
            for i in range(0, len(asks), self.client.deep_ledgers_per_call):
                tasks.append((bookie_id, self.client._pool.submit(self._verify_chunk, bookie_id,
                                                           asks[i:i + self.client.deep_ledgers_per_call])))
        out: dict[str, dict[int, DeepAnswer]] = {b: {} for b in wanted}
        for bookie_id, fut in tasks:
            out[bookie_id].update(fut.result())
        return out

    def last_entry(self, bookie_id: str, md: LedgerMetadata, send_password: bool = False) -> tuple[int, bytes] | None:
        """The last entry of the ledger this bookie stores whose bytes verify, and its payload; None when it
        stores none, or cannot say."""
        got: list[Any] = []

        def ask() -> None:
            req = bookie_pb2.ReadLastEntryRequest(ledger=ledger_to_verify(md, send_password))
            got.append(self.client._stub(bookie_id).ReadLastEntry(req, timeout=self.client.deadline))

        with self.client._slot(bookie_id):
            failed = self.client._retried(ask)
        if failed or not got or got[-1].status != bookie_pb2.EOK:
            return None
        return got[-1].entry_id, got[-1].payload

    def _verify_chunk(self, bookie_id: str, asks: list[Any]) -> dict[int, DeepAnswer]:
        got: dict[int, DeepAnswer] = {}

        def verify() -> None:
            remaining = [a for a in asks if a.ledger_id not in got]
            if remaining:
                req = bookie_pb2.VerifyEntriesOfLedgersRequest(ledgers=remaining)
                for msg in self.client._stub(bookie_id).VerifyEntriesOfLedgers(req, timeout=self.client.deep_deadline):
                    for v in msg.ledgers:
                        got.setdefault(v.ledger_id, interpret_verification(bookie_id, v))

        with self.client._slot(bookie_id):
            reason = self.client._retried(verify) or "the agent's stream ended without it"
        return {a.ledger_id: got.get(a.ledger_id) or DeepAnswer(reason=f"bookie {bookie_id}: {reason}")
                for a in asks}
