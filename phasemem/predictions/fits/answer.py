"""The answer of ``fits``: per axis (batch, sequence) the largest factor that fits, where the next one
runs out, and the remedies that would let it fit."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .as_text import format_fits

#: Factors a user tries (the largest of them that fits is named, and the next one up is what the
#: remedies are asked to make fit).
FACTOR_GRID = (0.25, 0.5, 1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


@dataclass
class Fit:
    """The answer along one axis (batch or sequence)."""

    axis: str
    applies: bool
    largest_factor: float | None = None  # the allocator, replayed under the budget, does not run out
    largest_factor_fragmented: float | None = None  # the allocated peak with the fragmentation seen at the trace's peak
    largest_factor_allocated: float | None = None  # the allocated peak alone within the budget (the loose bound)
    largest_listed: float | None = None  # the largest of FACTOR_GRID up to largest_factor
    next_factor: float | None = None  # the next of FACTOR_GRID above it
    predicted_peak_bytes_next: int | None = None  # allocated, at next_factor, no remedy
    next_fits_with: list[str] | None = None  # remedies that make next_factor fit (None: none found)
    largest_factor_with: float | None = None  # the largest factor with those remedies
    fails_at: dict | None = None  # just above largest_factor: where the replayed allocator runs out
    fits_again: list[float] | None = None  # [from, up to]: larger factors that fit again past that gap
    confidence: str = "low"  # high, medium, low
    why: list[str] = field(default_factory=list)


@dataclass
class Fits:
    """``report.fits(budget)``: the largest batch and sequence predicted to fit in ``budget_bytes``."""

    budget_bytes: int
    peak_bytes: int
    reserve_ratio: float  # reserved over allocated at the trace's peak
    fragmentation_ratio: float  # (allocated + free bytes inside segments that hold live blocks) / allocated
    batch: Fit
    sequence: Fit
    allocator: str = ""  # how the allocator replay reproduced the trace at factor 1, or why it is not replayed

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return format_fits(self)
