"""What repairs a finding under this cluster's settings, as data: what to do, the exact commands with their
ids, and whether BookKeeper's autorecovery would repair it were the ledger marked under-replicated, and why.

What autorecovery does, from its code (apache/bookkeeper `LedgerChecker`, `ReplicationWorker`): its checker
looks at each bookie's share of each fragment; at `auditorLedgerVerificationPercentage` 0 (the default) it
reads only the first and the last entry that bookie stores there, at n% a sample besides, at 100 every
entry, and it never verifies a digest; a bookie known gone fails without a read. A replication worker copies
each fragment the checker calls bad (that bookie's whole share) to another bookie, then unmarks the ledger
when the checker finds nothing, so a mark on a ledger whose loss the checker cannot see is removed without
repair. `bookkeeper shell recover <bookie> -l <ledger>` replaces the bookie in every fragment of the ledger,
copying its share from the other copies, whatever was lost: the per-ledger repair that always works while
each entry has a copy somewhere. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from scrutiny.categories import Category
from scrutiny.checks.violation import Violation

YES, NO, MAYBE, NOT_APPLICABLE = "yes", "no", "maybe", "not applicable"
SHELL = "bin/bookkeeper shell"


@dataclass(frozen=True)
class RepairContext:
    """What the remedies depend on: the percentage the cluster's checker runs with (the operator says so:
    `auditor_ledger_verification_percentage`), and whether re-replication was disabled at the run (None:
    not read)."""

    verification_percentage: int = 0
    replication_disabled: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return {"auditor_ledger_verification_percentage": self.verification_percentage,
                "replication_disabled": self.replication_disabled}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> RepairContext:
        disabled = doc.get("replication_disabled")
        return cls(int(doc.get("auditor_ledger_verification_percentage", 0)),
                   None if disabled is None else bool(disabled))


@dataclass(frozen=True)
class Remedy:
    action: str
    commands: tuple[str, ...] = ()
    autorecovery: str = NOT_APPLICABLE  # would BookKeeper's autorecovery repair it, were the ledger marked?
    why: str = ""  # ... and why

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "commands": list(self.commands), "autorecovery": self.autorecovery,
                "autorecovery_why": self.why}

    def lines(self) -> list[str]:
        """As the CLI's text and the console say it."""
        out = [f"remedy: {self.action}"] + [f"  $ {c}" for c in self.commands]
        if self.autorecovery != NOT_APPLICABLE:
            out.append(f"  autorecovery, if marked: {self.autorecovery}: {self.why}")
        return out


def remedy(v: Violation, ctx: RepairContext) -> Remedy:
    return REMEDIES[v.category](v, ctx)


def recover(bookies: list[str] | tuple[str, ...], ledger_id: int) -> str:
    return f"{SHELL} recover {','.join(sorted(bookies))} -l {ledger_id}"


def _topic(v: Violation) -> str:
    owner = v.owner
    if owner is not None and owner.kind in ("topic", "cursor", "compacted") and owner.name:
        return owner.name
    return str(v.details.get("topic", "")) or "<topic>"


def _disabled(ctx: RepairContext) -> Remedy | None:
    return Remedy("", (f"{SHELL} autorecovery -enable",), NO,
                  "re-replication is disabled in this cluster (underreplication/disable): no worker copies "
                  "anything until it is enabled") if ctx.replication_disabled else None


