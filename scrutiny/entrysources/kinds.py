"""The kinds of entry source an agent serves from, by the name `agent.source` gives: what each needs of the agent's
settings, and how it opens. A new kind is one entry here (and its room in this package); the command line's choices,
the settings' check and the agent's composition root follow."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrutiny.entrysources.bridge import BookieBridgeSource
from scrutiny.entrysources.dbledgerstorage import DbLedgerStorageSource
from scrutiny.entrysources.source import EntrySource
from scrutiny.entrysources.synthetic import SyntheticStore
from scrutiny.errors import ConfigError
from scrutiny.metadata import parse_host_port

if TYPE_CHECKING:
    from scrutiny.config import AgentSettings


@dataclass(frozen=True)
class SourceKind:
    check: Callable[[AgentSettings], object]  # ConfigError naming what the settings lack for it
    opens: Callable[[AgentSettings], EntrySource]


def _needs(what: str, flag: str) -> ConfigError:
    return ConfigError(f"this agent.source needs {what} ({flag})")


def _ledger_dirs(s: AgentSettings) -> None:
    if not s.ledger_dirs:
        raise _needs("at least one ledger directory", "--ledger-dir")


def _bookie_address(s: AgentSettings) -> tuple[str, int]:
    if not s.bookie_address:
        raise _needs("the stock bookie's address", "--bookie-address")
    return parse_host_port(s.bookie_address, "agent.bookie_address (--bookie-address)", ConfigError)


def _synthetic_file(s: AgentSettings) -> None:
    if not s.synthetic_file:
        raise _needs("a store file", "--synthetic-file")


SOURCES: dict[str, SourceKind] = {
    "dbledgerstorage": SourceKind(_ledger_dirs, lambda s: DbLedgerStorageSource(
        s.ledger_dirs, s.scratch_dir or None, s.index_cache_bytes, s.index_dirs)),
    "bridge": SourceKind(_bookie_address, lambda s: BookieBridgeSource(*_bookie_address(s))),
    "synthetic": SourceKind(_synthetic_file, lambda s: SyntheticStore(s.synthetic_file)),
}


def checked(s: AgentSettings) -> AgentSettings:
    """The settings, if their source is a kind there is and they say what it needs; ConfigError naming what not."""
    kind = SOURCES.get(s.source)
    if kind is None:
        raise ConfigError(f"agent.source: {s.source!r} is not one of {', '.join(SOURCES)}")
    kind.check(s)
    return s


def open_source(s: AgentSettings) -> EntrySource:
    return SOURCES[checked(s).source].opens(s)
