"""What Pulsar's transactions keep in managed ledgers of their own, told apart by their names (Pulsar's
`SystemTopicNames`, `MLPendingAckStore`): each coordinator's log, each subscription's acknowledgements pending in
transactions, each namespace's transaction buffer snapshots. A ledger of theirs that BookKeeper lost means
something for transactions, not for a topic's messages. Pure."""

from __future__ import annotations

import re

_COORDINATOR_LOG = re.compile(r"^persistent://pulsar/system/__transaction_log_(\d+)$")
PENDING_ACK_SUFFIX = "__transaction_pending_ack"  # <topic>-<subscription>__transaction_pending_ack
SNAPSHOT_TOPICS = ("__transaction_buffer_snapshot", "__transaction_buffer_snapshot_segments",
                   "__transaction_buffer_snapshot_indexes")

_DEPENDS = {
    "coordinator-log": "transaction coordinator {coordinator}'s log: the coordinator cannot replay it, so the states "
                       "of its transactions are lost: one still open is never committed nor aborted, and each topic "
                       "it wrote on holds its consumers before its first message",
    "pending-ack": "the subscription's acknowledgements pending in transactions: its pending-ack log cannot be "
                   "replayed, and the subscription cannot load",
    "buffer-snapshots": "the namespace's transaction buffer snapshots (each topic's aborted transactions): a topic "
                        "whose snapshot was in it cannot recover its transaction buffer from it",
}


def transaction_role(topic: str) -> dict[str, object]:
    """What a managed ledger is to Pulsar's transactions (`{"transactions": role, ...}`), or {} for a topic's."""
    if m := _COORDINATOR_LOG.match(topic):
        return {"transactions": "coordinator-log", "coordinator": int(m.group(1))}
    if topic.endswith(PENDING_ACK_SUFFIX):
        return {"transactions": "pending-ack"}
    if topic.rsplit("/", 1)[-1] in SNAPSHOT_TOPICS:
        return {"transactions": "buffer-snapshots"}
    return {}


def transaction_depends(role: dict[str, object]) -> str:
    """What losing one of the ledgers of a managed ledger with this role means."""
    return _DEPENDS[str(role["transactions"])].format(**role)
