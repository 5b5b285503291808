"""One axis's answer: the largest factor that fits (replayed under the cap, else read against the
trace's reserve), where the next one runs out, the remedies that would let it fit, and how sure it is."""
from __future__ import annotations

from itertools import combinations

import numpy as np

from ...vocab import PHASES
from ..allocator.over_events import Replay
from ..blocks import Change, Facts
from ..remedies import REMEDIES
from ..remedies.per_token import block_growth
from ..scaling import QUADRATIC
from .answer import FACTOR_GRID, Fit
from .bounds import LOOSE_RESERVE, RESERVE_MARGIN, _at, _blocks, _largest, _parts
from .capped import _Capped

#: Remedies tried together at most (2 of 6: 21 replays; more are tried only greedily).
MAX_COMBINATION = 2
#: What the replay's predictions missed by at most, on the real runs of docs/what-if.md (50 remedy and
#: scale runs of fixtures/pairs and pairs2, `python3 docs/eval_whatif.py`: worst llama's chunked CE over
#: 8 chunks, -2.96 %, held out); the README says the same. The issues' target was 5 %.
CHECKED_ERROR = 0.03


def _applicable(f: Facts) -> dict[str, Change]:
    out = {}
    for name, remedy in REMEDIES.items():
        ch = remedy(f)
        if not isinstance(ch, str):
            out[name] = ch
    return out


def _solve(f: Facts, axis: str, budget: int, reserve: float, frag: float, remedies: dict[str, Change],
           base: list[Change], capped, blocks) -> Fit:
    def curve(changes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        c, lin, quad = _parts(f, base + changes)
        return (c, lin + quad, np.zeros_like(quad)) if axis == "batch" else (c, lin, quad)

    plain = curve([])
    loose = _largest(*plain, budget)
    fragmented = round(_largest(*plain, budget / frag), 3)
    fit = Fit(axis, True, largest_factor_fragmented=fragmented, largest_factor_allocated=round(loose, 3))
    if isinstance(capped, _Capped):
        best, above, failed = capped.largest(blocks, budget, axis, loose)
        if failed is not None:
            fit.fails_at = _failure(f, failed, above)
            again = capped.beyond(blocks, budget, axis, above, loose)
            if again is not None:
                fit.fits_again = [round(again[0], 3), round(again[1], 3)]

        def fits_with(changes, target):
            """(the target fits with these changes, the largest factor they allow); the largest is
            replayed for the chosen changes only (``_remedies_for``)."""
            bound = _largest(*curve(changes), budget)
            if bound < target:  # the allocated peak alone is over the budget
                return False, bound, bound
            b = _blocks(f, base + changes)
            if capped.run(*b, budget, target, axis).oom_event is not None:
                return False, bound, bound
            return True, bound, lambda: capped.largest(b, budget, axis, bound)[0]
    else:
        room = budget / (reserve * (1 + RESERVE_MARGIN))
        best = _largest(*plain, room)

        def fits_with(changes, target):
            x = _largest(*curve(changes), room)
            return x >= target, x, x
    fit.largest_factor = round(best, 3)
    listed = [x for x in FACTOR_GRID if x <= best]
    fit.largest_listed = listed[-1] if listed else None
    nxt = next((x for x in FACTOR_GRID if x > best), None)
    fit.next_factor = nxt
    if nxt is not None:
        fit.predicted_peak_bytes_next = _at(*plain, nxt)
        found = _remedies_for(fits_with, remedies, nxt)
        if found is not None:
            fit.next_fits_with, fit.largest_factor_with = found[0], round(found[1], 3)
    fit.confidence, fit.why = _confidence(f, axis, reserve, frag, best, fragmented, loose, capped)
    return fit


def _failure(f: Facts, r: Replay, factor: float) -> dict:
    """Where the replay just above the answer ran out of memory: the factor, the event, its phase and
    the segment the allocator asked for (what torch's error says it "tried to allocate")."""
    assert r.oom_event is not None  # the replay that ran out
    e = int(r.oom_event)
    phase = PHASES[int(f.an.labels[e])] if 0 <= e < f.n else "unknown"
    return {"factor": round(factor, 4), "event": e, "phase": phase, "request_bytes": int(r.oom_size)}


def _remedies_for(fits_with, remedies: dict[str, Change], target: float):
    """The fewest remedies (then the most room) under which ``target`` fits: (names, largest factor).
    ``fits_with(changes, target)``: (whether target fits, a bound to rank by, the largest factor: a
    number, or a function that replays it, called for the chosen remedies only). Up to MAX_COMBINATION
    remedies together, then all of them."""
    names = list(remedies)
    combos = [list(c) for k in range(1, min(MAX_COMBINATION, len(names)) + 1) for c in combinations(names, k)]
    if len(names) > MAX_COMBINATION:
        combos.append(names)
    for k in sorted({len(c) for c in combos}):
        ok = [(c, *rest) for c in combos if len(c) == k
              for good, *rest in [fits_with([remedies[n] for n in c], target)] if good]
        if ok:
            chosen, _, largest = max(ok, key=lambda t: t[1])
            return chosen, largest() if callable(largest) else largest
    return None


def _confidence(f: Facts, axis: str, reserve: float, frag: float, best: float, mid: float,
                loose: float, capped) -> tuple[str, list[str]]:
    level = 2
    if isinstance(capped, _Capped):
        why = [f"the trace's allocations and frees, each block at its size for the factor, replayed through "
               f"PyTorch's caching allocator (torch 2.11's rules) with the budget as the cap on the bytes it has "
               f"reserved (torch.cuda.set_per_process_memory_fraction): up to factor {best:.3f} it does not run out "
               f"of memory; the allocated peak alone would allow {loose:.3f}",
               capped.checked,
               "the budget is what the allocator may reserve: the CUDA context, other processes and memory "
               "allocated outside PyTorch are not in it"]
        if not capped.exact:
            level -= 1
    else:
        why = [f"the allocator is not replayed ({capped}); the trace reserved {reserve:.2f}x what it allocated at "
               f"its peak; the budget is checked against the predicted peak x {reserve:.2f}, {RESERVE_MARGIN:.0%} "
               f"more for the reserve at another size: the real limit lies between factor {best:.2f} (with the "
               f"reserve), {mid:.2f} (with the fragmentation at the peak) and {loose:.2f} (the allocated peak alone)"]
        if reserve > LOOSE_RESERVE:
            why.append(f"the reserve ({reserve:.2f}x) is large: fragmentation may differ at another size")
            level -= 1
    why.append(f"the replay's allocated-peak predictions were within {CHECKED_ERROR * 100:.0f} % of real runs on "
               f"the model families of docs/what-if.md")
    sources = set(f.an.segmentation.sources.values())
    if "inferred" in sources or not sources:
        why.append("phases were inferred, not marked: which blocks are per-token is less sure")
        level -= 1
    if axis == "sequence":
        why.append(block_growth(f).evidence)
        if not (block_growth(f).kind == QUADRATIC).any():
            level -= 1  # linear growth is assumed from the absence of evidence, not seen
    return ("low", "medium", "high")[max(level, 0)], why
