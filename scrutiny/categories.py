"""Checks as data: every violation category, once, with what it means for the run, the report and
the metrics. The analysis, the report, the text rendering and every metrics sink iterate this
registry; a new category is one entry here (and the check that produces it)."""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


class Category(enum.StrEnum):
    PLACEMENT_POLICY_NOT_ADHERING = "PLACEMENT_POLICY_NOT_ADHERING"
    PLACEMENT_POLICY_SOFTLY_ADHERING = "PLACEMENT_POLICY_SOFTLY_ADHERING"
    NO_REPLICA_OF_AN_ENTRY = "NO_REPLICA_OF_AN_ENTRY"
    LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY = "LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY"
    LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY = "LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY"
    UNDERREPLICATED_ELAPSED_GRACE_PERIOD = "UNDERREPLICATED_ELAPSED_GRACE_PERIOD"
    BOOKIE_UNAVAILABLE = "BOOKIE_UNAVAILABLE"
    INVALID_METADATA = "INVALID_METADATA"
    INVALID_BOOKIE_RESPONSE = "INVALID_BOOKIE_RESPONSE"
    WOULD_HAVE_NO_REPLICA_OF_AN_ENTRY = "WOULD_HAVE_NO_REPLICA_OF_AN_ENTRY"
    WOULD_HAVE_LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY = "WOULD_HAVE_LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY"
    WOULD_HAVE_LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY = "WOULD_HAVE_LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY"
    CORRUPT_ENTRY = "CORRUPT_ENTRY"
    DIVERGENT_COPIES = "DIVERGENT_COPIES"
    PULSAR_CHECKSUM_MISMATCH = "PULSAR_CHECKSUM_MISMATCH"
    PULSAR_DEDUP_STATE_AHEAD_OF_DATA = "PULSAR_DEDUP_STATE_AHEAD_OF_DATA"
    PULSAR_REPEAT_UNDER_DEDUP = "PULSAR_REPEAT_UNDER_DEDUP"
    WEAK_DURABILITY_POLICY = "WEAK_DURABILITY_POLICY"
    ENTRIES_PAST_THE_CLOSE = "ENTRIES_PAST_THE_CLOSE"
    ORPHAN_LEDGER = "ORPHAN_LEDGER"
    LOST_BOOKIE_RECOVERY_NOT_STARTED = "LOST_BOOKIE_RECOVERY_NOT_STARTED"
    TOPIC_LEDGER_MISSING = "TOPIC_LEDGER_MISSING"
    CURSOR_POSITION_NOT_IN_TOPIC = "CURSOR_POSITION_NOT_IN_TOPIC"
    TOPIC_ENTRY_COUNT_MISMATCH = "TOPIC_ENTRY_COUNT_MISMATCH"
    TOPIC_HEAD_LEDGER_CLOSED = "TOPIC_HEAD_LEDGER_CLOSED"
    TOPIC_WRITTEN_PAST_CLOSED_HEAD = "TOPIC_WRITTEN_PAST_CLOSED_HEAD"
    LEAKED_LEDGER = "LEAKED_LEDGER"
    UNMARKED_WITHOUT_REPAIR = "UNMARKED_WITHOUT_REPAIR"


class Severity(enum.StrEnum):
    ERROR = "error"  # the exit status says violations
    WARNING = "warning"  # reported and counted, the exit status stays 0


class Phase(enum.StrEnum):
    """Which part of a run produces the category."""

    LEDGERS = "ledgers"  # the per-range analysis of every ledger (the full run)
    MARKS = "marks"  # the under-replication marks (also the cheap periodic job)
    WHATIF = "whatif"  # only a what-if run: were these bookies (racks) down, what would be at risk?
    DEEP = "deep"  # only a deep run: the stored bytes of the copies, read and verified by the agents
    HOLDINGS = "holdings"  # a whole-cluster run: what every bookie holds, against the metadata (reverse check)
    TOPICS = "topics"  # whole-cluster and topic runs: Pulsar's record of each topic against BookKeeper's metadata
    REPAIR = "repair"  # the hand-off's follow-up of each mark it wrote, to its end (`scrutiny.repair`)


