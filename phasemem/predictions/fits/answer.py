"""The answer of ``fits``: per axis (batch, sequence) the largest factor that fits, where the next one
runs out, and the remedies that would let it fit."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ...units import format_bytes

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
    peak_bytes: int  # allocated, at the trace's batch: the trace's peak, or with ``changes`` (a plan) the changed one
    reserve_ratio: float  # reserved over allocated at the trace's peak
    fragmentation_ratio: float  # (allocated + free bytes inside segments that hold live blocks) / allocated
    batch: Fit
    sequence: Fit
    allocator: str = ""  # how the allocator replay reproduced the trace at factor 1, or why it is not replayed

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return format_fits(self)


def format_fits(fx: Fits) -> str:
    """``Fits`` as the text ``--fits`` prints."""
    lines = [f"what fits in {format_bytes(fx.budget_bytes)} (peak now {format_bytes(fx.peak_bytes)}, "
             f"reserve {fx.reserve_ratio:.2f}x):"]
    for fit in (fx.batch, fx.sequence):
        if not fit.applies:
            lines.append(f"  {fit.axis}: cannot tell: {fit.why[0]}")
            continue
        lines.append(f"  {fit.axis}: up to x{fit.largest_factor:g} predicted to fit "
                     f"(x{fit.largest_factor_allocated:g} by the allocated peak alone); confidence {fit.confidence}")
        if fit.fails_at:
            fa = fit.fails_at
            lines.append(f"      at x{fa['factor']:g} the allocator runs out in {fa['phase']} (event {fa['event']}), "
                         f"asking for a segment of {format_bytes(fa['request_bytes'])}")
        if fit.fits_again:
            lines.append(f"      larger sizes fit again from x{fit.fits_again[0]:g} up to x{fit.fits_again[1]:g}: the "
                         f"cached blocks split better there (not every size between is replayed)")
        if fit.next_factor is not None:
            assert fit.predicted_peak_bytes_next is not None  # replayed with the next factor
            need = (f"fits with {' + '.join(fit.next_fits_with)} (up to x{fit.largest_factor_with:g})"
                    if fit.next_fits_with else "no remedy phasemem knows makes it fit")
            lines.append(f"      x{fit.next_factor:g} would peak at {format_bytes(fit.predicted_peak_bytes_next)}: {need}")
        lines.extend(f"      - {w}" for w in fit.why)
    return "\n".join(lines)
