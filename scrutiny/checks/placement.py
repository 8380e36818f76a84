"""Placement: does every write set of every segment ensemble follow the placement policy (rack-, zone- or
region-aware), and is the durability policy (WQ, AQ) one that survives a bookie's loss?"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scrutiny.categories import Category
from scrutiny.checks.violation import MAX_DETAIL_RANGES, Violation
from scrutiny.metadata import (
    DEFAULT_RACK,
    DEFAULT_REGION_LOCATION,
    DEFAULT_ZONE_LOCATION,
    LedgerMetadata,
)


class PlacementResult(enum.IntEnum):
    FAIL = 0
    MEETS_SOFT = 1
    MEETS_STRICT = 2


@dataclass(frozen=True)
class PlacementPolicy:
    kind: str = "rackaware"  # rackaware | zoneaware | regionaware | none
    min_racks_per_write_quorum: int = 2
    enforce_min_racks: bool = False
    min_zones_per_write_quorum: int = 2
    desired_zones_per_write_quorum: int = 3
    min_regions_for_durability: int = 2

    KINDS = ("rackaware", "zoneaware", "regionaware", "none")


def write_sets(ensemble: Sequence[str], wq: int) -> list[tuple[str, ...]]:
    """The write set starting at every ensemble position (wrapping)."""
    e = len(ensemble)
    return [tuple(ensemble[(i + j) % e] for j in range(wq)) for i in range(e)]


def _rackaware(policy: PlacementPolicy, ensemble: Sequence[str], wq: int,
               locations: Mapping[str, str]) -> tuple[PlacementResult, str]:
    need = min(wq, policy.min_racks_per_write_quorum)
    where = []
    for b in ensemble:  # a plain loop: every segment of every ledger comes through here
        where.append(locations.get(b, DEFAULT_RACK))
    e = len(where)
    if len(set(where)) == e and not (policy.enforce_min_racks and DEFAULT_RACK in where):
        return PlacementResult.MEETS_STRICT, ""  # every write set spans WQ racks
    for i in range(e):
        racks = {where[(i + j) % e] for j in range(wq)}
        if len(racks) < need:
            return PlacementResult.FAIL, f"write set at position {i} spans {len(racks)} rack(s) {sorted(racks)}, " \
                                         f"needs {need}"
        if policy.enforce_min_racks and DEFAULT_RACK in racks:
            return PlacementResult.FAIL, f"write set at position {i} has a bookie on the default rack"
    return PlacementResult.MEETS_STRICT, ""


def _zoneaware(policy: PlacementPolicy, ensemble: Sequence[str], wq: int,
               locate: Callable[[str], str]) -> tuple[PlacementResult, str]:
    e = len(ensemble)
    if e % wq != 0:
        return PlacementResult.FAIL, f"ensemble size {e} is not a multiple of write quorum {wq}"
    if wq <= policy.min_zones_per_write_quorum:
        return PlacementResult.FAIL, f"write quorum {wq} is not above minNumZonesPerWriteQuorum " \
                                     f"{policy.min_zones_per_write_quorum}"
    where: dict[str, tuple[str, str]] = {}
    for b in ensemble:
        loc = locate(b)
        parts = loc.strip("/").split("/")
        if loc == DEFAULT_ZONE_LOCATION or len(parts) != 2 or not all(parts):
            return PlacementResult.FAIL, f"bookie {b} has no known /zone/upgradeDomain location ({loc})"
        where[b] = (parts[0], parts[1])
    result, reason = PlacementResult.MEETS_STRICT, ""
    desired = min(wq, policy.desired_zones_per_write_quorum)
    for i, ws in enumerate(write_sets(ensemble, wq)):
        zones: dict[str, set[str]] = {}
        count: dict[str, int] = {}
        for b in ws:
            z, ud = where[b]
            zones.setdefault(z, set()).add(ud)
            count[z] = count.get(z, 0) + 1
        if len(zones) < policy.min_zones_per_write_quorum:
            return PlacementResult.FAIL, f"write set at position {i} spans {len(zones)} zone(s), needs " \
                                         f"{policy.min_zones_per_write_quorum}"
        for z, uds in zones.items():
            if count[z] > 1 and len(uds) < 2:
                return PlacementResult.FAIL, f"write set at position {i} has {count[z]} bookies in zone {z} " \
                                             f"on one upgrade domain"
        if len(zones) < desired and result is PlacementResult.MEETS_STRICT:
            result, reason = PlacementResult.MEETS_SOFT, f"write set at position {i} spans {len(zones)} zone(s), " \
                                                         f"desired {desired}"
    return result, reason


def _regionaware(policy: PlacementPolicy, ensemble: Sequence[str], wq: int,
                 locate: Callable[[str], str]) -> tuple[PlacementResult, str]:
    need = min(wq, policy.min_regions_for_durability)
    result, reason = PlacementResult.MEETS_STRICT, ""
    for i, ws in enumerate(write_sets(ensemble, wq)):
        locs = [locate(b) for b in ws]
        regions = {loc.strip("/").split("/")[0] for loc in locs}
        if len(regions) < need:
            return PlacementResult.FAIL, f"write set at position {i} spans {len(regions)} region(s), needs {need}"
        if len(set(locs)) < len(locs) and result is PlacementResult.MEETS_STRICT:
            result, reason = PlacementResult.MEETS_SOFT, f"write set at position {i} has two bookies on one rack"
    return result, reason


def check_ensemble(policy: PlacementPolicy, ensemble: Sequence[str], wq: int,
                   locations: Mapping[str, str]) -> tuple[PlacementResult, str]:
    """One segment's ensemble against the policy: (result, why when not strict)."""
    if policy.kind == "none":
        return PlacementResult.MEETS_STRICT, ""
    if not ensemble:
        return PlacementResult.FAIL, "empty ensemble"
    if policy.kind == "rackaware":
        # Every ensemble member counts, writable or not (upstream's false FAIL); unmapped: default rack.
        return _rackaware(policy, ensemble, wq, locations)
    if policy.kind == "zoneaware":
        return _zoneaware(policy, ensemble, wq, lambda b: locations.get(b, DEFAULT_ZONE_LOCATION))
    if policy.kind == "regionaware":
        return _regionaware(policy, ensemble, wq, lambda b: locations.get(b, DEFAULT_REGION_LOCATION))
    raise ValueError(f"unknown placement policy {policy.kind!r}")