class Fact(enum.StrEnum):
    """What a finding rests on; each must still be true when the finding is reported."""

    METADATA = "metadata"  # the ledger's metadata znode, at the version the finding was computed from
    NOT_MARKED = "not_marked"  # the ledger is not marked under-replicated (BP-34: then it is being repaired)
    ANSWERS = "answers"  # the bookies' answers: asked again, after the delay when some bookie was silent
    MARK = "mark"  # the under-replication mark itself, with the same ctime
    RACKS = "racks"  # the racks of the ledger's bookies
    REGISTRATIONS = "registrations"  # a blamed bookie still registered; one whose copies count as gone still not
    AGENTS = "agents"  # a silent bookie's agent registered where it was asked, or nowhere (not come back elsewhere)
    ABSENT = "absent"  # the ledger still absent from the metadata, still held by the bookie, absent since long enough
    # the topic's record (managed ledger, cursors, schema) read again, then BookKeeper's metadata of the
    # ledgers it names: a ledger is created before a record names it and deleted after it is dropped from it
    TOPIC_RECORD = "topic_record"


@dataclass(frozen=True)
class CategorySpec:
    category: Category
    phase: Phase
    severity: Severity
    facts: frozenset[Fact]
    summary: str  # one line: when the category is reported
    describe: Callable[[Mapping[str, Any]], list[str]]  # the details of one violation, for people
    bookkeeper_gauge: str = ""  # upstream auditor gauge with the same meaning (operators' dashboards)
    rank: float = 50  # how bad, for "worst first" (lower is worse)
    unsafe: bool = False  # a what-if finding that makes taking the bookies down unsafe

    @property
    def warning(self) -> bool:
        return self.severity is Severity.WARNING


def plural(n: int, word: str, words: str = "") -> str:
    """'1 entry', '2 entries'; `words` where adding an s is wrong."""
    return f"{n} {word}" if n == 1 else f"{n:,} {words or word + 's'}"


_GRPC_WORDS = (
    ("slow: the agent answers", "slow: its agent is up but did not answer in time"),
    ("DEADLINE_EXCEEDED", "did not answer in time"),
    ("failed to connect", "its agent could not be reached (connection refused or no route)"),
    ("Connection refused", "its agent refused the connection"),
    ("no address", "no agent address is known for it (not registered, no bookie_endpoints entry)"),
    ("UNAVAILABLE", "its agent could not be reached"),
    ("UNAUTHENTICATED", "its agent refused our credentials"),
    ("PERMISSION_DENIED", "its agent refused our credentials"),
    ("UNIMPLEMENTED", "its agent does not serve this call"),
    ("RESOURCE_EXHAUSTED", "its agent is out of resources (answer too large or too many calls)"),
    ("stream ended", "its agent ended the answer early"),
)


def in_words(reason: str) -> str:
    """A bookie's silence as an operator says it; the raw gRPC text stays in the JSON report."""
    for marker, words in _GRPC_WORDS:
        if marker in reason:
            return words
    return re.sub(r"^bookie \S+: ", "", reason) or "no answer"


def _coverage(d: Mapping[str, Any]) -> list[str]:
    out = []
    for r in d.get("under_covered", [])[:5]:
        shape = (f"every {r['sequence_period']} from {r['first_entry']}, {r['sequence_size']} at a time"
                 if r["sequence_period"] else "contiguous")
        count = plural(r["entries"], "entry", "entries")
        out.append(f"entries {r['first_entry']}-{r['last_entry']} ({count}, {shape}): "
                   f"{r['copies']} of {d['write_quorum']} copies, missing on {', '.join(r['missing_bookies'])}")
    if len(d.get("under_covered", [])) > 5 or d.get("under_covered_truncated"):
        out.append("... more ranges in the JSON report")
    return out


def _placement(d: Mapping[str, Any]) -> list[str]:
    return [f"segment at entry {s['first_entry_id']}: {s['result']}: {s['reason']}" for s in d.get("segments", [])[:3]]


def _age(d: Mapping[str, Any]) -> list[str]:
    return [f"marked {d['age_seconds']} s ago, grace period {d['grace_period_seconds']} s"]


def _unmarked(d: Mapping[str, Any]) -> list[str]:
    return [f"marked under-replicated at {d.get('marked_at')} for {', '.join(d.get('replicas', []))}, unmarked by "
            f"{d.get('unmarked_by')} by {d.get('unmarked_seen_at')}; still {d.get('loss')}",
            *([f"why: {d['cause']}"] if d.get("cause") else [])]


def _reasons(d: Mapping[str, Any]) -> list[str]:
    return [f"{b}: {in_words(str(r))}" for b, r in d.get("reasons", {}).items()]  # the raw error in the JSON


def _answers(d: Mapping[str, Any]) -> list[str]:
    return [str(r) for r in d.get("answers", {}).values()]


