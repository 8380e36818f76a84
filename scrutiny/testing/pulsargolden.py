"""Golden bytes from a real Pulsar broker: its records (a managed ledger's in every codec, cursors live and closed, a
schema's locator) and entries as its bookies store them (a message, a batch in each codec, chunks), captured so
that the fast tests (`tests/pure/test_pulsargolden.py`) hold scrutiny's decoders to Pulsar's own bytes. Made again
with

    python -m scrutiny.testing.pulsargolden --version 4.0.7 --bookkeeper 4.17.3 --out tests/golden/pulsar-4.0.7

(`make peers` first). Each capture is a file of the output directory; `manifest.json` says what each holds."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pulsar
from pulsar.schema import JsonSchema

from scrutiny import entrylog
from scrutiny.entrysources import DbLedgerStorageSource
from scrutiny.testing.localzk import LocalZooKeeper
from scrutiny.testing.metadatahome import OnZooKeeper
from scrutiny.testing.realbookkeeper import RealBookKeeper, Release
from scrutiny.testing.realpulsar import CODECS, Order, RealPulsar, records_in


def capture(version: str, bookkeeper: str, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="scrutiny-pulsar-golden-"))
    zk = LocalZooKeeper(workdir=work / "zk")
    zk.start()
    cluster = RealBookKeeper(Release.of(bookkeeper), OnZooKeeper(zk.hosts, "/golden/ledgers"), work / "bk")
    manifest: dict[str, Any] = {"pulsar": version, "bookkeeper": bookkeeper, "made_by": f"python -m "
                                f"scrutiny.testing.pulsargolden --version {version} --bookkeeper {bookkeeper} "
                                f"--out {out}", "managed_ledgers": {}, "entries": {}}

    def save(name: str, data: bytes) -> str:
        (out / name).write_bytes(data)
        return name

    try:
        bookies = [cluster.add_bookie() for _ in range(2)]
        broker = RealPulsar(Release.of(version, project="pulsar"), cluster, maxMessageSize=16384,
                            **records_in("NONE"))
        ns = broker.namespace("golden", deduplication=True)
        ml = f"{broker.chroot}/managed-ledgers/public/golden/persistent"
        entries: dict[str, tuple[str, int]] = {}  # capture -> topic, entry index in the topic
        for n, (codec, compression) in enumerate(CODECS.items()):
            if n:
                broker.stop()
                broker.start(**records_in(codec))
            topic = f"persistent://{ns}/batch-{codec.lower()}"
            client = broker.client()
            producer = client.create_producer(topic, producer_name=f"p-{codec}", batching_enabled=True,
                                              batching_max_messages=3, batching_max_publish_delay_ms=50,
                                              compression_type=compression)
            for i in range(1, 19):  # 6 batches of 3: two ledgers of 5 entries and the head
                producer.send_async(f"message {i} ".encode() * 8, None, sequence_id=i)
            producer.flush()
            client.close()
            stats = broker.stats_internal(topic)
            manifest["managed_ledgers"][codec] = {
                "file": save(f"managed-ledger-{codec}.bin", cluster.tree.get(f"{ml}/batch-{codec.lower()}")[0]),
                "topic": topic, "ledgers": [[li["ledgerId"], li["entries"]] for li in stats["ledgers"]]}
            entries[f"batch-{codec}"] = (topic, 0)
        client = broker.client()
        plain = f"persistent://{ns}/plain"
        producer = client.create_producer(plain, producer_name="plain")
        for i in range(1, 8):
            producer.send(f"plain {i}".encode(), sequence_id=i)
        consumer = client.subscribe(plain, "sub", initial_position=pulsar.InitialPosition.Earliest)
        for _ in range(3):
            consumer.acknowledge(consumer.receive(30000))
        entries["message"] = (plain, 0)
        chunked = f"persistent://{ns}/chunked"
        chunker = client.create_producer(chunked, producer_name="chunker", chunking_enabled=True)
        chunker.send(bytes(range(256)) * 150, sequence_id=1)  # 38,400 bytes: 3 chunks under maxMessageSize
        entries["chunk-first"], entries["chunk-last"] = (chunked, 0), (chunked, 2)
        typed = f"persistent://{ns}/orders"
        client.create_producer(typed, producer_name="typed", schema=JsonSchema(Order)).send(Order(item="one"))
        stats = broker.stats_internal(plain)
        manifest["cursor_live"] = {"file": save("cursor-live.bin", cluster.tree.get(f"{ml}/plain/sub")[0]),
                                   "cursor": "sub", "ledger_id": stats["cursors"]["sub"]["cursorLedger"]}
        dedup_stats = stats["cursors"]["pulsar.dedup"]
        manifest["dedup_live"] = {"cursor_ledger": dedup_stats["cursorLedger"],
                                  "last_entry": dedup_stats["cursorLedgerLastEntry"],
                                  "mark_delete": dedup_stats["markDeletePosition"],
                                  "properties": dedup_stats["properties"]}
        schema_path = f"{broker.chroot}/schemas/public/golden/orders"
        manifest["schema"] = {"file": save("schema-locator.bin", cluster.tree.get(schema_path)[0]),
                              "schema_id": "public/golden/orders",
                              "ledger_id": broker.stats_internal(typed)["schemaLedgers"][0]["ledgerId"]}
        client.close()
        time.sleep(2)  # flushed: the bookies' indexes and entry logs hold every entry

        # the entries as a bookie stores them (the first ledger of each topic, and the live deduplication
        # cursor's position), read from each bookie's disk
        sources = [DbLedgerStorageSource([b.ledger_dir], work / f"scratch-{b.name}") for b in bookies]
        try:
            for name, (topic, index) in entries.items():
                lid = broker.stats_internal(topic)["ledgers"][0]["ledgerId"]
                stored = next(data for s in sources if (data := _stored(s, lid, index)) is not None)
                manifest["entries"][name] = {"file": save(f"entry-{name}.bin", stored), "ledger_id": lid,
                                             "entry_id": index, "topic": topic}
            lid, index = dedup_stats["cursorLedger"], dedup_stats["cursorLedgerLastEntry"]
            stored = next(data for s in sources if (data := _stored(s, lid, index)) is not None)
            manifest["entries"]["position"] = {"file": save("entry-position.bin", stored), "ledger_id": lid,
                                               "entry_id": index, "topic": plain}
        finally:
            for s in sources:
                s.close()
        broker.unload(plain)  # the cursors closed: their positions inline in their records
        manifest["cursor_closed"] = {"file": save("cursor-closed.bin",
                                                  cluster.tree.get(f"{ml}/plain/pulsar.dedup")[0]),
                                     "cursor": "pulsar.dedup"}
        broker.close()
    finally:
        cluster.close()
        zk.close()
        shutil.rmtree(work, ignore_errors=True)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def _stored(source: DbLedgerStorageSource, ledger_id: int, entry_id: int) -> bytes | None:
    """The entry as the bookie stores it (after its size field), when this bookie holds it."""
    for _, eid, location in source.locations_of(ledger_id) or []:
        if eid == entry_id:
            log_id, pos = entrylog.split_location(location)
            data = entrylog.log_path(source.ledger_dirs[0], log_id).read_bytes()
            (size,) = entrylog.ENTRY_SIZE.unpack_from(data, pos - entrylog.ENTRY_SIZE.size)
            return data[pos:pos + size]
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--version", required=True, help="a Pulsar release `make peers` fetched")
    p.add_argument("--bookkeeper", required=True, help="the BookKeeper release its bookies run")
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args()
    capture(args.version, args.bookkeeper, args.out)
    print(f"golden bytes of Pulsar {args.version} in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