def check_durability_policy(md: LedgerMetadata, min_write_quorum: int, min_ack_quorum: int) -> Violation | None:
    """A ledger whose policy cannot survive the loss of one bookie, by design: a write quorum of one (that
    copy is the only one), or an ack quorum below the operator's minimum (an entry acknowledged on fewer
    copies). Kafka's replication factor and min.insync.replicas, in BookKeeper's words."""
    reasons = []
    if md.write_quorum < min_write_quorum:
        reasons.append(f"write quorum {md.write_quorum} < min_write_quorum {min_write_quorum}: "
                       + ("every entry has one copy" if md.write_quorum == 1 else "fewer copies than required"))
    if md.ack_quorum < min_ack_quorum:
        reasons.append(f"ack quorum {md.ack_quorum} < min_ack_quorum {min_ack_quorum}: an entry is acknowledged "
                       f"with {md.ack_quorum} cop{'y' if md.ack_quorum == 1 else 'ies'}")
    if not reasons:
        return None
    return Violation(Category.WEAK_DURABILITY_POLICY, md.ledger_id, (), {
        "ensemble_size": md.ensemble_size, "write_quorum": md.write_quorum, "ack_quorum": md.ack_quorum,
        "min_write_quorum": min_write_quorum, "min_ack_quorum": min_ack_quorum, "reasons": reasons},
        md.znode_version)


def check_placement(md: LedgerMetadata, policy: PlacementPolicy, locations: Mapping[str, str]) -> Violation | None:
    """Every segment of the ledger; a ledger with any FAIL is not adhering, else any MEETS_SOFT is soft."""
    worst = PlacementResult.MEETS_STRICT
    findings: list[dict[str, Any]] = []
    for seg in md.segments:
        result, reason = check_ensemble(policy, seg.ensemble, md.write_quorum, locations)
        if result is not PlacementResult.MEETS_STRICT:
            findings.append({"first_entry_id": seg.first_entry_id, "ensemble": list(seg.ensemble),
                             "result": result.name, "reason": reason})
            worst = min(worst, result)
    if worst is PlacementResult.MEETS_STRICT:
        return None
    category = (Category.PLACEMENT_POLICY_NOT_ADHERING if worst is PlacementResult.FAIL
                else Category.PLACEMENT_POLICY_SOFTLY_ADHERING)
    bookies = sorted({b for f in findings if f["result"] == worst.name for b in f["ensemble"]})
    return Violation(category, md.ledger_id, tuple(bookies),
                     {"policy": policy.kind, "segments": findings[:MAX_DETAIL_RANGES]}, md.znode_version)

