"""A run's findings, kept where a driver can hold millions of them.

A lost rack can leave millions of ledgers below their ack quorum, each finding a few KB as Python
objects: more than a driver has. So findings live in a private SQLite database that SQLite keeps in
memory while it fits in `CACHE_KIB` and spills to a temporary file beyond (`$SQLITE_TMPDIR`, else
`$TMPDIR`, else /var/tmp or /tmp; deleted when the findings are). The driver's passes ask it narrow
questions (the ledgers of some categories, the bookies they name) a chunk at a time, and a report is
written from it a finding at a time. At most one finding per (category, ledger): a later one replaces it.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any

from scrutiny.categories import REGISTRY, Category, worst_first
from scrutiny.checks import Violation
from scrutiny.pulsar.owners import UNKNOWN, Owner

CACHE_KIB = 8192  # SQLite's page cache per run's findings: what they cost in memory, however many
CHUNK = 10_000  # ledgers per question the driver's passes ask (each answer is held whole)
_RANK = {c: i for i, c in enumerate(worst_first())}

_SCHEMA = """
CREATE TABLE finding (
    category TEXT NOT NULL, ledger_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,             -- worst first: the registry's order
    metadata_version INTEGER NOT NULL, -- the version it was computed from
    bookies TEXT NOT NULL,             -- JSON list
    lost TEXT,                         -- JSON list of the bookies whose copies count as gone, or NULL
    owner_kind TEXT, owner_name TEXT, owner_cursor TEXT,  -- NULL kind: not known yet
    details TEXT NOT NULL,             -- JSON
    PRIMARY KEY (category, ledger_id)) WITHOUT ROWID;
