"""The checks of a scrutiny run, as pure functions over plain data (no I/O), one family a module:

- `violation`: a finding; `answers`: what a bookie said about a ledger;
- `placement`: the placement policy and the durability policy of each ensemble;
- `shares` and `coverage`: which entries each bookie should hold (round robin, as residues), and whether
  every entry of a closed ledger has its copies;
- `pastclose`: entries past a ledger's close;
- `whatif`: coverage without some bookies (what-if, the blast radius);
- `deep`: corrupt and divergent copies (the deep scrub);
- `messages`: Pulsar's checksum on a topic's messages (the deep scrub of a topic's ledgers);
- `marks`: the age of the under-replication marks.
"""

from __future__ import annotations

from scrutiny.checks.answers import NO_LEDGER, BookieAnswer, BookieAnswers, Outcome, listed
from scrutiny.checks.coverage import (
    CoverageResult,
    check_coverage,
    healthy_coverage,
    held_exactly_their_shares,
    held_plain,
)
from scrutiny.checks.deep import DeepAnswer, check_deep, in_deep_slice, served_corrupt, without_corrupt
from scrutiny.checks.marks import check_underreplication_age
from scrutiny.checks.messages import check_checksums, deep_slice_key, holds_messages
from scrutiny.checks.pastclose import check_past_the_close
from scrutiny.checks.placement import (
           PlacementPolicy,
           PlacementResult,
           check_durability_policy,
           check_ensemble,
           check_placement,
)
from scrutiny.checks.shares import expected_share
from scrutiny.checks.violation import Violation
from scrutiny.checks.whatif import WOULD_HAVE, blast_radius, blast_radius_marked, coverage_without

__all__ = ["NO_LEDGER", "WOULD_HAVE", "BookieAnswer", "BookieAnswers", "CoverageResult", "DeepAnswer", "Outcome",
           "PlacementPolicy", "PlacementResult", "Violation", "blast_radius", "blast_radius_marked",
           "check_checksums", "check_coverage", "check_deep", "check_durability_policy", "check_ensemble",
           "check_past_the_close", "check_placement", "check_underreplication_age", "coverage_without",
           "deep_slice_key", "expected_share", "healthy_coverage", "held_exactly_their_shares", "held_plain",
           "holds_messages", "in_deep_slice", "listed", "served_corrupt", "without_corrupt"]