def _copies(v: Violation, ctx: RepairContext) -> Remedy:
    """A copy missing on a bookie that is registered (coverage)."""
    d = v.details
    lacking = d.get("shares_lacking", [])
    bookies = sorted({s["bookie"] for s in lacking}) or list(v.bookies)
    if v.category is Category.NO_REPLICA_OF_AN_ENTRY:
        gone = [r for r in d.get("under_covered", []) if r.get("copies") == 0]
        where = ", ".join(f"{r['first_entry']}-{r['last_entry']}" for r in gone[:5]) or "some entries"
        return Remedy(f"entries {where} have no copy on any bookie of their write sets: copy nothing over them; "
                      "find a copy elsewhere (a restored disk, an old ledger directory), or treat them as lost "
                      f"(Pulsar: the topic's consumers must skip them). The entries that still have a copy: "
                      f"{recover(bookies, v.ledger_id)} once the lost ones are settled",
                      (f"{SHELL} readledger -l {v.ledger_id} -fe {gone[0]['first_entry'] if gone else 0}",),
                      NO, "no bookie holds those entries: a replication worker cannot read them, and keeps the "
                      "ledger marked")
    commands = (recover(bookies, v.ledger_id),)
    action = (f"copy {', '.join(bookies)}'s share of ledger {v.ledger_id} back from the other copies (recover "
              "replaces the bookie in every fragment, whatever was lost)")
    off = _disabled(ctx)
    if off is not None:
        return Remedy(action, off.commands + commands, off.autorecovery, off.why)
    p = ctx.verification_percentage
    # the bad copies the bookie serves all the same (a deep run's, digest failing): its checker reads them back
    failing = [s for s in lacking if s["entries_lacking"] > s.get("looks_held", 0)]
    if lacking and not failing:
        return Remedy(action, commands, NO, "the bookies serve these copies (their digest fails, the bookie does not "
                      "check it) and its checker reads without verifying a digest: the copies look held to it")
    if p >= 100:
        return Remedy(action, commands, YES, f"its checker reads every entry (auditorLedgerVerificationPercentage "
                      f"{p}) and a copy the bookie lacks or cannot read fails it; a worker copies each bad share to "
                      "another bookie")
    if not lacking:
        return Remedy(action, commands, MAYBE, "which entries of each share are missing is not known for this "
                      "finding: whether its checker sees the loss cannot be told")
    unseen = [s for s in lacking if not s["lacking_ends"]]
    if not unseen:
        seen = "; ".join(f"{s['bookie']} lacks entry {s['lacking_ends'][0]} of entries "
                         f"{s['first_entry']}-{s['last_entry']}" for s in lacking[:3])
        return Remedy(action, commands, YES, f"its checker reads the first and the last entry of each bookie's "
                      f"share of a fragment, and {seen}: a worker copies that whole share to another bookie")
    where = "; ".join(f"{s['bookie']} lacks {s['entries_lacking']} of entries {s['first_entry']}-{s['last_entry']} "
                      f"but holds entries {s['checker_reads'][0]} and {s['checker_reads'][1]}" for s in unseen[:3])
    if p > 0 and any(s in failing for s in unseen):
        return Remedy(action, commands, MAYBE, f"its checker samples {p}% of each share besides the first and the "
                      f"last entry: {where}; a sample may miss them, and the mark is then removed without repair")
    if p > 0:
        return Remedy(action, commands, NO, f"its checker samples {p}% of each share besides the first and the last "
                      f"entry: {where}, and the other copies it lacks are ones it serves (their digest fails): a mark "
                      "would be removed without repair")
    return Remedy(action, commands, NO, f"at auditorLedgerVerificationPercentage 0 its checker reads only the first "
                  f"and the last entry of each bookie's share of a fragment: {where}; a mark would be removed "
                  "without repair (apache/bookkeeper #3887)")


def _lost_bookie(v: Violation, ctx: RepairContext) -> Remedy:
    lost = list(v.details.get("lost_bookies", v.bookies))
    commands = (recover(lost, v.ledger_id),)
    action = (f"bring {', '.join(lost)} back if its disks still hold the copies; else copy its share from the "
              "others, and find why nobody did: is an Auditor running (`whoisauditor`)?")
    if v.details.get("replication_disabled") or ctx.replication_disabled:
        off = _disabled(RepairContext(replication_disabled=True))
        assert off is not None
        return Remedy(action, off.commands + commands, off.autorecovery, off.why)
    return Remedy(action, (f"{SHELL} whoisauditor", *commands), YES,
                  "a bookie gone fails its checker without a read: once the Auditor marks the ledger (after "
                  "lostBookieRecoveryDelay), a worker copies its share; nothing marked it, so no Auditor is "
                  "running or it is stuck")


