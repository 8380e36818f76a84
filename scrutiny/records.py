"""The shape of every record the auditor's leaders keep in the metadata store beside their election
(`<scrutiny path>/auditor/<name>`): a new leader goes on from them. Each is read tolerantly (Patroni's
`from_node`): absent, it is the record's `empty()`; unreadable (written by another version, damaged), it is
`empty()` too and the log says so, with what that costs. A record is data: its name, how its bytes are
read and written, and what it is when there is none."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from scrutiny.errors import DataError

log = logging.getLogger(__name__)
T = TypeVar("T")


class RecordStore(Protocol):
    def auditor_record(self, name: str) -> bytes | None: ...

    def set_auditor_record(self, name: str, data: bytes) -> None: ...


@dataclass(frozen=True)
class LeaderRecord(Generic[T]):
    name: str  # below <scrutiny path>/auditor/
    parse: Callable[[bytes], T]  # raises DataError (or ValueError) saying what is wrong
    dump: Callable[[T], bytes]
    empty: Callable[[], T]  # no record, or one that cannot be read
    lost: str = ""  # what an unreadable record costs, in words ("every orphan is sighted anew")

    def read(self, store: RecordStore) -> T:
        data = store.auditor_record(self.name)
        if not data:
            return self.empty()
        try:
            return self.parse(data)
        except (DataError, ValueError) as exc:
            log.error("the leaders' record %s cannot be read (%s)%s", self.name, exc,
                      f": {self.lost}" if self.lost else "")
            return self.empty()

    def write(self, store: RecordStore, value: T) -> None:
        store.set_auditor_record(self.name, self.dump(value))
