"""The coverage check costs the same for a healthy ledger of 1,000 entries and one of 10,000,000
(group arithmetic), against an entry-by-entry count as the baseline, in one run.

    python -m bench.checks
"""

from __future__ import annotations

from functools import partial

from bench.common import median_seconds, table
from scrutiny.checks import BookieAnswer, Outcome, check_coverage, expected_share
from scrutiny.codec import decode, encode_groups
from scrutiny.metadata import LedgerMetadata, LedgerState, Segment

ENSEMBLE = ("b1:3181", "b2:3181", "b3:3181", "b4:3181", "b5:3181")


def healthy(entries: int, e: int, wq: int) -> tuple[LedgerMetadata, dict[str, BookieAnswer]]:
    md = LedgerMetadata(1, LedgerState.CLOSED, e, wq, wq, entries - 1, 0, (Segment(0, ENSEMBLE[:e]),))
    # As the agent sends it: the merged encoding, decoded by the client.
    answers = {b: BookieAnswer(Outcome.ENTRIES, decode(encode_groups(expected_share(md, b)))) for b in md.bookies}
    return md, answers


def entry_by_entry(md: LedgerMetadata, answers: dict[str, BookieAnswer]) -> int:
    """The baseline: count the copies of every entry, as upstream does."""
    least = md.write_quorum
    e = md.ensemble_size
    ens = md.segments[0].ensemble
    held = {b: a.availability for b, a in answers.items() if a.availability is not None}
    for x in range(md.last_entry_id + 1):
        copies = [x in held[ens[(x + w) % e]] for w in range(md.write_quorum)]
        least = min(least, copies.count(True))
    return least


def run(sizes: list[int], baseline_max: int = 100_000) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for e, wq in ((3, 2), (5, 2)):
        base = 0.0
        for n in sizes:
            md, answers = healthy(n, e, wq)
            assert check_coverage(md, answers).violation is None
            t = median_seconds(partial(check_coverage, md, answers), 7)
            base = base or t
            row: dict[str, object] = {"E/WQ": f"{e}/{wq}", "entries": n, "check s": t, "x 1,000 entries": t / base}
            if n <= baseline_max:
                row["entry-by-entry s"] = median_seconds(partial(entry_by_entry, md, answers), 1)
            rows.append(row)
    return rows


def main() -> None:
    print(table(run([1_000, 100_000, 10_000_000])))


if __name__ == "__main__":
    main()
