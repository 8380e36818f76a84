"""BookKeeper's metadata as it is stored in ZooKeeper (and in Pulsar's metadata store): pure parsing and
formatting, no I/O. Everything here turns stored bytes into immutable snapshots (or back, for the cluster
writer), and raises MetadataError with a message that names the znode or ledger when the bytes are wrong.

- `ledger`: a ledger's metadata (v1, v2, v3);
- `paths`: the tree (ledger paths of every layout, LAYOUT, what a change at a path means);
- `uri`: where the metadata is (metadata service URIs) and HOST:PORT;
- `marks`: under-replication marks;
- `bookies`: registrations, racks, the agents' registrations.
"""

from __future__ import annotations

from scrutiny.errors import MetadataError
from scrutiny.metadata.bookies import (
    DEFAULT_RACK,
    DEFAULT_REGION_LOCATION,
    DEFAULT_ZONE_LOCATION,
    BookieRegistration,
    Endpoint,
    decode_agent_registration,
    decode_bookie_service_info,
    decode_racks,
    encode_agent_registration,
    encode_bookie_service_info,
    encode_racks,
    normalize_rack,
)
from scrutiny.metadata.ledger import (
    HEADER_PREFIX,
    IN_RECOVERY_V1,
    MAX_ENSEMBLE_SIZE,
    LedgerMetadata,
    LedgerState,
    Segment,
    decode_ledger_metadata,
    encode_ledger_metadata,
    inconsistencies,
    snapshot,
)
from scrutiny.metadata.marks import (
    UnderreplicationMark,
    decode_ur_mark,
    encode_ur_mark,
    ledger_id_of_mark,
    ur_mark_path,
)
from scrutiny.metadata.paths import (
    DEFAULT_ROOT,
    NON_LEDGER_CHILDREN,
    SHORT_PATH_LIMIT,
    Layout,
    TreeChange,
    format_layout,
    is_ledger_child,
    ledger_path,
    ledger_paths,
    parse_layout,
    tree_change,
)
from scrutiny.metadata.uri import (
    PULSAR_STORE_PREFIX,
    MetadataServiceUri,
    parse_host_port,
    parse_metadata_service_uri,
    store_scheme,
)

__all__ = [
    "DEFAULT_RACK",
    "DEFAULT_REGION_LOCATION",
    "DEFAULT_ROOT",
    "DEFAULT_ZONE_LOCATION",
    "HEADER_PREFIX",
    "IN_RECOVERY_V1",
    "MAX_ENSEMBLE_SIZE",
    "NON_LEDGER_CHILDREN",
    "PULSAR_STORE_PREFIX",
    "SHORT_PATH_LIMIT",
    "BookieRegistration",
    "Endpoint",
    "Layout",
    "LedgerMetadata",
    "LedgerState",
    "MetadataError",
    "MetadataServiceUri",
    "Segment",
    "TreeChange",
    "UnderreplicationMark",
    "decode_agent_registration",
    "decode_bookie_service_info",
    "decode_ledger_metadata",
    "decode_racks",
    "decode_ur_mark",
    "encode_agent_registration",
    "encode_bookie_service_info",
    "encode_ledger_metadata",
    "encode_racks",
    "encode_ur_mark",
    "format_layout",
    "inconsistencies",
    "is_ledger_child",
    "ledger_id_of_mark",
    "ledger_path",
    "ledger_paths",
    "normalize_rack",
    "parse_host_port",
    "parse_layout",
    "parse_metadata_service_uri",
    "snapshot",
    "store_scheme",
    "tree_change",
    "ur_mark_path",
]
