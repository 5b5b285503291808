"""``Fits`` as the text ``--fits`` prints."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...units import format_bytes

if TYPE_CHECKING:
    from .answer import Fits


def format_fits(fx: Fits) -> str:
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
