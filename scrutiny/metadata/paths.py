"""BookKeeper's tree: the ledger paths of every layout, the LAYOUT znode, which children are ledgers, and
what a change at a path means (continuous scrutiny's watch)."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from scrutiny.errors import MetadataError
from scrutiny.metadata.marks import ledger_id_of_mark

DEFAULT_ROOT = "/ledgers"
SHORT_PATH_LIMIT = 2147483647  # ids from here on take the long (3-4-4-4-4) hierarchical path
NON_LEDGER_CHILDREN = frozenset(
    {"available", "cookies", "LAYOUT", "INSTANCEID", "underreplication", "idgen", "idgen-long"}
)


class Layout(enum.StrEnum):
    FLAT = "flat"
    HIERARCHICAL = "hierarchical"
    LONG_HIERARCHICAL = "longhierarchical"


def ledger_path(layout: Layout, root: str, ledger_id: int) -> str:
    if ledger_id < 0:
        raise ValueError(f"negative ledger id {ledger_id}")
    if layout is Layout.FLAT:
        return f"{root}/L{ledger_id:010d}"
    if layout is Layout.HIERARCHICAL and ledger_id < SHORT_PATH_LIMIT:
        s = f"{ledger_id:010d}"
        return f"{root}/{s[0:2]}/{s[2:6]}/L{s[6:10]}"
    s = f"{ledger_id:019d}"
    return f"{root}/{s[0:3]}/{s[3:7]}/{s[7:11]}/{s[11:15]}/L{s[15:19]}"


def ledger_paths(layout: Layout, root: str, ledger_ids: Iterable[int]) -> Iterator[tuple[int, str]]:
    """Each ledger with its path, as `ledger_path` makes it; the ids that share a leaf bucket share its prefix,
    made once (a range's ids are one bucket's, and every read of a scan asks for a path)."""
    bucket: tuple[int, bool] | None = None
    prefix = ""
    for lid in ledger_ids:
        if layout is Layout.FLAT or lid < 0:
            yield lid, ledger_path(layout, root, lid)
            continue
        leaf, within = divmod(lid, 10_000)
        form = (leaf, lid < SHORT_PATH_LIMIT)  # (a leaf bucket may straddle the short form's limit)
        if form != bucket:
            bucket, prefix = form, ledger_path(layout, root, lid)[:-4]
        yield lid, f"{prefix}{within:04d}"


def is_ledger_child(name: str) -> bool:
    """Children of the root that can be ledgers or ledger buckets."""
    return name not in NON_LEDGER_CHILDREN and not name.startswith("ID-")


_LAYOUT_CLASSES = {
    "HierarchicalLedgerManagerFactory": Layout.HIERARCHICAL,
    "LegacyHierarchicalLedgerManagerFactory": Layout.HIERARCHICAL,
    "LongHierarchicalLedgerManagerFactory": Layout.LONG_HIERARCHICAL,
    "FlatLedgerManagerFactory": Layout.FLAT,
    "PulsarLedgerManagerFactory": Layout.HIERARCHICAL,  # Pulsar's metadata-store driver: the same hybrid tree
}


def parse_layout(data: bytes) -> Layout:
    """The LAYOUT znode: `2\\n<factory class>:<version>`."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise MetadataError("LAYOUT znode is not text") from None
    lines = text.strip().split("\n")
    if len(lines) != 2 or ":" not in lines[1]:
        raise MetadataError(f"LAYOUT znode is not '<version>\\n<factory>:<version>': {text[:80]!r}")
    cls = lines[1].rsplit(":", 1)[0].rsplit(".", 1)[-1]
    if cls not in _LAYOUT_CLASSES:
        raise MetadataError(f"LAYOUT names an unknown ledger manager factory {cls!r}")
    return _LAYOUT_CLASSES[cls]


def format_layout(layout: Layout) -> bytes:
    cls = {
        Layout.HIERARCHICAL: "HierarchicalLedgerManagerFactory",
        Layout.LONG_HIERARCHICAL: "LongHierarchicalLedgerManagerFactory",
        Layout.FLAT: "FlatLedgerManagerFactory",
    }[layout]
    return f"2\norg.apache.bookkeeper.meta.{cls}:1".encode()


@dataclass(frozen=True, slots=True)
class TreeChange:
    """A change below the ledgers root that continuous scrutiny acts on."""

    # "ledger" (its metadata), "mark" (its under-replication mark), "registration" (a bookie's), "cookie"
    # (a bookie's), "replication" (lostBookieRecoveryDelay, or re-replication disabled)
    what: str
    event: str  # created | changed | deleted
    ledger_id: int = -1
    bookie_id: str = ""


def tree_change(root: str, event: str, path: str) -> TreeChange | None:
    """What a create, change or delete at `path` (below `root`) is, in any ledger layout; None for the rest
    (buckets, locks, cookies, the layout...)."""
    if not path.startswith(root + "/"):
        return None
    parts = path[len(root) + 1:].split("/")
    if parts[0] == "available" and len(parts) in (2, 3) and parts[-1] != "readonly" \
            and (len(parts) == 2 or parts[1] == "readonly"):
        return TreeChange("registration", event, bookie_id=parts[-1])
    if parts[0] == "cookies" and len(parts) == 2:
        return TreeChange("cookie", event, bookie_id=parts[1])
    if parts in (["underreplication", "lostBookieRecoveryDelay"], ["underreplication", "disable"]):
        return TreeChange("replication", event)
    if parts[:2] == ["underreplication", "ledgers"] and len(parts) == 7:
        lid = ledger_id_of_mark(parts[-1])
        return None if lid is None else TreeChange("mark", event, lid)
    last = parts[-1]
    if is_ledger_child(parts[0]) and last.startswith("L") and last[1:].isdigit() \
            and all(p.isdigit() for p in parts[:-1]) and len(parts) in (1, 3, 5):
        return TreeChange("ledger", event, int("".join(parts[:-1]) + last[1:]))
    return None