CREATE INDEX finding_ledger ON finding (ledger_id);
CREATE INDEX finding_rank ON finding (rank, ledger_id);
"""
_COLUMNS = "category, ledger_id, metadata_version, bookies, details, owner_kind, owner_name, owner_cursor"


def _in(values: Collection[Any]) -> str:
    return "(" + ",".join("?" * len(values)) + ")"


class Findings:
    """Thread-safe: the auditor's web page and RPC read a report's findings while runs go on."""

    def __init__(self, found: Iterable[Violation] = ()) -> None:
        self._db = sqlite3.connect("", check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._counts: dict[Category, int] | None = None
        for pragma in (f"cache_size=-{CACHE_KIB}", "journal_mode=OFF", "synchronous=OFF", "temp_store=FILE"):
            self._db.execute(f"PRAGMA {pragma}")
        self._db.executescript(_SCHEMA)
        self.add(found)

    def __del__(self) -> None:
        # Closed with the last reference (a replaced report): the connection's statement cache holds it
        # in a cycle, which would keep the temporary file until a full garbage collection.
        with contextlib.suppress(AttributeError, sqlite3.Error):
            self._db.close()

    # -- what the driver does ----------------------------------------------------------------------

    def add(self, found: Iterable[Violation]) -> None:
        rows = [(str(v.category), v.ledger_id, _RANK[v.category], v.metadata_version, json.dumps(list(v.bookies)),
                 json.dumps(list(v.details["lost_bookies"])) if v.details.get("lost_bookies") else None,
                 *((v.owner.kind, v.owner.name, v.owner.cursor) if v.owner is not None else (None, None, None)),
                 json.dumps(dict(v.details))) for v in found]
        if rows:
            self._write("INSERT OR REPLACE INTO finding VALUES (?,?,?,?,?,?,?,?,?,?)", rows)

    def drop(self, ledger_ids: Iterable[int], only: Collection[Category] | None = None) -> int:
        """The findings of these ledgers (of the categories `only`, else all); how many there were."""
        where = "ledger_id = ?" + (f" AND category IN {_in(only)}" if only is not None else "")
        extra = [str(c) for c in only] if only is not None else []
        return self._write(f"DELETE FROM finding WHERE {where}", ((lid, *extra) for lid in ledger_ids))

    def set_owners(self, owners: Mapping[int, Owner]) -> None:
        """Owners for the findings that had none yet."""
        self._write("UPDATE finding SET owner_kind = ?, owner_name = ?, owner_cursor = ? "
                    "WHERE ledger_id = ? AND owner_kind IS NULL",
                    [(o.kind, o.name, o.cursor, lid) for lid, o in owners.items()])

    def _write(self, sql: str, rows: Iterable[tuple[Any, ...]]) -> int:
        with self._lock:
            self._counts = None
            self._db.execute("BEGIN")
            try:
                return self._db.executemany(sql, rows).rowcount
            finally:
                # No journal (a million deletes would copy the database into it), so no rollback either:
                # the driver's writes come from what it already holds, never from I/O that can fail.
                self._db.execute("COMMIT")

    def _query(self, sql: str, args: Iterable[Any] = ()) -> list[Any]:
        with self._lock:
            return self._db.execute(sql, tuple(args)).fetchall()

    # -- the driver's questions, a chunk of ledgers at a time ------------------------------------------

    def ledger_chunks(self, categories: Collection[Category] | None = None, unowned: bool = False,
                      chunk: int = CHUNK) -> Iterator[list[tuple[int, int, int]]]:
        """(ledger, least and greatest metadata version of its findings), ascending, for the ledgers
        with findings of `categories` (else any) or without an owner yet. The findings may change
        between chunks: each chunk starts after the last ledger of the one before."""
        where = []
        extra: list[Any] = [str(c) for c in categories or ()]
        if categories is not None:
            where.append(f"category IN {_in(categories)}")
        if unowned:
            where.append("owner_kind IS NULL")
        after = -1
        while True:
            rows = self._query("SELECT ledger_id, MIN(metadata_version), MAX(metadata_version) FROM finding "
                               f"WHERE {' AND '.join([*where, 'ledger_id > ?'])} "
                               "GROUP BY ledger_id ORDER BY ledger_id LIMIT ?", [*extra, after, chunk])
            if not rows:
                return
            yield rows
            after = rows[-1][0]

    def naming(self, bookies: Collection[str], lost: bool = False, categories: Collection[Category] | None = None,
               or_none: bool = False) -> dict[int, tuple[str, ...]]:
        """Ledger -> the bookies its finding names (`lost`: those whose copies it counts as gone), for
        the findings (of `categories`) that name any of `bookies`, or (`or_none`) name no bookie."""
        column = "lost" if lost else "bookies"
        where = [f"{column} IS NOT NULL"]
        args: list[Any] = []
        if categories is not None:
            where.append(f"category IN {_in(categories)}")
            args += [str(c) for c in categories]
        if not bookies and not or_none:
            return {}
        where.append(f"(EXISTS (SELECT 1 FROM json_each({column}) WHERE value IN {_in(bookies)})"
                     + (f" OR json_array_length({column}) = 0)" if or_none else ")"))
        args += list(bookies)
        out: dict[int, tuple[str, ...]] = {}
        for lid, named in self._query(f"SELECT ledger_id, {column} FROM finding WHERE {' AND '.join(where)}", args):
            out[lid] = tuple(sorted({*out.get(lid, ()), *json.loads(named)}))
        return out

    def named(self, lost: bool = False, categories: Collection[Category] | None = None) -> set[str]:
        """Every bookie the findings (of `categories`) name, or count as gone (`lost`)."""
        column = "lost" if lost else "bookies"
        where = f"WHERE category IN {_in(categories)}" if categories is not None else ""
        return {b for (b,) in self._query(f"SELECT DISTINCT j.value FROM finding, json_each(finding.{column}) j "
                                          f"{where}", [str(c) for c in categories or ()])}

    def agents_asked(self) -> set[tuple[str, str | None]]:
        """(bookie, the address its agent was asked at: None for its default port) of the BOOKIE_UNAVAILABLE
        findings."""
        return {(b, a) for b, a in self._query(
            "SELECT DISTINCT j.key, j.value FROM finding, json_each(finding.details, '$.agents') j "
            "WHERE category = ?", [str(Category.BOOKIE_UNAVAILABLE)])}

    def asked_at(self, bookie: str, address: str | None) -> list[int]:
        """The ledgers of the BOOKIE_UNAVAILABLE findings whose bookie's agent was asked at `address`."""
        return [lid for (lid,) in self._query(
            "SELECT ledger_id FROM finding, json_each(finding.details, '$.agents') j "
            "WHERE category = ? AND j.key = ? AND j.value IS ?", [str(Category.BOOKIE_UNAVAILABLE), bookie, address])]

    def topics(self, categories: Collection[Category]) -> set[str]:
        return {n for (n,) in self._query("SELECT DISTINCT owner_name FROM finding WHERE owner_kind = 'topic' "
                                          f"AND category IN {_in(categories)}", [str(c) for c in categories])}

    def any_unowned(self) -> bool:
        return bool(self._query("SELECT 1 FROM finding WHERE owner_kind IS NULL LIMIT 1"))

    # -- what a report asks ----------------------------------------------------------------------

    def __len__(self) -> int:
        return sum(self.counts().values())

    def __bool__(self) -> bool:
        return len(self) > 0

    def __iter__(self) -> Iterator[Violation]:
        """Every finding by (category, ledger), a chunk at a time."""
        return self._walk(None)

    def of_category(self, category: Category) -> Iterator[Violation]:
        return self._walk(category)

    def _walk(self, category: Category | None) -> Iterator[Violation]:
        after: tuple[str, int] = (str(category or ""), -1)
        where = "category = ? AND ledger_id > ?" if category else "(category, ledger_id) > (?, ?)"
        while True:
            rows = self._query(f"SELECT {_COLUMNS} FROM finding WHERE {where} ORDER BY category, ledger_id LIMIT ?",
                               [*after, CHUNK])
            yield from map(_violation, rows)
            if len(rows) < CHUNK:
                return
            after = (rows[-1][0], rows[-1][1])

    def counts(self) -> dict[Category, int]:
        """Ledgers per category (a finding is one ledger in one category)."""
        with self._lock:
            if self._counts is None:
                self._counts = {Category(c): n for c, n in self._db.execute(
                    "SELECT category, COUNT(*) FROM finding GROUP BY category")}
            return dict(self._counts)

    def per_owner(self) -> dict[Owner, dict[Category, int]]:
        """Ledgers per category of each owner (findings without one count as the unknown owner's)."""
        out: dict[Owner, dict[Category, int]] = {}
        for kind, name, cursor, cat, n in self._query(
                "SELECT owner_kind, owner_name, owner_cursor, category, COUNT(*) FROM finding "
                "GROUP BY owner_kind, owner_name, owner_cursor, category"):
            owner = Owner(kind, name, cursor) if kind is not None else UNKNOWN
            per = out.setdefault(owner, {})
            per[Category(cat)] = per.get(Category(cat), 0) + n
        return out

    def any_with_detail(self, key: str) -> bool:
        return bool(self._query("SELECT 1 FROM finding WHERE json_type(details, ?) IS NOT NULL LIMIT 1",
                                [f"$.{key}"]))

    def worst(self, limit: int, offset: int = 0, category: str = "", topic: str = "",
              bookie: str | tuple[str, ...] = "", ledger_id: int | None = None) -> tuple[int, list[Violation]]:
        """(how many match, a page of them worst first) for the findings of a category, a topic, a
        bookie (or any of several: a rack's) or a ledger (each when given)."""
        cond, args = _filter(category, topic, bookie, ledger_id)
        total = self._query(f"SELECT COUNT(*) FROM finding WHERE {cond}", args)[0][0]
        rows = self._query(f"SELECT {_COLUMNS} FROM finding WHERE {cond} ORDER BY rank, ledger_id LIMIT ? OFFSET ?",
                           [*args, limit, offset])
        return total, [_violation(r) for r in rows]

    def per_topic(self, limit: int, category: str = "", topic: str = "",
                  bookie: str | tuple[str, ...] = "") -> list[tuple[str, int, dict[str, int]]]:
        """(topic or "", ledgers with a finding, {category: ledgers}) of the matching findings, one row a topic:
        the topic with the worst finding first, then the most ledgers; its categories worst first."""
        cond, args = _filter(category, topic, bookie, None)
        topics = self._query("SELECT COALESCE(owner_name, ''), COUNT(DISTINCT ledger_id) FROM finding "
                             f"WHERE {cond} GROUP BY 1 ORDER BY MIN(rank), 2 DESC, 1 LIMIT ?", [*args, limit])
        per: dict[str, dict[str, int]] = {t: {} for t, _ in topics}
        for t, cat, n in self._query("SELECT COALESCE(owner_name, ''), category, COUNT(*) FROM finding "
                                     f"WHERE {cond} GROUP BY 1, 2 ORDER BY MIN(rank)", args):
            if t in per:
                per[t][cat] = n
        return [(t, n, per[t]) for t, n in topics]


def _filter(category: str, topic: str, bookie: str | tuple[str, ...],
            ledger_id: int | None) -> tuple[str, list[Any]]:
    where, args = ["1"], []
    for clause, value, wanted in (("category = ?", category, bool(category)),
                                  ("owner_name = ?", topic, bool(topic)),
                                  ("ledger_id = ?", ledger_id, ledger_id is not None)):
        if wanted:
            where.append(clause)
            args.append(value)
    if bookie != "":
        names = (bookie,) if isinstance(bookie, str) else bookie
        marks = ", ".join("?" * len(names)) or "NULL"  # a rack without bookies matches nothing
        where.append(f"EXISTS (SELECT 1 FROM json_each(bookies) WHERE value IN ({marks}))")
        args += names
    return " AND ".join(where), args

def _violation(row: tuple[Any, ...]) -> Violation:
    cat, lid, version, bookies, details, kind, name, cursor = row
    return Violation(Category(cat), lid, tuple(json.loads(bookies)), json.loads(details), version,
                     Owner(kind, name, cursor) if kind is not None else None)


assert set(_RANK) == set(REGISTRY)