def _marked_too_long(v: Violation, ctx: RepairContext) -> Remedy:
    commands = (f"{SHELL} listunderreplicated -printmissingreplica", recover(list(v.bookies), v.ledger_id))
    action = ("the mark has outlived the grace period: check that replication workers run and hold no stale "
              "lock (underreplication/locks), then copy the missing replicas by hand")
    off = _disabled(ctx)
    if off is not None:
        return Remedy(action, off.commands + commands, off.autorecovery, off.why)
    return Remedy(action, commands, MAYBE, "it is marked and no worker finished it: no worker runs, or its copy "
                  "fails (a source without the entries, #4678 on large fragments); if the loss is one its checker "
                  "cannot see, the worker unmarks it without repair")


def _unmarked(v: Violation, ctx: RepairContext) -> Remedy:
    bookies = list(v.details.get("replicas") or v.bookies)
    return Remedy(f"copy {', '.join(bookies)}'s share of ledger {v.ledger_id} by hand: autorecovery called it "
                  "replicated and will not mark it again by itself", (recover(bookies, v.ledger_id),), NO,
                  str(v.details.get("cause") or "its worker unmarked the ledger with the loss in place"))


def _placement(v: Violation, ctx: RepairContext) -> Remedy:
    bookies = list(v.bookies)
    return Remedy("fix the rack data first (`/bookies`, `racks`); then move one copy of each shared rack: recover "
                  "asks the placement policy for the bookie that replaces it",
                  (recover(bookies[-1:], v.ledger_id),) if bookies else (), MAYBE,
                  "only where the Auditor runs its placement check (auditorPeriodicPlacementPolicyCheckInterval) and "
                  "repairs what it finds (repairedPlacementPolicyNotAdheringBookieEnable, BookKeeper 4.16 and later)")


def _weak_policy(v: Violation, ctx: RepairContext) -> Remedy:
    topic = _topic(v)
    ns = topic.removeprefix("persistent://").rsplit("/", 1)[0] if topic != "<topic>" else "<tenant/namespace>"
    e = max(int(v.details.get("ensemble_size", 2)), 2)
    return Remedy("raise the durability policy of what writes it; new ledgers follow, this one keeps its policy "
                  "until rolled over or offloaded",
                  (f"pulsar-admin namespaces set-persistence {ns} -e {e} -w 2 -a 2",), NO,
                  "the policy is the ledger's own: re-replication keeps it")


def _fixed(action: str, *commands: str, autorecovery: str = NOT_APPLICABLE, why: str = "") \
        -> Callable[[Violation, RepairContext], Remedy]:
    """A remedy that names the ledger ({ledger}), its bookies ({bookies}) and its topic ({topic})."""
    def made(v: Violation, ctx: RepairContext) -> Remedy:
        ids = {"ledger": v.ledger_id, "bookies": ",".join(v.bookies) or "<bookie>", "topic": _topic(v)}
        return Remedy(action.format(**ids), tuple(c.format(**ids) for c in commands), autorecovery, why)
    return made


def _pulsar_crc(v: Violation, ctx: RepairContext) -> Remedy:
    messages = v.details.get("messages") or [{"entry_id": "<entry>", "producer": "<producer>"}]
    first = messages[0]
    return Remedy(f"the message is lost to every consumer (Pulsar's client discards it): find producer "
                  f"{first.get('producer')}'s log around that send and publish it again; keep the copies",
                  (f"pulsar-admin topics get-message-by-id {_topic(v)} -l {v.ledger_id} -e {first.get('entry_id')}",),
                  NO, "every copy is the bytes BookKeeper was given, its digest good: a copy of it is no repair")