def _corrupt(d: Mapping[str, Any]) -> list[str]:
    out = []
    for b, c in list(d.get("copies", {}).items())[:5]:
        reasons = ", ".join(f"{r} {n}" for r, n in c["reasons"].items())
        out.append(f"{b}: {plural(c['count'], 'entry', 'entries')} {_ranges(c['entries'])} ({reasons}); {c['example']}")
    return out


def _divergent(d: Mapping[str, Any]) -> list[str]:
    groups = "; ".join(f"{', '.join(bs)}" for bs in d.get("first_entry_copies", {}).values())
    return [f"{plural(d.get('count', 0), 'entry', 'entries')} {_ranges(d.get('entries', []))} differ; "
            f"first entry's copies: {groups}"]


def _pulsar_crc(d: Mapping[str, Any]) -> list[str]:
    out = [f"{b}: {plural(c['count'], 'entry', 'entries')} {_ranges(c['entries'])}; {c['example']}"
           for b, c in list(d.get("copies", {}).items())[:5]]
    out += [f"entry {m['entry_id']}: producer {m['producer']}, sequence ids {m['sequence_ids'][0]}-"
            f"{m['sequence_ids'][1]}" for m in d.get("messages", [])[:3]]
    return out


def _dedup_ahead(d: Mapping[str, Any]) -> list[str]:
    through = f"through ledger {d['horizon']}" if "horizon" in d else "up to it"
    return [f"producer {p['producer']}: persisted {p['persisted']} by deduplication's snapshot at "
            f"{d.get('dedup_snapshot')}, the highest stored {through} is {p['highest_stored']} (last seen at "
            f"{p['last_seen']})" for p in d.get("producers", [])[:5]]


def _repeat_under_dedup(d: Mapping[str, Any]) -> list[str]:
    return [f"producer {p['producer']}: {plural(p['count'], 'repeat')}, first at entry {p['entry_id']} (sequence id "
            f"{p['sequence_id']}, {p['highest_before']} already persisted)" for p in d.get("producers", [])[:5]]


def _ranges(ranges: list[list[int]]) -> str:
    shown = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges[:5])
    return shown + (", ..." if len(ranges) > 5 else "")


def _policy(d: Mapping[str, Any]) -> list[str]:
    return [f"E {d['ensemble_size']}, WQ {d['write_quorum']}, AQ {d['ack_quorum']}: {r}" for r in d.get("reasons", [])]


def _past_the_close(d: Mapping[str, Any]) -> list[str]:
    (first, last), = d["entries"]
    return [f"entries {first}-{last} ({d['count']}) above lastEntryId {d['last_entry_id']} have at least "
            f"{d['least_copies']} copies (AQ {d['ack_quorum']}) on {', '.join(d['ensemble'])}: a writer may have had "
            f"them acknowledged; readers never see them"]


def _orphan(d: Mapping[str, Any]) -> list[str]:
    held = [f"{b}: {plural(h['entries'], 'entry', 'entries')}" + (f", {h['bytes']:,} bytes" if "bytes" in h else "")
            for b, h in sorted(d.get("held_by", {}).items())]
    return [*held, f"absent from the metadata since at least {d['absent_since']} ({d['absent_seconds']} s, grace "
                   f"{d['grace_period_seconds']} s)"]


def _lost(d: Mapping[str, Any]) -> list[str]:
    since = ", ".join(f"{b} since {t or 'this run'}" for b, t in d.get("seen_gone_since", {}).items())
    risk = "below AQ: data at risk now" if d.get("below_ack_quorum") else "still at AQ or more"
    off = "; replication is disabled (underreplication/disable)" if d.get("replication_disabled") else ""
    return [f"unregistered: {since}; not marked under-replicated after lostBookieRecoveryDelay "
            f"{d.get('lost_bookie_recovery_delay_seconds')} s + grace {d.get('grace_period_seconds')} s{off}",
            f"{d.get('least_copies')} of {d.get('write_quorum')} copies left on registered bookies ({risk})"]


def _topic_ledger(d: Mapping[str, Any]) -> list[str]:
    held = (f"; the record says {plural(d['entries'], 'entry', 'entries')}" if "entries" in d else "") + (
        f", {d['bytes']:,} bytes" if "bytes" in d else "")
    whose = (f" of subscription {d['subscription']}" if "subscription" in d else "") + (
        f" (schema version {d['schema_version']})" if "schema_version" in d else "")
    return [f"{d['topic']}: its {d['kind']} ledger{whose} is not in BookKeeper's metadata{held}",
            f"depends on it: {d['depends']}"]


