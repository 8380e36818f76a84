"""Kept for operators' scripts that import `scrutiny.owners`: which Pulsar topic owns a ledger now lives in
`scrutiny.pulsar` (`owners`, `records`; `snapshot.PulsarRecord` replaces `PulsarOwners`)."""

from scrutiny.pulsar.owners import KINDS, UNKNOWN, Owner, owner_from_custom_metadata
from scrutiny.pulsar.records import COMPACTED_LEDGER_PROPERTY, COMPACTION_CURSOR, managed_ledger_of, topic_of

__all__ = ["COMPACTED_LEDGER_PROPERTY", "COMPACTION_CURSOR", "KINDS", "UNKNOWN", "Owner", "managed_ledger_of",
           "owner_from_custom_metadata", "topic_of"]
