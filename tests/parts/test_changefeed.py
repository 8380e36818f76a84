"""Continuous scrutiny, the bookie's side: the agent's change feed (pure), what a DbLedgerStorage agent sees
change in a live bookie's real RocksDB indexes and entry logs, and the WatchHoldings stream a reader resumes."""

from __future__ import annotations

import contextlib
import queue
import random
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from scrutiny import entrylog
from scrutiny.agent import BookieAgent
from scrutiny.auditor.feeds import AgentFeeds
from scrutiny.changefeed import Change, ChangeFeed, Kind
from scrutiny.entrysources import DbLedgerStorageSource, dbwatch
from scrutiny.testing.clusterwriter import cookie
from scrutiny.testing.dbledgerstorage import EntryLog, LiveBookie
from scrutiny.v1 import bookie_pb2, bookie_pb2_grpc
from tests.parts.conftest import stored, writing_flushing_restarting
from tests.support.helpers import wait_for

Msg = bookie_pb2.HoldingsChange


def test_a_feed_numbers_its_changes_and_tells_a_reader_what_it_missed() -> None:
    feed = ChangeFeed(most_ids=25)
    assert feed.since("", 0) == ([], False)  # a first reader, nothing yet
    feed.append([Change(Kind.LEDGERS_GONE, (1, 2)), Change(Kind.BOOKIE_RESET, every_ledger=True)])
    events, gap = feed.since("", 0)
    assert [e.sequence for e in events] == [1, 2] and not gap
    assert [e.sequence for e in feed.since(feed.feed_id, 1)[0]] == [2]
    assert feed.since(feed.feed_id, 2) == ([], False)
    assert feed.since("another-agent", 2)[1]  # the agent restarted: what changed meanwhile is unknown
    assert feed.since(feed.feed_id, 7)[1]  # a cursor ahead of the feed is not this feed's
    feed.append([Change(Kind.LEDGERS_GONE, tuple(range(30)))])  # 30 ids in changes of at most 10,000
    events, gap = feed.since(feed.feed_id, 1)
    assert gap and [e.sequence for e in events] == [3]  # the older changes went to keep 25 ids at most
    old = feed.feed_id
    feed.renew()  # the agent stopped watching for a while
    assert feed.feed_id != old and feed.since(old, 3) == ([], True) and feed.since("", 0) == ([], False)
    feed.append([Change(Kind.LEDGERS_GONE, (9,))])
    assert [e.sequence for e in feed.since(feed.feed_id, 3)[0]] == [4]  # the numbers go on


def test_a_change_of_many_ledgers_is_split_and_a_waiting_reader_wakes() -> None:
    feed = ChangeFeed()
    woke = threading.Event()
    waiter = threading.Thread(target=lambda: woke.set() if feed.wait(0, 10) else None)
    waiter.start()
    feed.append([Change(Kind.LEDGERS_GONE, tuple(range(25_000)))])
    waiter.join(10)
    assert woke.is_set() and [len(e.change.ledger_ids) for e in feed.since("", 0)[0]] == [10_000, 10_000, 5_000]
    assert not feed.wait(feed.last, 0.05)


# -- a live DbLedgerStorage bookie ------------------------------------------------------------------

def look(source: DbLedgerStorageSource) -> list[Change]:
    source.refresh()
    return source.changes()[0]


def test_what_a_dbledgerstorage_agent_sees_change(bookie: tuple[Path, LiveBookie], tmp_path: Path) -> None:
    path, live = bookie
    source = DbLedgerStorageSource([path], tmp_path / "scratch")
    try:
        assert look(source) == [] and look(source) == []  # the first look takes stock; nothing changed since
        live.delete(2)  # the bookie's GC (or a loss): the ledger leaves the `ledgers` index
        live.flush()
        assert look(source) == [Change(Kind.LEDGERS_GONE, (2,), "left the ledgers index")]
        # compaction: log 2's entries moved to log 4, then log 2 removed: garbage collection as it should be
        live.compact(path, 2, EntryLog(path, 4))
        assert look(source) == []
        # the class of apache/bookkeeper #4607: log 1 removed while the index still points into it
        entrylog.log_path(path, 1).unlink()
        (gone,) = look(source)
        assert (gone.kind, gone.ledger_ids, gone.entry_log) == (Kind.ENTRY_LOG_GONE, (1, 3), 1)
        assert source.availability(1) is not None and source.availability(1).entries == 0  # type: ignore[union-attr]
        assert source.availability(4).entries == 10  # type: ignore[union-attr]  # moved, then its log went: fine
        # the log being written removed: it has no map yet, so every ledger held is looked at for it
        entrylog.log_path(path, 3).unlink()
        (unmapped,) = look(source)
        assert (unmapped.kind, unmapped.ledger_ids, unmapped.entry_log) == (Kind.ENTRY_LOG_GONE, (6,), 3)
        assert source.availability(6).entries == 0  # type: ignore[union-attr]
        # back as another instance
        (path / "current" / "VERSION").write_bytes(cookie("127.0.8.1:3181", "two"))
        (reset,) = look(source)
        assert reset.kind is Kind.BOOKIE_RESET and reset.every_ledger
    finally:
        source.close()