def _cursor_position(d: Mapping[str, Any]) -> list[str]:
    return [f"{d['topic']}, subscription {p['subscription']}: {p['what']} at {p['position']}: {p['reason']}"
            for p in d.get("positions", [])[:5]]


def _entry_count(d: Mapping[str, Any]) -> list[str]:
    return [f"{d['topic']}: the record gives {plural(d['record_entries'], 'entry', 'entries')}, BookKeeper's "
            f"closed ledger {d['bookkeeper_entries']} (lastEntryId {d['bookkeeper_last_entry_id']})"]


def _head_closed(d: Mapping[str, Any]) -> list[str]:
    return [f"{d['topic']}: the record's open head ledger is closed in BookKeeper at lastEntryId "
            f"{d['bookkeeper_last_entry_id']}", *d.get("evidence", [])]


def _leaked(d: Mapping[str, Any]) -> list[str]:
    held = [f"{b}: {plural(h['entries'], 'entry', 'entries')}" + (f", {h['bytes']:,} bytes" if "bytes" in h else "")
            for b, h in sorted(d.get("held_by", {}).items())]
    return [f"Pulsar's {d['kind']} ledger of {d['owner']}, named by no topic, cursor, schema or compaction; "
            f"{d['age_seconds']:,} s old by {d['age_from']} (grace {d['grace_period_seconds']} s)", *held]


def _error(d: Mapping[str, Any]) -> list[str]:
    return [str(d["error"])] if "error" in d else []


_ANALYSED = frozenset({Fact.METADATA, Fact.NOT_MARKED})
_RECORDED = frozenset({Fact.TOPIC_RECORD})
_ANSWERED = _ANALYSED | {Fact.ANSWERS, Fact.REGISTRATIONS}
_PLACED = _ANALYSED | {Fact.RACKS}