def _corrupt(v: Violation, ctx: RepairContext) -> Remedy:
    """The bookie serves a copy whose digest fails (only a client verifies one); every other corrupt copy (its
    entry log gone, cut short, another entry at its location) fails the bookie's own read, as a copy it lacks
    fails BookKeeper's checker (tests/real/test_repair.py)."""
    copies = v.details.get("copies", {})
    bad = sorted(copies) if isinstance(copies, Mapping) and copies else list(v.bookies)
    reasons = {r for c in (copies.values() if isinstance(copies, Mapping) else ()) for r in c.get("reasons", {})}
    action = (f"check {', '.join(bad)}'s disk (SMART, dmesg); copy its share from the good copies before the bad one "
              "is the last (the copies read back are verified against their digests)")
    commands = (recover(bad, v.ledger_id),)
    unreadable = sorted(reasons - {"bad-digest"})
    if not unreadable:
        return Remedy(action, commands, NO, "the bookie serves these copies and its checker reads without "
                      "verifying a digest: a copy whose digest fails looks held")
    off = _disabled(ctx)
    if off is not None:
        return Remedy(action, off.commands + commands, off.autorecovery, off.why)
    failed = f"the bookie fails its own read of the copies it lists but cannot read ({', '.join(unreadable)})"
    if ctx.verification_percentage >= 100:
        return Remedy(action, commands, YES, f"{failed}; its checker reads every entry, and a worker copies each "
                      "share it cannot read to another bookie")
    return Remedy(action, commands, MAYBE, f"{failed}, as for a copy it lacks; its checker reads only some entries "
                  f"of each share (auditorLedgerVerificationPercentage {ctx.verification_percentage}): this ledger's "
                  "coverage finding says whether it reads these")


def _missing_in_topic(v: Violation, ctx: RepairContext) -> Remedy:
    topic, kind = _topic(v), v.details.get("kind", "data")
    how = {"cursor": f"pulsar-admin topics reset-cursor {topic} -s {v.details.get('subscription', '<subscription>')} "
                     "-m <ledgerId:entryId>",
           "schema": f"pulsar-admin schemas upload {topic} -f <schema-definition-file>",
           "compacted": f"pulsar-admin topics compact {topic}"}.get(
        str(kind), f"pulsar-admin topics skip {topic} -s <subscription> -n <entries>")
    return Remedy("do not unload or delete the topic before deciding: find the ledger elsewhere (offloaded? "
                  "another cluster?), else move what depends on it past it",
                  (f"pulsar-admin topics stats-internal {topic}", how), NO,
                  f"BookKeeper no longer has ledger {v.ledger_id}: there is nothing to copy")


def _cursor_position(v: Violation, ctx: RepairContext) -> Remedy:
    topic = _topic(v)
    subs = sorted({str(p.get("subscription", "")) for p in v.details.get("positions", [])} - {""}) or ["<subscription>"]
    return Remedy("move each subscription to a position that exists",
                  (f"pulsar-admin topics stats-internal {topic}",
                   *(f"pulsar-admin topics reset-cursor {topic} -s {s} -m <ledgerId:entryId>" for s in subs)))


