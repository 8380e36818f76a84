"""Where the auditor's deep scrub stands. Reading every stored byte is expensive, so a deep pass over
all ledgers is spread over `slices` runs (one slice per run, e.g. hourly runs for a weekly pass); the
cursor lives in the metadata store, so the next leader resumes the pass where the last one stopped.
The debt an operator watches (Ceph's PG_NOT_DEEP_SCRUBBED) is the age of the oldest verification."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from scrutiny.errors import DataError
from scrutiny.runstats import DeepPassPosition


@dataclass(frozen=True)
class DeepPass:
    slices: int
    next_slice: int = 0
    verified_ms: tuple[int, ...] = ()  # per slice: when its last complete deep run started (0: never)
    created_ms: int = 0  # when this cursor began: the debt of slices never verified counts from here
    passes_completed: int = 0

    @staticmethod
    def fresh(slices: int, now_ms: int) -> DeepPass:
        return DeepPass(slices, 0, (0,) * slices, now_ms)

    def resized(self, slices: int) -> DeepPass:
        """A new slice count (the pass length or run interval changed): slices are other ledgers now,
        so a new pass, its debt counted from the oldest verification the old one knew."""
        if slices == self.slices:
            return self
        return DeepPass(slices, 0, (0,) * slices, self.oldest_verified_ms, self.passes_completed)

    def after_run(self, slice_: int, started_ms: int) -> DeepPass:
        """A complete deep run of `slice_` that started at `started_ms`."""
        verified = list(self.verified_ms)
        verified[slice_] = started_ms
        wrapped = slice_ == self.slices - 1
        return replace(self, next_slice=(slice_ + 1) % self.slices, verified_ms=tuple(verified),
                       passes_completed=self.passes_completed + wrapped)

    @property
    def progress(self) -> float:
        """The share of the current pass done."""
        return self.next_slice / self.slices

    @property
    def oldest_verified_ms(self) -> int:
        return min((v or self.created_ms for v in self.verified_ms), default=self.created_ms)

    def stats(self) -> dict[str, int]:
        """For the report and the metrics."""
        return DeepPassPosition(deep_pass_slices=self.slices, deep_pass_next_slice=self.next_slice,
                                deep_pass_progress_permille=int(self.progress * 1000),
                                deep_passes_completed=self.passes_completed,
                                deep_oldest_verified_ms=self.oldest_verified_ms).items()

    def to_bytes(self) -> bytes:
        return json.dumps({"slices": self.slices, "next_slice": self.next_slice, "verified_ms": self.verified_ms,
                           "created_ms": self.created_ms, "passes_completed": self.passes_completed}).encode()

    @staticmethod
    def parse(data: bytes, where: str = "the deep-pass cursor") -> DeepPass:
        try:
            doc = json.loads(data)
            cursor = DeepPass(int(doc["slices"]), int(doc["next_slice"]), tuple(int(v) for v in doc["verified_ms"]),
                              int(doc["created_ms"]), int(doc.get("passes_completed", 0)))
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{where}: unreadable ({type(exc).__name__}: {exc})") from None
        if cursor.slices < 1 or not 0 <= cursor.next_slice < cursor.slices or len(cursor.verified_ms) != cursor.slices:
            raise DataError(f"{where}: inconsistent (slices {cursor.slices}, next {cursor.next_slice}, "
                            f"{len(cursor.verified_ms)} verification times)")
        return cursor


def slices_for(pass_seconds: float, interval_seconds: float) -> int:
    """How many deep runs (one every `interval_seconds`) make one pass of `pass_seconds`."""
    return max(1, round(pass_seconds / interval_seconds)) if interval_seconds > 0 else 1
