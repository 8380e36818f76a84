"""One root for the errors scrutiny raises on purpose, in four kinds, each mapped once to an exit
status (commands) and a gRPC status code (the RPC servers).

- StoreError: a store scrutiny reads (the metadata store, a bookie's index) cannot be read now.
- DataError: bytes from outside (a znode, an answer, a file) that do not follow their format.
- ConfigError: a setting, flag or config file that is wrong.
- RequestError: a caller's request that cannot be served as asked.
"""

from __future__ import annotations

import grpc

EXIT_CLEAN, EXIT_VIOLATIONS, EXIT_INCOMPLETE = 0, 1, 2


class ScrutinyError(Exception):
    grpc_code = grpc.StatusCode.INTERNAL
    exit_status = EXIT_INCOMPLETE


class StoreError(ScrutinyError):
    grpc_code = grpc.StatusCode.UNAVAILABLE


class Fenced(StoreError):
    """A write a leader made conditional on still being the leader, refused: its election node is gone."""


class DataError(ScrutinyError):
    grpc_code = grpc.StatusCode.INTERNAL


class MetadataError(DataError):
    """Metadata (a znode, a key, a record) that cannot be decoded or is inconsistent."""


class ConfigError(ScrutinyError):
    grpc_code = grpc.StatusCode.FAILED_PRECONDITION


class RequestError(ScrutinyError):
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT


class NotLeader(RequestError):
    grpc_code = grpc.StatusCode.FAILED_PRECONDITION

    def __init__(self, leader: str) -> None:
        super().__init__(f"this auditor is a standby; the leader is at {leader or 'an unknown address'}")
        self.leader = leader


class Busy(RequestError):
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class NotFound(RequestError):
    grpc_code = grpc.StatusCode.NOT_FOUND


class Unauthenticated(RequestError):
    grpc_code = grpc.StatusCode.UNAUTHENTICATED


def one_line(exc: BaseException) -> str:
    """An error as operators grep it: one line."""
    return " ".join(str(exc).split())
