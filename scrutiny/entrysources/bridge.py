"""A stock bookie (Sorted/InterleavedLedgerStorage) asked over BookKeeper's own v3 protocol,
GET_LIST_OF_ENTRIES_OF_LEDGER; its answer is relayed as it is. BookKeeper's protocol cannot list a bookie's
ledgers: this source cannot."""

from __future__ import annotations

import queue
import socket
import struct
import threading

from scrutiny import codec
from scrutiny.bookkeeper import bookie_protocol_pb2 as bkp
from scrutiny.entrysources.source import Holding, SourceError

MAX_FRAME = 5 * 1024 * 1024
_LEN = struct.Struct(">i")


def request_frame(ledger_id: int, txn_id: int) -> bytes:
    req = bkp.Request(
        header=bkp.BKPacketHeader(version=bkp.VERSION_THREE, operation=bkp.GET_LIST_OF_ENTRIES_OF_LEDGER,
                                  txnId=txn_id),
        getListOfEntriesOfLedgerRequest=bkp.GetListOfEntriesOfLedgerRequest(ledgerId=ledger_id),
    )
    body = req.SerializeToString()
    return _LEN.pack(len(body)) + body


def read_frame(sock: socket.socket) -> bytes:
    (length,) = _LEN.unpack(_recv_exactly(sock, 4))
    if length < 0 or length > MAX_FRAME:
        raise SourceError(f"bookie sent a frame of {length} bytes (at most {MAX_FRAME})")
    return _recv_exactly(sock, length)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise SourceError("bookie closed the connection mid-frame")
        buf += chunk
    return bytes(buf)


class BookieBridgeSource:
    """Relays GET_LIST_OF_ENTRIES_OF_LEDGER to a stock bookie; a small pool of connections, one
    request in flight on each."""

    def __init__(self, host: str, port: int, timeout: float = 10.0, connections: int = 4) -> None:
        self.address = (host, port)
        self.timeout = timeout
        self._pool: queue.LifoQueue[socket.socket | None] = queue.LifoQueue()
        for _ in range(connections):
            self._pool.put(None)
        self._txn = 0
        self._txn_lock = threading.Lock()

    def _next_txn(self) -> int:
        with self._txn_lock:
            self._txn += 1
            return self._txn

    def refresh(self) -> None:
        pass  # the stock bookie answers from its own live state

    def availability(self, ledger_id: int) -> Holding | None:
        sock = self._pool.get()
        try:
            if sock is None:
                sock = socket.create_connection(self.address, timeout=self.timeout)
            txn = self._next_txn()
            sock.sendall(request_frame(ledger_id, txn))
            resp = bkp.Response()
            resp.ParseFromString(read_frame(sock))
        except (OSError, SourceError, ValueError) as exc:
            if sock is not None:
                sock.close()
            sock = None
            raise SourceError(f"bookie {self.address[0]}:{self.address[1]}: {exc}") from None
        finally:
            self._pool.put(sock)
        if resp.header.txnId != txn:
            raise SourceError(f"bookie answered transaction {resp.header.txnId}, asked {txn}")
        inner = resp.getListOfEntriesOfLedgerResponse
        status = inner.status if inner.HasField("status") else resp.status
        if bkp.ENOLEDGER in (resp.status, status):
            return None
        if bkp.EUNKNOWNLEDGERSTATE in (resp.status, status):
            return Holding(bytes(inner.availabilityOfEntriesOfLedger) or codec.encode([]), limbo=True)
        if status != bkp.EOK or resp.status != bkp.EOK:
            raise SourceError(f"bookie answered {bkp.BKStatusCode.Name(status if status else resp.status)}")
        return Holding(bytes(inner.availabilityOfEntriesOfLedger))

    def close(self) -> None:
        while not self._pool.empty():
            sock = self._pool.get_nowait()
            if sock is not None:
                sock.close()

