"""Bookies as the metadata knows them: their registrations (BookieServiceInfoFormat), their racks (Pulsar's
`/bookies` JSON), and the agents' own registrations."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from scrutiny.bookkeeper import bookie_service_info_pb2
from scrutiny.errors import MetadataError
from scrutiny.metadata.uri import parse_host_port

DEFAULT_RACK = "/default-rack"
DEFAULT_ZONE_LOCATION = "/default-zone/default-upgradedomain"
DEFAULT_REGION_LOCATION = "/default-region/default-rack"


@dataclass(frozen=True, slots=True)
class Endpoint:
    id: str
    host: str
    port: int
    protocol: str


@dataclass(frozen=True, slots=True)
class BookieRegistration:
    bookie_id: str
    readonly: bool
    endpoints: tuple[Endpoint, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict)


def decode_bookie_service_info(bookie_id: str, readonly: bool, data: bytes) -> BookieRegistration:
    """An empty payload is a legacy bookie: registered, no endpoint list."""
    if not data:
        return BookieRegistration(bookie_id, readonly)
    msg = bookie_service_info_pb2.BookieServiceInfoFormat()
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        raise MetadataError(f"registration of bookie {bookie_id}: undecodable BookieServiceInfo: {exc}") from None
    eps = tuple(Endpoint(e.id, e.host, e.port, e.protocol) for e in msg.endpoints)
    return BookieRegistration(bookie_id, readonly, eps, dict(msg.properties))


def encode_bookie_service_info(reg: BookieRegistration) -> bytes:
    msg = bookie_service_info_pb2.BookieServiceInfoFormat()
    for e in reg.endpoints:
        msg.endpoints.add(id=e.id, host=e.host, port=e.port, protocol=e.protocol)
    msg.properties.update(reg.properties)
    return msg.SerializeToString()


def normalize_rack(rack: str) -> str:
    rack = rack.strip()
    if rack in ("", "/"):
        return DEFAULT_RACK
    return rack if rack.startswith("/") else "/" + rack


def decode_racks(data: bytes, where: str = "/bookies") -> tuple[dict[str, str], list[str]]:
    """Pulsar's rack-awareness JSON: {group: {bookie: {"rack": ..., "hostname": ...}}}.
    Returns the racks and a list of problems with single entries (those entries are left out)."""
    if not data:
        return {}, []
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MetadataError(f"rack znode {where}: not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise MetadataError(f"rack znode {where}: expected an object of groups, got {type(doc).__name__}")
    racks: dict[str, str] = {}
    problems = []
    for group, members in doc.items():
        if not isinstance(members, dict):
            problems.append(f"rack znode {where}: group {group!r} is not an object")
            continue
        for bookie, info in members.items():
            rack = info.get("rack") if isinstance(info, dict) else None
            if not isinstance(rack, str):
                problems.append(f"rack znode {where}: bookie {bookie!r} of group {group!r} has no rack string")
                continue
            racks[bookie] = normalize_rack(rack)
    return racks, problems


def encode_racks(racks: Mapping[str, str], group: str = "default") -> bytes:
    return json.dumps(
        {group: {b: {"rack": r, "hostname": b.rsplit(":", 1)[0]} for b, r in sorted(racks.items())}}
    ).encode()


def encode_agent_registration(bookie_id: str, address: str) -> bytes:
    return json.dumps({"bookie_id": bookie_id, "address": address}).encode()


def decode_agent_registration(where: str, data: bytes) -> tuple[str, str]:
    """(bookie id, agent address) of one registration."""
    try:
        doc = json.loads(data)
        bookie_id, address = str(doc["bookie_id"]), str(doc["address"])
    except (ValueError, KeyError, TypeError) as exc:
        raise MetadataError(f"agent registration {where}: not {{bookie_id, address}} JSON: {exc}") from None
    parse_host_port(address, f"agent registration {where}")
    return bookie_id, address

