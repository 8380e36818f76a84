"""`scrutiny demo`: a local ZooKeeper, a BookKeeper cluster with known faults, bookie agents, a scan,
and whether what the scan found equals what was injected."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from kazoo.client import KazooClient

from scrutiny import entrylog
from scrutiny.agent import BookieAgent
from scrutiny.categories import Category, spec
from scrutiny.checks import expected_share
from scrutiny.codec import Availability
from scrutiny.config import ScanSettings
from scrutiny.entrysources import DbLedgerStorageSource, SyntheticStore
from scrutiny.entrysources.synthetic import CORRUPT, SyntheticStoreWriter
from scrutiny.errors import ConfigError
from scrutiny.lostbookies import sightings_to_bytes
from scrutiny.metadata import (
    BookieRegistration,
    Layout,
    LedgerMetadata,
    LedgerState,
    Segment,
    UnderreplicationMark,
    parse_metadata_service_uri,
)
from scrutiny.orphans import Sightings
from scrutiny.pulsar import encode
from scrutiny.pulsar.owners import owner_from_custom_metadata
from scrutiny.pulsar.records import LedgerInfo, Position, managed_ledger_of
from scrutiny.report import Report
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import make_engine
from scrutiny.store import MetadataStore
from scrutiny.store.zookeeper import ZooKeeperStore
from scrutiny.testing.clusterwriter import ClusterWriter
from scrutiny.testing.dbledgerstorage import EntryLog, LiveBookie
from scrutiny.testing.localzk import LocalZooKeeper

RACKS = {"/rack-a": (1, 2, 3), "/rack-b": (4, 5, 6), "/rack-c": (7, 8, 9)}
UNREACHABLE = 9  # registered, but its agent never answers
WHATIF_CANDIDATE = 2  # the bookie the demo's what-if takes down
DECOMMISSIONED = 10  # cookie only: gone from the cluster with its copies
LOST = 11  # its registration gone two days ago, its ledgers never marked: nobody re-replicates them
# DbLedgerStorage bookies (real RocksDB indexes and entry logs): what a deep scrub reads and verifies
DB_BOOKIES = {12: "/rack-a", 13: "/rack-b", 14: "/rack-c"}
TWO_DAYS_MS = 2 * 86400 * 1000
MARKED = 17  # a healthy ledger marked under-replicated two days ago: skipped by the replicas check


def bookie(n: int) -> str:
    # Loopback addresses: a bookie without agent is refused at once, and nothing leaves the machine.
    return f"127.0.1.{n}:3181"


@dataclass
class DemoCluster:
    """What was written, and the findings it must produce."""

    root: str
    expected: set[tuple[str, int]] = field(default_factory=set)
    ledgers: int = 0  # written, healthy or not
    checked: int = 0  # closed with entries, decodable, not marked: what a run's replicas check looks at
    store_files: dict[str, Path] = field(default_factory=dict)  # synthetic bookies' stores
    ledger_dirs: dict[str, Path] = field(default_factory=dict)  # DbLedgerStorage bookies' ledger directories
    deep_expected: set[tuple[str, int]] = field(default_factory=set)  # what only a deep run finds
    healthy: int = 0
    notes: dict[tuple[str, int], str] = field(default_factory=dict)


def pulsar_keys(ledger_id: int) -> tuple[tuple[str, bytes], ...]:
    """Pulsar's custom metadata: the demo's ledgers belong to a handful of topics."""
    topic = f"public/demo/persistent/topic-{ledger_id % 5}"
    return (("application", b"pulsar"), ("component", b"managed-ledger"), ("pulsar/managed-ledger", topic.encode()))


def _healthy_ensemble(rng: random.Random, e: int) -> tuple[str, ...]:
    """Rack-aware: racks in turn (a, b, c, a, b), so every write set spans at least 2 racks."""
    usable = {r: [n for n in ns if n != UNREACHABLE] for r, ns in RACKS.items()}
    order = list(usable)
    rng.shuffle(order)
    picked: list[str] = []
    used: set[int] = set()
    for i in range(e):
        choices = [n for n in usable[order[i % 3]] if n not in used]
        n = rng.choice(choices)
        used.add(n)
        picked.append(bookie(n))
    return tuple(picked)


def build_demo_cluster(client: KazooClient, root: str, store_dir: Path, healthy: int = 3000,
                       seed: int = 34) -> DemoCluster:
    rng = random.Random(seed)
    writer = ClusterWriter(client, root, Layout.HIERARCHICAL)
    writer.init_cluster()
    store = SyntheticStoreWriter()
    demo = DemoCluster(root)
    ledgers: list[LedgerMetadata] = []
    now = int(time.time() * 1000)

    def closed(lid: int, segments: tuple[Segment, ...], last: int, e: int = 3, wq: int = 2, aq: int = 2
               ) -> LedgerMetadata:
        return LedgerMetadata(lid, LedgerState.CLOSED, e, wq, aq, last, (last + 1) * 1024, segments, ctime=now,
                              custom_metadata=pulsar_keys(lid))

    def healthy_copies(md: LedgerMetadata, skip: str = "") -> None:
        for b in md.bookies - {skip}:
            store.add(b, md.ledger_id, expected_share(md, b))

    def expect(category: Category, lid: int, why: str) -> None:
        demo.expected.add((str(category), lid))
        demo.notes[(str(category), lid)] = why

    # Healthy ledgers in both hierarchical trees, every metadata format, some E=5, some two segments.
    ids = [*range(1, healthy // 2 + 1), *range(2147483640, 2147483640 + healthy - healthy // 2)]
    for lid in ids:
        kind = rng.random()
        e, wq = (5, rng.choice((2, 3))) if kind < 0.2 else (3, 2)
        ens = _healthy_ensemble(rng, e)
        last = rng.randint(20, 400)
        segs: tuple[Segment, ...] = (Segment(0, ens),)
        if kind > 0.85:  # an ensemble change: one bookie replaced by another of the same rack
            pos = rng.randrange(e)
            rack = next(r for r, ns in RACKS.items() if int(ens[pos].split(".")[3].split(":")[0]) in ns)
            spare = [bookie(n) for n in RACKS[rack] if n != UNREACHABLE and bookie(n) not in ens]
            if spare:
                segs = (Segment(0, ens), Segment(last // 2, tuple(spare[0] if i == pos else b
                                                                   for i, b in enumerate(ens))))
        md = closed(lid, segs, last, e, wq, 2)
        ledgers.append(md)
        healthy_copies(md)
    demo.healthy = len(ids)
    # Ledgers that are skipped, not checked: open, in recovery, closed and empty.
    for lid, state, last in ((5001, LedgerState.OPEN, -1), (5002, LedgerState.IN_RECOVERY, -1),
                             (5003, LedgerState.CLOSED, -1)):
        ledgers.append(LedgerMetadata(lid, state, 3, 2, 2, last, 0, (Segment(0, _healthy_ensemble(rng, 3)),)))

    # -- the injected faults ----------------------------------------------------------------------
    ens = _healthy_ensemble(rng, 3)
    md = closed(9001, (Segment(0, ens),), 299)
    ledgers.append(md)
    for pos, b in enumerate(ens):  # positions 0 and 1 both lose entries 50..59
        held = Availability.of(expected_share(md, b)).entry_ids()
        store.add_entries(b, 9001, np.setdiff1d(held, np.arange(50, 60)) if pos < 2 else held)
    expect(Category.NO_REPLICA_OF_AN_ENTRY, 9001, "two bookies of one write set lost entries 50-59")

    md = closed(9002, (Segment(0, (bookie(WHATIF_CANDIDATE), bookie(5), bookie(7))),), 199)
    ledgers.append(md)
    healthy_copies(md, skip=md.segments[0].ensemble[2])  # that bookie lost its whole copy
    # (with the what-if's bookie down too, entries 2, 5, 8, ... would have no copy left)
    expect(Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY, 9002, "a bookie lost its copy of the ledger")

    ens = _healthy_ensemble(rng, 3)
    md = closed(9003, (Segment(0, ens),), 299, 3, 3, 2)
    ledgers.append(md)
    for pos, b in enumerate(ens):
        held = Availability.of(expected_share(md, b)).entry_ids()
        store.add_entries(b, 9003, np.setdiff1d(held, np.arange(100, 200)) if pos == 1 else held)
    expect(Category.LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY, 9003, "WQ 3: one bookie lost entries 100-199")

    md = closed(9004, (Segment(0, tuple(bookie(n) for n in RACKS["/rack-a"])),), 99)
    ledgers.append(md)
    healthy_copies(md)
    expect(Category.PLACEMENT_POLICY_NOT_ADHERING, 9004, "all three bookies on /rack-a")

    writer.mark_underreplicated(UnderreplicationMark(MARKED, (bookie(1),), now - TWO_DAYS_MS))
    expect(Category.UNDERREPLICATED_ELAPSED_GRACE_PERIOD, MARKED, "marked under-replicated two days ago")

    for lid in (9005, 9006):
        ens = _healthy_ensemble(rng, 3)
        ens = tuple(bookie(UNREACHABLE) if b in {bookie(n) for n in RACKS["/rack-c"]} else b for b in ens)
        md = closed(lid, (Segment(0, ens),), 99)
        ledgers.append(md)
        healthy_copies(md)
        expect(Category.BOOKIE_UNAVAILABLE, lid, f"{bookie(UNREACHABLE)} is registered but never answers")

    md = closed(9007, (Segment(0, _healthy_ensemble(rng, 3)),), 99)
    ledgers.append(md)
    healthy_copies(md, skip=md.segments[0].ensemble[0])
    store.add(md.segments[0].ensemble[0], 9007, CORRUPT)
    expect(Category.INVALID_BOOKIE_RESPONSE, 9007, "a bookie's answer is truncated")

    ens = _healthy_ensemble(rng, 3)
    ens = (bookie(DECOMMISSIONED), *ens[1:])
    md = closed(9008, (Segment(0, ens),), 99)
    ledgers.append(md)
    healthy_copies(md, skip=bookie(DECOMMISSIONED))
    expect(Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY, 9008,
           f"{bookie(DECOMMISSIONED)} left the cluster (cookie only): its copies are gone")

    # (WQ 3 with the what-if's bookie: without it, 2 copies of each entry, still AQ)
    md = closed(9009, (Segment(0, (bookie(WHATIF_CANDIDATE), bookie(4), bookie(8))),), 99, 3, 3, 2)
    ledgers.append(md)
    for b in md.bookies:  # every bookie holds every entry: extra copies never hurt
        store.add_entries(b, 9009, range(100))

    # (with the what-if's bookie: without it, every other entry would have no copy)
    md = closed(9011, (Segment(0, (bookie(WHATIF_CANDIDATE), bookie(5))),), 99, 2, 1, 1)
    ledgers.append(md)
    healthy_copies(md)
    expect(Category.WEAK_DURABILITY_POLICY, 9011, "written with WQ 1, AQ 1: one copy of each entry, by design")

    md = closed(9012, (Segment(0, _healthy_ensemble(rng, 3)),), 99)
    ledgers.append(md)
    beyond = dataclasses.replace(md, last_entry_id=104)  # adds a replaced bookie took after the close
    for b in md.bookies:
        store.add(b, 9012, expected_share(beyond, b))
    expect(Category.ENTRIES_PAST_THE_CLOSE, 9012, "entries 100-104 on AQ bookies above lastEntryId 99")

    orphan_holder = bookie(4)  # ledger 9013 deleted from the metadata two days ago; its copy never collected
    store.add_entries(orphan_holder, 9013, range(50))
    expect(Category.ORPHAN_LEDGER, 9013, f"{orphan_holder} holds a ledger the metadata lost two days ago")

    ens = (bookie(LOST), *_healthy_ensemble(rng, 2))
    md = closed(9014, (Segment(0, ens),), 99, 3, 3, 2)
    ledgers.append(md)
    healthy_copies(md, skip=bookie(LOST))
    expect(Category.LOST_BOOKIE_RECOVERY_NOT_STARTED, 9014,
           f"{bookie(LOST)} unregistered two days ago, the ledger never marked under-replicated")
    expect(Category.LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY, 9014, f"WQ 3: {bookie(LOST)}'s copies count as gone")

    ledgers += _deep_scrub_faults(demo, store_dir, now)
    ledgers += _pulsar_faults(writer, ledgers, lambda md: healthy_copies(md), expect, rng, now)

    # Mixed formats for the healthy ledgers; v3 for the faults (v1 has no ack quorum: AQ = WQ there).
    writer.write_ledgers(ledgers, version=lambda m: 3 if m.ledger_id >= 9000 else 1 + m.ledger_id % 3)
    writer.write_raw_ledger(9010, b"BookieMetadataFormatVersion\t3\n\x05garbage")
    expect(Category.INVALID_METADATA, 9010, "the metadata znode is not decodable")

    racks = {bookie(n): r for r, ns in RACKS.items() for n in ns} | {bookie(n): r for n, r in DB_BOOKIES.items()}
    writer.write_racks(racks, parse_metadata_service_uri(f"zk://x:1{root}").racks_path)
    for n in (*range(1, 10), *DB_BOOKIES):
        writer.register_bookie(BookieRegistration(bookie(n), readonly=(n == 6)))
    for gone in (DECOMMISSIONED, LOST):
        client.ensure_path(f"{root}/cookies/{bookie(gone)}")
    # What an auditor that has watched this cluster for two days recorded: when it first saw 9013 held and
    # absent from the metadata, and when bookie 11's registration went (runs read these; a scan records none).
    writer.write_auditor_record("orphan-sightings", Sightings({orphan_holder: {9013: now - TWO_DAYS_MS}}).to_bytes())
    writer.write_auditor_record("lost-bookie-sightings", sightings_to_bytes({bookie(LOST): now - TWO_DAYS_MS}))
    demo.ledgers = len(ledgers) + 1  # and the undecodable one
    demo.checked = sum(m.state is LedgerState.CLOSED and m.last_entry_id >= 0 and m.ledger_id != MARKED
                       for m in ledgers)
    demo.store_files = store.write_all(store_dir)
    return demo


def _pulsar_faults(writer: ClusterWriter, ledgers: list[LedgerMetadata], copies: Callable[[LedgerMetadata], None],
                   expect: Callable[[Category, int, str], None], rng: random.Random, now: int) -> list[LedgerMetadata]:
    """Pulsar's records: each demo topic lists the ledgers its keys give it; then topics of their own with one
    fault each of the classes Pulsar's record against BookKeeper's finds."""
    by_topic: dict[str, list[LedgerInfo]] = {}
    for md in ledgers:
        owner = owner_from_custom_metadata(md.custom_metadata)
        if owner is not None and owner.kind == "topic" and md.closed:
            by_topic.setdefault(owner.name, []).append(LedgerInfo(md.ledger_id, md.last_entry_id + 1, md.length))
    for topic, listed in by_topic.items():
        listed.sort(key=lambda li: li.ledger_id)
        writer.write_managed_ledger(managed_ledger_of(topic), encode.managed_ledger(listed, compression="ZLIB"))
    # deduplication on: its snapshot, inline as a cursor closed by its broker keeps it
    writer.write_cursor(managed_ledger_of(DEDUP_TOPIC), "pulsar.dedup",
                        encode.cursor(-1, DEDUP_SNAPSHOT[0], properties=DEDUP_SNAPSHOT[1]))

    def ledger(lid: int, topic: str, last: int, state: LedgerState = LedgerState.CLOSED, ctime: int = now
               ) -> LedgerMetadata:
        md = LedgerMetadata(lid, state, 3, 2, 2, last, (last + 1) * 1024, (Segment(0, _healthy_ensemble(rng, 3)),),
                            ctime=ctime, custom_metadata=encode.ledger_keys("topic", topic))
        copies(md)
        return md

    def record(topic: str, listed: list[LedgerInfo], cursor: Position | None = None) -> None:
        writer.write_managed_ledger(managed_ledger_of(topic), encode.managed_ledger(listed, "LZ4"),
                                    {"orders-sub": encode.cursor(-1, cursor)} if cursor else None)

    payments, orders, audit, idle = (f"persistent://public/demo/{t}" for t in ("payments", "orders", "audit", "idle"))
    out = [ledger(9101, payments, 99), ledger(9103, payments, -1, LedgerState.OPEN)]
    record(payments, [LedgerInfo(9101, 100, 102400), LedgerInfo(9102, 80, 81920), LedgerInfo(9103)],
           Position(9101, 104))
    expect(Category.TOPIC_LEDGER_MISSING, 9102, f"{payments} still lists ledger 9102; BookKeeper deleted it")
    expect(Category.CURSOR_POSITION_NOT_IN_TOPIC, 9101,
           "subscription orders-sub acknowledged entry 104 of a ledger of 100 entries")
    out += [ledger(9104, orders, 99), ledger(9105, orders, -1, LedgerState.OPEN)]
    record(orders, [LedgerInfo(9104, 98, 100352), LedgerInfo(9105)])
    expect(Category.TOPIC_ENTRY_COUNT_MISMATCH, 9104, "the record says 98 entries, BookKeeper's close 100")
    out.append(ledger(9106, audit, 49))
    record(audit, [LedgerInfo(9106)], Position(9106, 60))
    expect(Category.TOPIC_WRITTEN_PAST_CLOSED_HEAD, 9106,
           "recovery closed the head at entry 49; a subscription acknowledged entry 60")
    out.append(ledger(9107, idle, -1))
    record(idle, [LedgerInfo(9107)])
    expect(Category.TOPIC_HEAD_LEDGER_CLOSED, 9107, "an idle topic unloaded: its empty head closed")
    out.append(ledger(9108, payments, 49, ctime=now - TWO_DAYS_MS))
    expect(Category.LEAKED_LEDGER, 9108, f"{payments} trimmed ledger 9108 two days ago; its delete failed")
    return out


DEDUP_TOPIC = "persistent://public/demo/invoices"
# Its ledgers' messages (producer, sequence id): billing's ids run on, invoices' stop at 119 though the
# snapshot at 9019:1 says 140 persisted, and billing's 12 comes back after the snapshot.
DEDUP_MESSAGES = {9018: [("billing", e) for e in range(10)] + [("invoices", 100 + e) for e in range(10)],
                  9019: [("billing", 10 + e) for e in range(5)] + [("invoices", 110 + e) for e in range(10)]
                  + [("billing", 12)] + [("billing", 15 + e) for e in range(4)]}
DEDUP_SNAPSHOT = (Position(9019, 1), {"billing": 11, "invoices": 140})


def _deep_scrub_faults(demo: DemoCluster, store_dir: Path, now: int) -> list[LedgerMetadata]:
    """Two ledgers on the DbLedgerStorage bookies, whose indexes say every copy is there: a run finds
    nothing; a deep run reads the bytes. Ledger 9015: one stored entry's payload damaged on one bookie (its
    digest fails). Ledger 9016: one bookie stores another payload for an entry, with a valid digest. Ledger
    9017: a topic's messages, one of them damaged before BookKeeper stored it (Pulsar's checksum fails).
    9018 and 9019: DEDUP_TOPIC's, its deduplication snapshot ahead of them (`_pulsar_faults` writes it)."""
    ens = tuple(bookie(n) for n in DB_BOOKIES)
    mds = [LedgerMetadata(lid, LedgerState.CLOSED, 3, 3, 2, 19, 20 * 64, (Segment(0, ens),), ctime=now,
                          custom_metadata=pulsar_keys(lid) if lid < 9018 else encode.ledger_keys("topic", DEDUP_TOPIC),
                          digest_type="CRC32C") for lid in (9015, 9016, 9017, 9018, 9019)]
    for b in ens:
        path = store_dir / f"{b.replace(':', '_')}.ledgers"
        with LiveBookie(path) as index:
            log = EntryLog(path, 1)
            for md in mds:
                entries = {}
                for e in range(md.last_entry_id + 1):
                    body = (b"another payload" if (md.ledger_id, e, b) == (9016, 5, ens[2]) else b"payload").ljust(64)
                    if md.ledger_id == 9017:
                        body = encode.message("demo-producer", 1000 + e, [body], corrupt=e == 11)
                    elif md.ledger_id in DEDUP_MESSAGES:
                        body = encode.message(*DEDUP_MESSAGES[md.ledger_id][e])
                    entries[e] = entrylog.package_entry(md.ledger_id, e, e - 1, (e + 1) * 64, body, "CRC32C")
                if (md.ledger_id, b) == (9015, ens[0]):
                    entries[3] = entries[3][:-1] + bytes([entries[3][-1] ^ 0xFF])  # a flipped bit on its disk
                index.write(md.ledger_id, entries, log)
            log.finish()
            index.flush()
        demo.ledger_dirs[b] = path
    for key, why in (((Category.CORRUPT_ENTRY, 9015), f"entry 3's stored payload damaged on {ens[0]}"),
                     ((Category.LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY, 9015),
                      "WQ 3: the corrupt copy counts as none in a deep run"),
                     ((Category.DIVERGENT_COPIES, 9016), f"{ens[2]} stores another payload for entry 5"),
                     ((Category.PULSAR_CHECKSUM_MISMATCH, 9017),
                      "entry 11's message (demo-producer, sequence id 1011) damaged before BookKeeper stored it"),
                     ((Category.PULSAR_DEDUP_STATE_AHEAD_OF_DATA, 9019),
                      f"{DEDUP_TOPIC}'s deduplication says invoices persisted 140 by 9019:1; its last stored is 119"),
                     ((Category.PULSAR_REPEAT_UNDER_DEDUP, 9019),
                      "billing's sequence id 12 stored again at entry 15, after deduplication's snapshot")):
        demo.deep_expected.add((str(key[0]), key[1]))
        demo.notes[(str(key[0]), key[1])] = why
    return mds