def test_unfollowed_the_watch_is_let_go_and_taken_anew(bookie: tuple[Path, LiveBookie], tmp_path: Path) -> None:
    """Nobody follows the feed: the agent keeps nothing to watch with (its answers need no watch: a log removed
    meanwhile is left out at once); followed again, it takes stock anew and reports only what changed since."""
    path, live = bookie
    source = DbLedgerStorageSource([path], tmp_path / "scratch")
    try:
        assert source.changes() == ([], 6)  # stock taken: the keys of ledgers 1-6 read
        source.unwatched()
        live.delete(2)
        live.flush()
        entrylog.log_path(path, 1).unlink()
        source.refresh()
        assert source.availability(1).entries == 0  # type: ignore[union-attr]
        assert source.changes() == ([], 5)  # followed again: stock taken anew (1, 3, 4, 5, 6); nothing reported
        assert source.index_passes == 2
        live.delete(5)
        live.flush()
        assert source.changes()[0] == [Change(Kind.LEDGERS_GONE, (5,), "left the ledgers index")]
    finally:
        source.close()


def test_the_index_is_followed_in_its_wal_and_read_whole_only_when_the_wal_cannot_tell(
        bookie: tuple[Path, LiveBookie], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy bookie's `ledgers` index moves at every look (ledgers created, fenced, deleted by its garbage
    collector): the agent reads what was written since the last look from the index's WAL, never every key.
    It reads every key again only when the WAL cannot tell (a WAL file removed before its end was read, after
    a flush of the memtable: rare, the index's memtable is 64 MB), and follows the WAL again from there."""
    path, live = bookie

    def changed() -> tuple[list[Change], int]:
        source.refresh()
        return source.changes()

    def gone(*ids: int) -> list[Change]:
        return [Change(Kind.LEDGERS_GONE, ids, "left the ledgers index")]

    monkeypatch.setattr(dbwatch, "KEYS_PASS_AT_LEAST_EVERY_SECONDS", 0.0)  # never needed while the WAL is read
    source = DbLedgerStorageSource([path], tmp_path / "scratch")
    try:
        look(source)
        for lid in range(100, 110):  # created: ten puts read
            live.add(lid, range(5))
        assert changed() == ([], 10)
        live.delete(101)  # a ledger created since the last whole pass, gone: seen
        live.add(110, range(5))
        assert changed() == (gone(101), 2)
        live.add(50, range(5))  # a lower id (a re-replicated ledger), then deleted: both seen
        assert changed() == ([], 1)
        live.delete(50)
        live.set_limbo(3, True)  # a put of a key held: nothing changed
        assert changed() == (gone(50), 2)
        live.delete(102)
        live.flush()  # the WAL holding that delete removed before the look: every key read (1-6, 100-110 less 2)
        assert changed() == (gone(102), 6 + 9)
        live.delete(103)  # followed again from there
        assert changed() == (gone(103), 1)
        live.add(111, range(5))
        assert changed() == ([], 1)
        live.flush()  # a flush after a look read the WAL's end: nothing lost
        live.delete(104)
        assert changed() == (gone(104), 1)
        assert changed() == ([], 0)
    finally:
        source.close()


def test_a_costly_keys_only_pass_waits_its_share_of_the_cpu(bookie: tuple[Path, LiveBookie], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    path, live = bookie
    monkeypatch.setattr(dbwatch, "KEYS_PASS_CHEAP_SECONDS", 0.0)  # every pass counts as costly here
    source = DbLedgerStorageSource([path], tmp_path / "scratch")
    try:
        look(source)
        assert source._watch is not None
        clock = [time.monotonic()]
        source._watch.clock = lambda: clock[0]
        cost = source._watch.pass_cost[0]
        live.delete(3)
        live.flush()  # its WAL removed unread: a pass is needed
        assert source.changes() == ([], 0)  # too soon after the last pass: the delete is remembered
        live.add(200, range(5))
        assert source.changes() == ([], 1)  # meanwhile, the ledgers created are read (the keys above the last)
        clock[0] += cost / dbwatch.KEYS_PASS_CPU_SHARE + 0.001
        assert source.changes() == ([Change(Kind.LEDGERS_GONE, (3,), "left the ledgers index")], 6)
    finally:
        source.close()


def test_the_index_emptied_is_a_reset(bookie: tuple[Path, LiveBookie], tmp_path: Path) -> None:
    path, live = bookie
    source = DbLedgerStorageSource([path], tmp_path / "scratch")
    try:
        look(source)
        for lid in range(1, 7):
            live.delete(lid)
        live.flush()
        kinds = {c.kind: c for c in look(source)}
        assert kinds.keys() == {Kind.BOOKIE_RESET, Kind.LEDGERS_GONE}
        assert kinds[Kind.LEDGERS_GONE].ledger_ids == (1, 2, 3, 4, 5, 6)
    finally:
        source.close()


def test_watch_holdings_streams_changes_a_reader_resumes(bookie: tuple[Path, LiveBookie], tmp_path: Path) -> None:
    """The agent watches its `ledgers` index from its start and while a reader follows it, and a linger
    after: a reader back after that is told it missed changes; a reader's call takes stock before its
    headers."""
    path, live = bookie
    agent = BookieAgent(DbLedgerStorageSource([path], tmp_path / "scratch"), bind="127.0.0.1:0",
                        watch_interval_seconds=0.1, watch_linger_seconds=1.0).start()
    watching = agent.servicer.metrics.watching
    try:
        with grpc.insecure_channel(f"127.0.0.1:{agent.port}") as channel:
            stub = bookie_pb2_grpc.BookieStub(channel)

            def read(feed_id: str, after: int, until: int, then: Callable[[], None] = lambda: None) -> list[Msg]:
                """`until` messages other than heartbeats after the cursor, `then` done once the stream is open."""
                got: list[Msg] = []
                call = stub.WatchHoldings(bookie_pb2.WatchHoldingsRequest(feed_id=feed_id, after_sequence=after),
                                          timeout=20)
                call.initial_metadata()
                then()
                for m in call:
                    got.append(m)
                    if m.kind != Msg.HEARTBEAT and len([g for g in got if g.kind != Msg.HEARTBEAT]) >= until:
                        call.cancel()
                        break
                return got

            def delete(lid: int) -> Callable[[], None]:
                return lambda: (live.delete(lid), live.flush())  # type: ignore[func-returns-value]

            wait_for(lambda: watching._value.get() == 1, 5)  # watching from its start ...
            wait_for(lambda: watching._value.get() == 0, 10)  # ... until nobody has followed for the linger
            live.delete(5)
            live.flush()
            t0 = time.time()
            (first,) = read("", 0, 1, then=delete(6))  # 5 went before anyone followed: not in the feed
            assert first.kind == Msg.LEDGERS_GONE and list(first.ledger_ids) == [6] and first.sequence == 1
            assert t0 - 1 <= first.observed_at_ms / 1000 <= time.time() and watching._value.get() == 1
            live.delete(4)
            live.flush()
            (second,) = read(first.feed_id, first.sequence, 1)  # back within the linger: resumed, nothing missed
            assert list(second.ledger_ids) == [4] and second.sequence == 2
            wait_for(lambda: watching._value.get() == 0, 10)  # nobody for longer than the linger
            live.delete(3)
            live.flush()
            gap, third = read(second.feed_id, second.sequence, 2, then=delete(2))
            assert gap.kind == Msg.GAP and gap.feed_id != second.feed_id and list(third.ledger_ids) == [2]
            gap, *rest = read("an-agent-before-a-restart", 2, 2)
            assert gap.kind == Msg.GAP and [m.ledger_ids for m in rest] == [[2]]
    finally:
        agent.stop(grace=0)


def test_a_source_that_cannot_watch_says_so(tmp_path: Path) -> None:
    from scrutiny.entrysources import SyntheticStore
    from scrutiny.entrysources.synthetic import SyntheticStoreWriter

    w = SyntheticStoreWriter()
    w.add_entries("b:3181", 1, range(3))
    agent = BookieAgent(SyntheticStore(w.write_all(tmp_path)["b:3181"]), bind="127.0.0.1:0").start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{agent.port}") as channel, pytest.raises(grpc.RpcError) as err:
            next(bookie_pb2_grpc.BookieStub(channel).WatchHoldings(bookie_pb2.WatchHoldingsRequest(), timeout=5))
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        agent.stop(grace=0)


# -- what the leader reads of a DbLedgerStorage agent, whatever the bookie does between two looks ----------

@contextlib.contextmanager
def leader_reading(agent: BookieAgent) -> Iterator[Callable[[], Msg]]:
    """The agent's feed as the leader follows it (AgentFeeds), from the start; `next_change()` the next
    change (heartbeats and the up-ness of the stream aside)."""
    got: queue.Queue[Msg] = queue.Queue()
    states: dict[str, str] = {}
    feeds = AgentFeeds(lambda b: f"127.0.0.1:{agent.port}", lambda b: ("", 0),
                       lambda b, feed_id, msg: got.put(msg), lambda b: None, states)
    feeds.follow("bookie")
    try:
        wait_for(lambda: states.get("agent bookie") == "up", 10)

        def next_change() -> Msg:
            while True:
                msg = got.get(timeout=10)
                if msg.kind != Msg.HEARTBEAT:
                    return msg
        yield next_change
        assert got.empty(), [m.kind for m in got.queue]
    finally:
        feeds.stop()


def test_a_delete_left_in_the_memtable_after_a_flushed_one_is_fed(bookie: tuple[Path, LiveBookie],
                                                                  tmp_path: Path) -> None:
    """One ledger deleted and flushed (then compacted, which drops its delete: the index holds no delete at
    all), a second one deleted and left in the memtable and the WAL, as a bookie's garbage collection
    leaves it: both are fed. (The agent's looks are made here one by one: `Watching.look`.)"""
    path, live = bookie
    agent = BookieAgent(DbLedgerStorageSource([path], tmp_path / "scratch"), bind="127.0.0.1:0",
                        watch_interval_seconds=0).start()
    try:
        with leader_reading(agent) as next_change:
            live.delete(5)
            agent.servicer.watching.look()
            change = next_change()
            assert (change.kind, list(change.ledger_ids)) == (Msg.LEDGERS_GONE, [5])
            live.flush()
            live.ledgers.compact_range(None, None)
            agent.servicer.watching.look()
            live.delete(6)
            agent.servicer.watching.look()
            change = next_change()
            assert (change.kind, list(change.ledger_ids)) == (Msg.LEDGERS_GONE, [6])
    finally:
        agent.stop(grace=0)


@pytest.mark.parametrize("seed", range(8))
def test_every_delete_is_seen_whatever_the_index_does_between_two_looks(tmp_path: Path, seed: int) -> None:
    """A bookie's `ledgers` index written at random between the looks (creates, deletes, flushes, compactions
    that drop deletes, restarts that replay the WAL and flush it): every ledger held at a look and deleted
    after it is reported gone at the next look, and no other; and the agent answers for exactly the ledgers
    the bookie holds (a secondary that replayed a put and not the delete flushed after it would not)."""
    rng = random.Random(seed)
    path = tmp_path / "bookie"
    live = LiveBookie(path)
    held = set(range(1, 60))
    for lid in held:
        live.add(lid, [0])
    live.flush()
    source = DbLedgerStorageSource([path], tmp_path / "scratch")
    try:
        look(source)
        seen, gone, created = set(held), set(), 1000
        for _ in range(120):
            op = rng.choice(["delete", "delete", "create", "flush", "compact", "restart", "look", "look"])
            if op == "delete" and held:
                lid = rng.choice(sorted(held))
                held.discard(lid)
                live.delete(lid)
                gone |= {lid} & seen
            elif op == "create":
                live.add(created, [0])
                held.add(created)
                created += 1
            elif op == "flush":
                live.flush()
            elif op == "compact":
                live.ledgers.compact_range(None, None)
            elif op == "restart":
                live.close()
                live = LiveBookie(path)
            elif op == "look":
                reported = {lid for c in look(source) if c.kind is Kind.LEDGERS_GONE for lid in c.ledger_ids}
                assert reported == gone, (seed, sorted(gone - reported), sorted(reported - gone))
                answered = {lid for lid in [*range(1, 60), *range(1000, created)] if source.entry_ids(lid)}
                assert answered == held, (seed, sorted(answered ^ held))  # and the answers are the bookie's
                seen, gone = set(held), set()
    finally:
        source.close()
        live.close()


def test_a_bookie_formatted_and_back_within_one_look_is_another_bookie(bookie: tuple[Path, LiveBookie],
                                                                      tmp_path: Path) -> None:
    """The bookie formatted (its ledger directory removed, new empty indexes, the same cookie written again, a
    first entry log anew) and restarted between two of the agent's looks: its answers come from the new
    indexes at once, and the feed says the bookie is another one at the next look."""
    path, live = bookie
    agent = BookieAgent(DbLedgerStorageSource([path], tmp_path / "scratch"), bind="127.0.0.1:0",
                        watch_interval_seconds=0).start()
    cookie = (path / "current" / "VERSION").read_bytes()
    try:
        with leader_reading(agent) as next_change, grpc.insecure_channel(f"127.0.0.1:{agent.port}") as channel:
            stub = bookie_pb2_grpc.BookieStub(channel)

            def answers() -> dict[int, int]:
                call = stub.GetListOfEntriesOfLedgers(bookie_pb2.GetListOfEntriesOfLedgersRequest(
                    ledger_ids=[1, 2, 100]), timeout=10)
                return {a.ledger_id: a.status for m in call for a in m.ledgers}

            assert answers() == {1: bookie_pb2.EOK, 2: bookie_pb2.EOK, 100: bookie_pb2.ENOLEDGER}
            live.close()
            shutil.rmtree(path / "current")
            live = LiveBookie(path)
            (path / "current" / "VERSION").write_bytes(cookie)
            log = EntryLog(path, 0)
            for lid in (100, 101):
                live.write(lid, {e: stored(lid, e) for e in range(3)}, log)
            live.flush()
            assert answers() == {1: bookie_pb2.ENOLEDGER, 2: bookie_pb2.ENOLEDGER, 100: bookie_pb2.EOK}
            agent.servicer.watching.look()
            reset = next_change()
            assert reset.kind == Msg.BOOKIE_RESET and reset.every_ledger and "created anew" in reset.detail
            live.delete(100)
            live.flush()
            agent.servicer.watching.look()
            change = next_change()
            assert (change.kind, list(change.ledger_ids)) == (Msg.LEDGERS_GONE, [100])
    finally:
        agent.stop(grace=0)
        live.close()


def test_the_watch_sees_nothing_gone_while_the_bookie_only_writes_flushes_and_restarts(tmp_path: Path) -> None:
    """The watch catches up with the `ledgers` index as the answers do: a write-ahead log the bookie flushed
    into an SST and removed while the secondary read (a flush; a restart's recovery) would leave its ledgers
    in neither for one look. Here the bookie only creates ledgers, flushing and restarting as fast as it can,
    while the watch looks: nothing is ever gone, and the bookie is never another."""
    from scrutiny.entrysources import SourceError

    path = tmp_path / "bookie"
    live = LiveBookie(path)
    live.add(0, [0])
    live.flush()
    source = DbLedgerStorageSource([path], tmp_path / "scratch")
    looks, seen = 0, []
    try:
        look(source)  # stock taken before the bookie moves
        with writing_flushing_restarting(live, first=1) as writing:
            end = time.monotonic() + 8
            while time.monotonic() < end:
                try:
                    seen += look(source)
                except SourceError:
                    continue  # a catch-up that never settled: no look, nothing said
                looks += 1
    finally:
        source.close()
        live.close()
    assert looks >= 20 and writing.moves["restarts"] >= 5, (looks, writing.moves)
    assert seen == [], f"{len(seen)} changes in {looks} looks beside {dict(writing.moves)}: {seen[:3]}"