_TOPIC = "pulsar-admin topics stats-internal {topic}"
_METADATA = SHELL + " ledgermetadata -l {ledger}"
REMEDIES: dict[Category, Callable[[Violation, RepairContext], Remedy]] = {
    Category.NO_REPLICA_OF_AN_ENTRY: _copies,
    Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY: _copies,
    Category.LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY: _copies,
    Category.LOST_BOOKIE_RECOVERY_NOT_STARTED: _lost_bookie,
    Category.UNDERREPLICATED_ELAPSED_GRACE_PERIOD: _marked_too_long,
    Category.UNMARKED_WITHOUT_REPAIR: _unmarked,
    Category.PLACEMENT_POLICY_NOT_ADHERING: _placement,
    Category.PLACEMENT_POLICY_SOFTLY_ADHERING: _fixed("plan capacity across zones; nothing is at risk now"),
    Category.WEAK_DURABILITY_POLICY: _weak_policy,
    Category.CORRUPT_ENTRY: _corrupt,
    Category.PULSAR_CHECKSUM_MISMATCH: _pulsar_crc,
    Category.PULSAR_DEDUP_STATE_AHEAD_OF_DATA: _fixed(
        "the producers' messages named are gone from {topic}: keep the bookies' data and the broker's log, find "
        "which ledger lost them (TOPIC_LEDGER_MISSING, CORRUPT_ENTRY on the ledgers before the snapshot) and ask "
        "the producers to publish again from the ids named", "pulsar-admin topics stats-internal {topic}",
        "pulsar-admin topics examine-message {topic} --initialPosition earliest --messagePosition 1",
        autorecovery=NO, why="no copy of those messages is left to copy"),
    Category.PULSAR_REPEAT_UNDER_DEDUP: _fixed(
        "consumers of {topic} received the message twice: check the namespace's deduplication policy and the "
        "brokers' brokerDeduplication* settings; report it upstream with the ids named",
        "pulsar-admin namespaces get-deduplication <tenant/namespace>", autorecovery=NO,
        why="the duplicate is a message of its own in BookKeeper: nothing is missing"),
    Category.BOOKIE_UNAVAILABLE: _fixed("the copies on {bookies} are unknown, not lost: is the bookie or its agent "
                                        "down, or overloaded (details.silence)?"),
    Category.INVALID_METADATA: _fixed("a client bug or a manual edit: inspect the znode", _METADATA,
                                      autorecovery=NO, why="a worker cannot open a ledger whose metadata is invalid"),
    Category.INVALID_BOOKIE_RESPONSE: _fixed("check the agent's version and logs on {bookies}; the bookie's index "
                                             "may be damaged"),
    Category.DIVERGENT_COPIES: _fixed("keep every copy; find which is right from the ledger's readers (Pulsar: "
                                      "the topic's consumers) and report it upstream",
                                      SHELL + " readledger -l {ledger}", autorecovery=NO,
                                      why="each copy passes its digest: nothing in BookKeeper sees a difference"),
    Category.ENTRIES_PAST_THE_CLOSE: _fixed("read the writer's log around the close: a LedgerClosedException on "
                                            "those adds means nothing was acknowledged "
                                            "(docs/entries-past-the-close.md)", _METADATA),
    Category.ORPHAN_LEDGER: _fixed("the garbage collector of {bookies} is stuck or wrong: its log "
                                   "(GarbageCollectorThread), gcWaitTime, verifyMetadataOnGC; delete nothing by hand "
                                   "before the ledger is gone everywhere"),
    Category.WOULD_HAVE_NO_REPLICA_OF_AN_ENTRY: _fixed("do not take these bookies down: copy the ledger's share "
                                                       "elsewhere first", SHELL + " recover {bookies} -l {ledger}"),
    Category.WOULD_HAVE_LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY: _fixed("re-replicate before taking these bookies down",
                                                                  SHELL + " recover {bookies} -l {ledger}"),
    Category.WOULD_HAVE_LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY: _fixed("re-replicate when convenient before the "
                                                                  "maintenance",
                                                                  SHELL + " recover {bookies} -l {ledger}"),
    Category.TOPIC_LEDGER_MISSING: _missing_in_topic,
    Category.TOPIC_WRITTEN_PAST_CLOSED_HEAD: _fixed("keep the broker's log and the bookies' data; unload the topic "
                                                    "only once its consumers' positions are saved", _TOPIC, _METADATA,
                                                    autorecovery=NO, why="the copies are whole: what is lost is the "
                                                    "record of what was written past the close"),
    Category.TOPIC_HEAD_LEDGER_CLOSED: _fixed("nothing while the topic is idle; if it is not, look at the broker "
                                              "that owns it", "pulsar-admin topics lookup {topic}"),
    Category.CURSOR_POSITION_NOT_IN_TOPIC: _cursor_position,
    Category.TOPIC_ENTRY_COUNT_MISMATCH: _fixed("compare the record with BookKeeper's metadata; unload the topic so "
                                                "that its broker reads the ledger's count again", _TOPIC, _METADATA),
    Category.LEAKED_LEDGER: _fixed("check that no record names it (another Pulsar cluster on these bookies, an "
                                   "offload under way), then delete it", _TOPIC,
                                   SHELL + " deleteledger -l {ledger} -f"),
}