@contextlib.contextmanager
def demo_agents(demo: DemoCluster, store: MetadataStore) -> Iterator[list[BookieAgent]]:
    """An in-process agent per bookie (not the unreachable one), registered in the metadata store."""
    agents = []
    try:
        for b, path in sorted(demo.store_files.items()):
            if b == bookie(UNREACHABLE):
                continue
            agent = BookieAgent(SyntheticStore(path), bind="127.0.0.1:0", workers=4).start()
            agent.register(store, b, f"127.0.0.1:{agent.port}")
            agents.append(agent)
        for b, path in sorted(demo.ledger_dirs.items()):
            source = DbLedgerStorageSource([path], path.with_suffix(".scratch"))
            agent = BookieAgent(source, bind="127.0.0.1:0", workers=4).start()
            agent.register(store, b, f"127.0.0.1:{agent.port}")
            agents.append(agent)
        yield agents
    finally:
        for a in agents:
            a.stop(grace=0)


def print_whatif(report: Report, whatif: Report, candidate: str) -> None:
    radius = (report.blast_radius or {}).get("bookies", {})
    print("blast radius: what falls below AQ if one bookie alone goes down (from the full run)")
    for b, f in list(radius.items())[:4]:
        print(f"  {b:<18} {f['ledgers_below_aq']:>5} ledgers ({f['topics_below_aq']} topics) below AQ, "
              f"{f['ledgers_without_a_copy']} without a copy")
    unsafe = [v for v in whatif.violations if spec(v.category).unsafe or "unsafe_without" in v.details]
    topics = sorted({v.owner.name for v in unsafe if v.owner and v.owner.kind == "topic"})
    verdict = {0: "safe", 1: "UNSAFE", 2: "cannot tell"}[whatif.whatif_exit_status()]
    print(f"what if {candidate} went down now: {verdict}: {len(unsafe)} ledgers would fall below AQ"
          + (f", topics {', '.join(topics[:5])}" if topics else "") + "\n")


