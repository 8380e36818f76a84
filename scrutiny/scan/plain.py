"""A range read and checked in columns where it is plain: pure.

Most of a range is plain ledgers (`scrutiny.metadata.columns`) whose every bookie holds exactly its share and
whose shape has no finding. Those are never made into objects: read from the znodes as columns, asked about by
column, held exactly by column, grouped by shape and counted in the blast radius by column. Everything else goes
the reference way (`select`, `classify`), one `LedgerMetadata` at a time: the other znodes from the start, and any
plain ledger once a check has something to say about it (not held exactly, not a full turn, a bookie unregistered,
a shape with a finding). A property test holds the two ways to the same result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scrutiny.checks import BookieAnswers, held_plain
from scrutiny.errors import DataError
from scrutiny.metadata import LedgerMetadata
from scrutiny.metadata.columns import PlainLedgers, Znode, plain_ledgers
from scrutiny.pulsar.ledgers import BookKeeperLedgers
from scrutiny.scan.classify import Selection, classify, select, wanted
from scrutiny.scan.context import Answers, Pass, RunContext
from scrutiny.scan.healthy import check_healthy_plain
from scrutiny.scan.result import BlastTally, RangeResult
from scrutiny.store import LedgerRead


def in_columns(ctx: RunContext, mode: Pass) -> bool:
    """May a range of this run be checked in columns? Not where the reference path looks at every ledger: a deep
    run or scrub, a what-if; nor a re-check."""
    return mode is Pass.FIRST and not (ctx.settings.deep or ctx.scrub or ctx.without)


def _result(selection: Selection) -> RangeResult:
    return RangeResult(selection.counts, selection.violations, deleted=selection.deleted,
                       marked_in_scope=selection.marked_in_scope)


@dataclass(frozen=True)
class PlainRange:
    """A range's znodes: its plain ledgers in columns, the others selected the reference way."""

    znodes: Sequence[Znode]
    plain: PlainLedgers  # those in the run's scope
    every: PlainLedgers  # whatever the scope (Pulsar's record is held against every ledger)
    reads: Sequence[LedgerRead]  # of the other znodes
    others: Selection

    @classmethod
    def of(cls, ctx: RunContext, znodes: Sequence[Znode]) -> PlainRange:
        marked = ctx.marked  # (a lost rack marks millions: looked up, not listed)
        plain = plain_ledgers(znodes, np.array(sorted(z.ledger_id for z in znodes if z.ledger_id in marked),
                                               dtype=np.int64))
        others = np.ones(len(znodes), dtype=bool)
        others[plain.rows] = False
        reads = [LedgerRead.of(*znodes[i]) for i in np.flatnonzero(others).tolist()]
        scoped = plain
        if ctx.only_bookies:  # a run of some bookies' ledgers: the others are outside it
            among = np.array([b in ctx.only_bookies for b in plain.bookies] + [False])  # (the padding's -1: the last)
            scoped = plain.take(among[plain.members].any(axis=1))
        return cls(znodes, scoped, plain, reads, select(ctx, reads))

    def brief(self) -> BookKeeperLedgers:
        """Every ledger of the range in brief, to hold Pulsar's record against (`BookKeeperLedgers.of` its reads)."""
        p = self.every
        return BookKeeperLedgers.merge([BookKeeperLedgers.of(self.reads), BookKeeperLedgers.of_closed(
            p.ledger_ids, p.last_entry_id, p.ctime, p.owner, p.customs)])

    def wanted(self) -> dict[str, list[int]]:
        """The ledgers each bookie is asked about."""
        out = wanted(self.others.candidates)
        for b, ids in self.plain.wanted().items():
            out[b] = out.get(b, []) + ids
        return out

    def classify(self, ctx: RunContext, mode: Pass, answers: Answers) -> RangeResult:
        """Every ledger's checks, from the bookies' answers: as `select` and `classify` find them."""
        plain = self.plain
        columns = {b: a.columns() for b, a in answers.items() if isinstance(a, BookieAnswers)}
        held = held_plain(plain, columns) if columns and len(plain) else np.zeros(len(plain), dtype=bool)
        tally = BlastTally()
        left = check_healthy_plain(ctx, mode, plain, held, self._metadata, tally)
        grouped = len(plain) - left.size
        back = select(ctx, [LedgerRead.of(*self.znodes[i]) for i in plain.rows[left].tolist()])
        return RangeResult.merge([
            _result(self.others), _result(back),
            RangeResult(counts={"seen": grouped, "checked": grouped}, blast=tally.blast()),
            classify(ctx, mode, self._in_order(self.others.candidates, back.candidates), answers, None,
                     self.others.marked + back.marked),
        ])

    def _metadata(self, row: int) -> LedgerMetadata:
        """A plain row's metadata, decoded the reference way (a plain ledger's always is)."""
        read = LedgerRead.of(*self.znodes[int(self.plain.rows[row])])
        if read.metadata is None:  # never: the columns' rules are the reference's
            raise DataError(f"ledger {read.ledger_id}: plain in columns, yet not decoded: {read.error}")
        return read.metadata

    def _in_order(self, *parts: Sequence[LedgerMetadata]) -> list[LedgerMetadata]:
        """The candidates of both selections in the order of their znodes, as one selection would have them."""
        every = [md for part in parts for md in part]
        if sum(bool(part) for part in parts) < 2:
            return every
        at = {z.ledger_id: i for i, z in enumerate(self.znodes)}
        return sorted(every, key=lambda md: at[md.ledger_id])
