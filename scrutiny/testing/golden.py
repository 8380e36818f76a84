"""Golden bytes from a real BookKeeper: what a real client, bookie and Auditor write, captured so that the fast tests
(`tests/pure/test_golden.py`) hold scrutiny's decoders, and the encoders of its test tooling, to BookKeeper's own
bytes. Made again with

    python -m scrutiny.testing.golden --version 4.17.3 --out tests/golden/bookkeeper-4.17.3

(`make peers` first). Each capture is a file of the output directory; `manifest.json` says what each holds."""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scrutiny import entrylog
from scrutiny.entrysources.layout import ENTRY_KEY
from scrutiny.testing.localzk import LocalZooKeeper
from scrutiny.testing.metadatahome import OnZooKeeper
from scrutiny.testing.realbookkeeper import RealBookKeeper, Release

DIGESTS = ("CRC32", "CRC32C", "MAC", "DUMMY")
PULSAR_KEYS = {"application": "pulsar", "component": "managed-ledger", "pulsar/managed-ledger": "public/golden/t"}
PAYLOAD = 60  # each entry's payload, in bytes (tests/peers LedgerTool: "ledger L entry E;" repeated)


def payload(ledger_id: int, entry_id: int, size: int = PAYLOAD) -> bytes:
    """The payload LedgerTool writes for an entry (what a test recomputes to check a stored entry)."""
    stamp = f"ledger {ledger_id} entry {entry_id};".encode()
    size = max(size, len(stamp))
    return (stamp * (size // len(stamp) + 1))[:size]


def capture(version: str, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="scrutiny-golden-"))
    zk = LocalZooKeeper(workdir=work / "zk")
    zk.start()
    cluster = RealBookKeeper(Release.of(version), OnZooKeeper(zk.hosts, "/golden/ledgers"), work / "bk")
    manifest: dict[str, Any] = {"bookkeeper": version, "made_by": f"python -m scrutiny.testing.golden --version "
                                f"{version} --out {out}", "metadata": {}, "entries": {}}
    try:
        bookies = [cluster.add_bookie() for _ in range(3)]
        direct = cluster.add_bookie(dbStorage_directIOEntryLogger="true")
        client = cluster.client()
        zk_get = cluster.tree.get

        def save(name: str, data: bytes) -> str:
            (out / name).write_bytes(data)
            return name

        def ledger_path(lid: int) -> str:
            digits = f"{lid:010d}"
            return f"{cluster.root}/{digits[:2]}/{digits[2:6]}/L{digits[6:]}"

        for digest in DIGESTS:
            keys = PULSAR_KEYS if digest == "CRC32C" else {}
            lid, last = client.create(4, 4, 2, digest, entries=5, size=PAYLOAD, metadata=keys)
            manifest["metadata"][digest] = {"file": save(f"metadata-{digest}.bin", zk_get(ledger_path(lid))[0]),
                                            "ledger_id": lid, "last_entry_id": last, "ensemble_size": 4,
                                            "write_quorum": 4, "ack_quorum": 2, "password": "scrutiny",
                                            "custom_metadata": keys, "length": 5 * PAYLOAD}
        opened = client.open(3, 2, 2, "CRC32C")
        client.add(opened, 3, PAYLOAD)
        manifest["metadata"]["open"] = {"file": save("metadata-open.bin", zk_get(ledger_path(opened))[0]),
                                        "ledger_id": opened}
        client.recover(opened)  # fenced and closed by a second client
        manifest["metadata"]["recovered"] = {"file": save("metadata-recovered.bin", zk_get(ledger_path(opened))[0]),
                                             "ledger_id": opened, "last_entry_id": 2}
        time.sleep(2)  # flushed: the indexes and entry logs hold every entry

        # what a bookie stores: its indexes' values, its entry logs, each digest's entry as stored
        from scrutiny.entrysources import DbLedgerStorageSource

        holder = bookies[0]
        source = DbLedgerStorageSource([holder.ledger_dir], work / "scratch")
        try:
            for digest in DIGESTS:
                lid = manifest["metadata"][digest]["ledger_id"]
                locations = source.locations_of(lid) or []
                _, eid, location = locations[1]
                log_id, pos = entrylog.split_location(location)
                data = entrylog.log_path(holder.ledger_dir, log_id).read_bytes()
                (size,) = entrylog.ENTRY_SIZE.unpack_from(data, pos - entrylog.ENTRY_SIZE.size)
                lac, length = struct.unpack_from(">qq", data, pos + 16)
                manifest["entries"][digest] = {"file": save(f"entry-{digest}.bin", data[pos:pos + size]),
                                               "ledger_id": lid, "entry_id": eid, "last_add_confirmed": lac,
                                               "length": length, "payload": payload(lid, eid).decode()}
            ledgers, locations_db = source.opened()[0]
            lid = manifest["metadata"]["CRC32C"]["ledger_id"]
            manifest["ledger_data"] = {"file": save("ledger-data.bin", ledgers.get(struct.pack(">q", lid)) or b""),
                                       "ledger_id": lid}
            fenced = ledgers.get(struct.pack(">q", opened))
            if fenced is not None:
                manifest["ledger_data_fenced"] = {"file": save("ledger-data-fenced.bin", fenced),
                                                  "ledger_id": opened}
            value = locations_db.get(ENTRY_KEY.pack(lid, 0))
            manifest["location"] = {"key": ENTRY_KEY.pack(lid, 0).hex(), "value": (value or b"").hex()}
        finally:
            source.close()
        first_log = sorted((holder.ledger_dir / "current").glob("*.log"), key=lambda p: int(p.stem, 16))[0]
        manifest["entry_log_header"] = {"file": save("entrylog-header.bin", first_log.read_bytes()[:1024])}
        direct_log = sorted((direct.ledger_dir / "current").glob("*.log"), key=lambda p: int(p.stem, 16))[0]
        manifest["direct_entry_log_header"] = {"file": save("entrylog-direct-header.bin",
                                                            direct_log.read_bytes()[:4096])}
        bid = holder.bookie_id
        manifest["registration"] = {"file": save("registration.bin", zk_get(f"{cluster.root}/available/{bid}")[0]),
                                    "bookie_id": bid, "port": holder.port}
        manifest["cookie"] = {"file": save("cookie-znode.txt", zk_get(f"{cluster.root}/cookies/{bid}")[0]),
                              "local_file": save("cookie-file.txt",
                                                 (holder.ledger_dir / "current" / "VERSION").read_bytes())}
        manifest["layout"] = {"file": save("layout.txt", zk_get(f"{cluster.root}/LAYOUT")[0])}

        # a mark as BookKeeper's Auditor writes it: a bookie lost, its ledgers marked, no bookie to copy them to
        cluster.autorecovery(percentage=0)
        lost = bookies[2]
        lost.kill()
        lid = manifest["metadata"]["CRC32C"]["ledger_id"]
        digits = f"{lid:016x}"
        mark = f"{cluster.root}/underreplication/ledgers/{digits[0:4]}/{digits[4:8]}/{digits[8:12]}/" \
               f"{digits[12:16]}/urL{lid:010d}"
        deadline = time.monotonic() + 120
        while not cluster.tree.exists(mark):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no mark for ledger {lid}; see {cluster.workdir}")
            time.sleep(0.2)
        manifest["mark"] = {"file": save("mark.txt", zk_get(mark)[0]), "ledger_id": lid, "replicas": [lost.bookie_id]}
    finally:
        cluster.close()
        zk.close()
        shutil.rmtree(work, ignore_errors=True)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--version", required=True, help="a BookKeeper release `make peers` fetched")
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args()
    capture(args.version, args.out)
    print(f"golden bytes of BookKeeper {args.version} in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
