"""ZooKeeper's persistent recursive watch (3.6+, `addWatch`, opcode 106), on kazoo's own connection.

kazoo 2.11 has no call for it, so the request is a type beside kazoo's own (as `MultiRead` is), and its
events, which kazoo would drop (they name descendants no one-shot watcher asked about), are taken from the
connection's event reader before kazoo looks for its own watchers. ZooKeeper re-adds a client's watches
when it reconnects to the same session, but replays nothing that changed while it was away, and a new
session has no watch at all: every reconnection is reported as a gap (`on_gap`), and the watch is added
again on a new session. Mode values are ZooKeeper's `ZooDefs.AddWatchModes` (persistent 0, persistent
recursive 1).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.protocol.serialization import Watch, int_struct, write_string

from scrutiny.store.zkrequests import submit

log = logging.getLogger(__name__)
PERSISTENT_RECURSIVE = 1
EVENT_TYPES = {1: "created", 2: "deleted", 3: "changed"}  # NodeChildrenChanged (4) never comes for this mode


class AddWatch:
    type = 106

    def __init__(self, path: str, mode: int = PERSISTENT_RECURSIVE) -> None:
        self.path, self.mode = path, mode

    def serialize(self) -> bytearray:
        return write_string(self.path) + int_struct.pack(self.mode)

    @classmethod
    def deserialize(cls, buf: bytes, offset: int) -> None:
        return None  # the reply is its header alone


class TreeWatch:
    """Every create, change and delete below `path`, as (event, path) on `on_event` (called on kazoo's
    connection thread: it must only take note), until closed; a reconnection or a new session on `on_gap`."""

    def __init__(self, client: KazooClient, path: str, on_event: Callable[[str, str], None],
                 on_gap: Callable[[str], None], timeout: float = 10.0) -> None:
        self.client, self.path, self.timeout = client, path.rstrip("/") or "/", timeout
        self.on_event, self.on_gap = on_event, on_gap
        self._closed = threading.Event()
        self._prefix = self.client.chroot + self.path if self.path != "/" else self.client.chroot + "/"
        connection = client._connection
        self._original = connection._read_watch_event
        connection._read_watch_event = self._read_watch_event
        self._interrupted = False
        client.add_listener(self._state)
        self._add()

    def _add(self) -> None:
        result = submit(self.client, AddWatch(self.path))
        result.get(timeout=self.timeout)

    def _read_watch_event(self, buffer: bytes, offset: int) -> Any:
        if not self._closed.is_set():
            watch, _ = Watch.deserialize(buffer, offset)
            path = watch.path
            if watch.type in EVENT_TYPES and (path == self._prefix.rstrip("/") or path.startswith(self._prefix + "/")
                                              or self._prefix == "/"):
                try:
                    self.on_event(EVENT_TYPES[watch.type], self.client.unchroot(path))
                except Exception:  # the connection thread must go on
                    log.exception("a tree watch's event handler failed")
        return self._original(buffer, offset)

    def _state(self, state: str) -> None:
        """On kazoo's event thread: note an interruption; once connected again, add the watch again (on a
        thread of its own: no blocking call here) and report the gap."""
        if self._closed.is_set():
            return
        if state in (KazooState.SUSPENDED, KazooState.LOST):
            self._interrupted = True
        elif state == KazooState.CONNECTED and self._interrupted:
            self._interrupted = False
            threading.Thread(target=self._again, name="tree-watch", daemon=True).start()

    def _again(self) -> None:
        try:
            self._add()  # harmless on the same session (ZooKeeper re-added it already), needed on a new one
        except Exception as exc:
            log.warning("could not add the persistent watch on %s again: %s", self.path, exc)
        self.on_gap("the connection to ZooKeeper was interrupted: changes meanwhile were not seen")

    def position(self) -> str:
        return ""  # ZooKeeper's watches replay nothing: no later watch can resume from here

    def close(self) -> None:
        self._closed.set()
        self.client.remove_listener(self._state)
        connection = self.client._connection
        if connection._read_watch_event == self._read_watch_event:
            connection._read_watch_event = self._original