def print_outcome(demo: DemoCluster, report: Report, whatif: Report, candidate: str, fmt: str) -> bool:
    """The report, the what-if, and each injected fault against what was found: True when they are equal."""
    print(report.dumps() if fmt == "json" else report.render_text())
    print_whatif(report, whatif, candidate)
    found = {(str(v.category), v.ledger_id) for v in report.violations}
    expected = demo.expected | demo.deep_expected
    print("injected fault                                          found?")
    for key in sorted(expected, key=lambda k: (k[1], k[0])):
        print(f"  ledger {key[1]:<6} {key[0]:<36} {'yes' if key in found else 'NO'}  ({demo.notes[key]})")
    for key in sorted(found - expected):
        print(f"  ledger {key[1]:<6} {key[0]:<36} UNEXPECTED")
    same = found == expected and report.complete
    print("\nthe findings equal the injected faults" if same else "\nthe findings DIFFER from the injected faults")
    return same


def run_demo(args: argparse.Namespace) -> int:
    if getattr(args, "real_bookkeeper", None):
        from scrutiny.testing.realdemo import run_real_demo

        return run_real_demo(args, serve=not args.no_serve)
    workdir = Path(tempfile.mkdtemp(prefix="scrutiny-demo-"))
    zk: LocalZooKeeper | None = None
    client: KazooClient | None = None
    try:
        if args.metadata_service_uri:
            uri = parse_metadata_service_uri(args.metadata_service_uri)
            hosts, root = uri.hosts, f"{uri.root}-demo-{int(time.time())}"
        else:
            print("starting a local ZooKeeper from Debian's jars ...", file=sys.stderr)
            zk = LocalZooKeeper(workdir=workdir / "zk")
            zk.start()
            hosts, root = zk.hosts, "/ledgers"
        client = KazooClient(hosts=hosts, timeout=15)
        client.start(timeout=15)
        t0 = time.monotonic()
        if args.setup_only:
            if not args.metadata_service_uri or not args.stores_dir:
                raise ConfigError("--setup-only needs --metadata-service-uri and --stores-dir")
            root = uri.root  # a fresh cluster where asked: the compose file's agents and auditors use it
            demo = build_demo_cluster(client, root, Path(args.stores_dir), healthy=args.ledgers)
            print(f"wrote {demo.ledgers} ledgers under {root}, {len(demo.store_files)} synthetic store files and "
                  f"{len(demo.ledger_dirs)} DbLedgerStorage ledger directories "
                  f"to {args.stores_dir}; expected findings: {sorted(demo.expected)}")
            return 0
        demo = build_demo_cluster(client, root, workdir, healthy=args.ledgers)
        print(f"wrote a cluster of {demo.ledgers} ledgers on 14 bookies under {root} "
              f"in {time.monotonic() - t0:.1f} s", file=sys.stderr)
        uri_text = f"zk+hierarchical://{hosts}{root}"
        settings = ScanSettings(metadata_service_uri=uri_text, underreplicated_grace_period=3600,
                                recheck_delay=2.0, engine=args.engine, bookie_deadline_seconds=10.0)
        engine = make_engine(settings)
        engine.open()  # Spark's JVM starts before the agents' gRPC threads exist
        with demo_agents(demo, ZooKeeperStore(client, uri_text)):
            print(f"scanning with {args.engine} ...", file=sys.stderr)
            try:
                # a deep run: every check, and the stored bytes the DbLedgerStorage bookies' agents read
                report = ScrutinyRun(dataclasses.replace(settings, deep=True), engine).execute()
                # Is it safe to take one bookie down for maintenance? The blast radius says it for every
                # bookie; a what-if run asks for one.
                candidate = bookie(WHATIF_CANDIDATE)
                whatif = ScrutinyRun(settings, engine).execute(without=[candidate])
            finally:
                engine.close()
            same = print_outcome(demo, report, whatif, candidate, args.format)
            if not args.no_serve:
                from scrutiny.testing.democonsole import serve_console  # the auditor: only when served

                serve_console(settings, workdir, args.port, candidate)
        return 0 if same else 1
    finally:
        if client is not None:
            client.stop()
            client.close()
        if zk is not None:
            zk.close()
        shutil.rmtree(workdir, ignore_errors=True)