REGISTRY: dict[Category, CategorySpec] = {s.category: s for s in (
    CategorySpec(Category.PLACEMENT_POLICY_NOT_ADHERING, Phase.LEDGERS, Severity.ERROR, _PLACED,
                 "some segment's ensemble FAILs the placement policy", _placement,
                 "NUM_LEDGERS_NOT_ADHERING_TO_PLACEMENT_POLICY", 7),
    CategorySpec(Category.PLACEMENT_POLICY_SOFTLY_ADHERING, Phase.LEDGERS, Severity.WARNING, _PLACED,
                 "no FAIL, some MEETS_SOFT", _placement, "NUM_LEDGERS_SOFTLY_ADHERING_TO_PLACEMENT_POLICY", 8),
    CategorySpec(Category.NO_REPLICA_OF_AN_ENTRY, Phase.LEDGERS, Severity.ERROR, _ANSWERED,
                 "some entry has no copy on its write set", _coverage, "NUM_LEDGERS_HAVING_NO_REPLICA_OF_AN_ENTRY", 0),
    CategorySpec(Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY, Phase.LEDGERS, Severity.ERROR, _ANSWERED,
                 "else, some entry has fewer than AQ copies", _coverage,
                 "NUM_LEDGERS_HAVING_LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", 1),
    CategorySpec(Category.LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY, Phase.LEDGERS, Severity.ERROR, _ANSWERED,
                 "else, some entry has fewer than WQ copies", _coverage,
                 "NUM_LEDGERS_HAVING_LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY", 3),
    CategorySpec(Category.UNDERREPLICATED_ELAPSED_GRACE_PERIOD, Phase.MARKS, Severity.ERROR, frozenset({Fact.MARK}),
                 "marked under-replicated for longer than the grace period", _age,
                 "NUM_UNDERREPLICATED_LEDGERS_ELAPSED_RECOVERY_GRACE_PERIOD", 2),
    CategorySpec(Category.BOOKIE_UNAVAILABLE, Phase.LEDGERS, Severity.ERROR, _ANSWERED | {Fact.AGENTS},
                 "a registered bookie of the ledger's ensembles still did not answer after the delayed re-check",
                 _reasons, rank=4),
    CategorySpec(Category.INVALID_METADATA, Phase.LEDGERS, Severity.ERROR, _ANALYSED,
                 "the ledger's metadata cannot be decoded or is inconsistent", _error, rank=6),
    CategorySpec(Category.WOULD_HAVE_NO_REPLICA_OF_AN_ENTRY, Phase.WHATIF, Severity.ERROR, _ANSWERED,
                 "what-if: without the named bookies some entry would have no copy", _coverage, rank=0.5, unsafe=True),
    CategorySpec(Category.WOULD_HAVE_LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY, Phase.WHATIF, Severity.ERROR, _ANSWERED,
                 "what-if: else, some entry would have fewer than AQ copies", _coverage, rank=1.5, unsafe=True),
    CategorySpec(Category.WOULD_HAVE_LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY, Phase.WHATIF, Severity.WARNING, _ANSWERED,
                 "what-if: else, some entry would have fewer than WQ copies (safe: still acknowledged)", _coverage,
                 rank=3.5),
    CategorySpec(Category.INVALID_BOOKIE_RESPONSE, Phase.LEDGERS, Severity.ERROR, _ANSWERED,
                 "a bookie's answer for the ledger cannot be decoded", _answers, rank=5),
    CategorySpec(Category.CORRUPT_ENTRY, Phase.DEEP, Severity.ERROR, _ANSWERED,
                 "deep: a copy the bookie's index lists is missing, truncated, another entry's or fails its "
                 "digest, after a re-read", _corrupt, rank=0.8),
    CategorySpec(Category.DIVERGENT_COPIES, Phase.DEEP, Severity.ERROR, _ANSWERED,
                 "deep: verified copies of one entry whose payloads differ", _divergent, rank=0.9),
    CategorySpec(Category.PULSAR_CHECKSUM_MISMATCH, Phase.DEEP, Severity.ERROR, _ANSWERED,
                 "deep, a Pulsar topic's ledger: a message whose Pulsar checksum fails on a copy whose BookKeeper "
                 "digest is good (corrupted before BookKeeper stored it: every consumer rejects it)", _pulsar_crc,
                 rank=0.85),
    CategorySpec(Category.PULSAR_DEDUP_STATE_AHEAD_OF_DATA, Phase.DEEP, Severity.ERROR, _RECORDED,
                 "deep, a Pulsar topic's ledgers in order: deduplication's snapshot (cursor pulsar.dedup) says a "
                 "producer persisted a sequence id, and no message stored in the ledgers the topic listed when "
                 "it was read carries it, every one read whole: acknowledged messages gone", _dedup_ahead, rank=0.7),
    CategorySpec(Category.PULSAR_REPEAT_UNDER_DEDUP, Phase.DEEP, Severity.WARNING, _RECORDED,
                 "deep, a Pulsar topic's ledgers: a producer's sequence id at or below one it had already "
                 "persisted in the same ledger, after deduplication's snapshot: a duplicate deduplication should "
                 "have dropped", _repeat_under_dedup, rank=30),
    CategorySpec(Category.WEAK_DURABILITY_POLICY, Phase.LEDGERS, Severity.WARNING, _ANALYSED,
                 "the ledger's write or ack quorum is below the operator's minimum (min_write_quorum, "
                 "min_ack_quorum): one bookie's loss can lose acknowledged entries", _policy, rank=9),
    CategorySpec(Category.ENTRIES_PAST_THE_CLOSE, Phase.LEDGERS, Severity.WARNING, _ANSWERED,
                 "entries above the closed ledger's lastEntryId, from lastEntryId + 1 on, each with at least AQ "
                 "copies on its write set: a writer may have had them acknowledged, and the ledger does not "
                 "contain them", _past_the_close, rank=6.5),
    CategorySpec(Category.LOST_BOOKIE_RECOVERY_NOT_STARTED, Phase.LEDGERS, Severity.ERROR, _ANSWERED,
                 "a closed ledger names a bookie whose registration has been gone for longer than "
                 "lostBookieRecoveryDelay plus a grace, and is not marked under-replicated: nobody is repairing it",
                 _lost, rank=2.5),
    CategorySpec(Category.ORPHAN_LEDGER, Phase.HOLDINGS, Severity.WARNING, frozenset({Fact.ABSENT}),
                 "a bookie holds a ledger the metadata has not had for longer than the grace period: disk held "
                 "for nothing, or a garbage collector that stopped", _orphan, rank=10),
    CategorySpec(Category.TOPIC_LEDGER_MISSING, Phase.TOPICS, Severity.ERROR, _RECORDED,
                 "a ledger a topic's record needs (data, cursor, schema, compacted) is not in BookKeeper's metadata "
                 "(not offloaded and deleted from BookKeeper on purpose)", _topic_ledger, rank=0.2),
    CategorySpec(Category.TOPIC_WRITTEN_PAST_CLOSED_HEAD, Phase.TOPICS, Severity.ERROR, _RECORDED,
                 "the head ledger the topic's record keeps open is closed in BookKeeper, and later facts (a cursor "
                 "past its close, a newer ledger of the topic with entries) show the broker wrote on",
                 _head_closed, rank=0.3),
    CategorySpec(Category.CURSOR_POSITION_NOT_IN_TOPIC, Phase.TOPICS, Severity.ERROR, _RECORDED,
                 "a cursor's mark-delete or acknowledged range is in a ledger the topic does not list (and not "
                 "below its first), or past a closed ledger's entries", _cursor_position, rank=1.2),
    CategorySpec(Category.TOPIC_ENTRY_COUNT_MISMATCH, Phase.TOPICS, Severity.ERROR, _RECORDED,
                 "a closed ledger's entries in the topic's record differ from BookKeeper's lastEntryId + 1",
                 _entry_count, rank=1.3),
    CategorySpec(Category.TOPIC_HEAD_LEDGER_CLOSED, Phase.TOPICS, Severity.WARNING, _RECORDED,
                 "the head ledger the topic's record keeps open is closed in BookKeeper, with nothing to show "
                 "the broker wrote on (a graceful unload of an idle topic looks the same)", _head_closed, rank=8.5),
    CategorySpec(Category.LEAKED_LEDGER, Phase.TOPICS, Severity.WARNING, _RECORDED,
                 "a ledger Pulsar created (its keys say so) that no topic, cursor, schema or compaction names, "
                 "older than the grace period: disk held for nothing", _leaked, rank=10.5),
    CategorySpec(Category.UNMARKED_WITHOUT_REPAIR, Phase.REPAIR, Severity.ERROR, _ANSWERED,
                 "a ledger marked under-replicated for a loss scrutiny found (by its hand-off, or by BookKeeper's "
                 "Auditor) was unmarked (a replication worker called it replicated) while the loss remains", _unmarked,
                 rank=1.1),
)}
assert set(REGISTRY) == set(Category), "every category needs its registry entry"
CATEGORY_NAMES = frozenset(str(c) for c in REGISTRY)  # a summary from a newer auditor may name more


def known_counts(counts: Mapping[str, int]) -> dict[Category, int]:
    """Ledgers per category as a record gives them, keyed as every count here is: by the categories this
    version knows (one from a newer auditor is left out)."""
    return {Category(c): n for c, n in counts.items() if c in CATEGORY_NAMES}


def worst_first() -> list[Category]:
    return sorted(REGISTRY, key=lambda c: REGISTRY[c].rank)


def spec(category: Category) -> CategorySpec:
    return REGISTRY[category]


def in_phase(phase: Phase) -> tuple[Category, ...]:
    return tuple(c for c, s in REGISTRY.items() if s.phase is phase)


def resting_on(fact: Fact) -> frozenset[Category]:
    return frozenset(c for c, s in REGISTRY.items() if fact in s.facts)


# Acknowledged data at risk now: what pages (deploy/prometheus: ScrutinyDataAtRisk, ScrutinyCorruptCopies,
# ScrutinyLostBookieDataAtRisk, ScrutinyTopicDataLost). The console's verdict and every row say it apart.
AT_RISK = frozenset({Category.NO_REPLICA_OF_AN_ENTRY, Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY,
                     Category.CORRUPT_ENTRY, Category.DIVERGENT_COPIES, Category.PULSAR_CHECKSUM_MISMATCH,
                     Category.PULSAR_DEDUP_STATE_AHEAD_OF_DATA, Category.TOPIC_LEDGER_MISSING,
                     Category.TOPIC_WRITTEN_PAST_CLOSED_HEAD})
SEVERITIES = ("critical", "error", "warning")  # worst first


def severity_of(category: Category, details: Mapping[str, Any]) -> str:
    """critical (data at risk now), error or warning: one finding's, as the alerts see it."""
    if category in AT_RISK or (category is Category.LOST_BOOKIE_RECOVERY_NOT_STARTED
                               and details.get("below_ack_quorum")):
        return "critical"
    return str(REGISTRY[category].severity)


def bookkeeper_gauge(category: str) -> str:
    """BookKeeper's auditor gauge with the category's meaning ("" where there is none, or no such category)."""
    return spec(Category(category)).bookkeeper_gauge if category in CATEGORY_NAMES else ""
