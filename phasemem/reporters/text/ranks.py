"""A run of many ranks as text (``print(run)``): the run's peak and the rank that sets it, what the
distributed wrapper holds at each rank's peak, and the ranks' peaks per phase of the typical step, of
each kind of step that differs from it, and over all steps; ``full``: of every step.

Example:
    >>> print(format_run(phasemem.analyze_ranks("mem/")))
    >>> print(format_run(run, full=True))   # every step's rows
"""
from __future__ import annotations

import numpy as np

from ...analysis.typical import ALIKE, ranges
from ...distributed.run_report import RankSummary, Row, RunReport
from ...units import format_bytes
from ...vocab import CATEGORY_NAMES, ROLE_NAMES

#: Per-rank columns in the table up to this many ranks; past it only max, min and spread.
TABLE_RANKS = 8
#: Ranks whose wrapper line is printed, past which only the first, the highest and the lowest are.
RANK_LINES = 16
#: Kinds of step that differ from the typical one shown by their first step's rows; the rest are counted.
DIFFER_SHOWN = 5
FULL_HINT = "(every step's rows: phasemem analyze DIR --full, or print(run.text(full=True)))"


def format_run(run: RunReport, full: bool = False) -> str:
    """The run report's text (``str(run)``): the peak and why, each rank's wrapper, the table (of the
    typical step and those that differ; ``full``: of every step)."""
    ranks, p = run.ranks, run.peak
    kinds = sorted({s.device.split(":")[0] for s in ranks})
    lines = [f"phasemem run report — {len(ranks)} rank(s) ({', '.join(kinds)}), "
             + (f"step(s) {ranges(run.steps, most=len(run.steps))} on every rank" if run.steps else "no steps")]
    # The lowest of the *other* ranks: with a tie, the peak's own rank is not also named the lowest.
    lo = min((s for s in ranks if s.rank != p.rank), key=lambda s: s.peak_bytes, default=ranks[0])
    where = f"step {p.step}, {p.phase}" if p.step is not None else p.phase
    lines.append(f"run peak {format_bytes(p.bytes)} on rank {p.rank} ({where}" + (f", shape {p.shape}" if p.shape else "")
                 + ")" + (f"; lowest rank peak {format_bytes(lo.peak_bytes)} on rank {lo.rank}; spread "
                          f"{format_bytes(run.spread)} ({run.spread / max(p.bytes, 1):.0%} of the peak)"
                          if len(ranks) > 1 else ""))
    if p.category and len(ranks) > 1:
        lines.append(f"  rank {p.rank} holds {format_bytes(p.category_excess)} more "
                     f"{CATEGORY_NAMES.get(p.category, p.category)} at its peak than the median other rank at its own")
    lines += [f"note: {n}" for n in run.notes]
    lines += ["", "what the distributed wrapper holds at each rank's peak:"]
    if full or len(ranks) <= RANK_LINES:
        lines += [_parallel_line(s) for s in ranks]
    else:  # the ranks at the ends of the spread, and the first: the rest are between them
        keep = sorted({int(ranks[0].rank or 0), int(p.rank), int(lo.rank or 0)})  # numbered by RunReport.of
        lines += [_parallel_line(s) for s in ranks if s.rank in keep]
        lines.append(f"  … {len(ranks) - len(keep)} more ranks between them (every rank: --full)")
    shown = [s.number for s in ranks] if len(ranks) <= TABLE_RANKS else []
    head = f"{'step':>5} {'phase':<10}" + "".join(f"{'rank ' + str(r):>11}" for r in shown) + \
        f"{'max':>11}{'min':>11}{'spread':>11}{'max at':>8}"
    lines += ["", head, "-" * len(head)]

    def row(r: Row) -> str:
        return (f"{'all' if r.step is None else r.step:>5} {r.phase:<10}"
                + "".join(f"{format_bytes(r.peaks[k]):>11}" for k in shown)
                + f"{format_bytes(r.max):>11}{format_bytes(r.min):>11}{format_bytes(r.spread):>11}"
                + f"{'rank ' + str(r.max_rank) if r.spread else '—':>8}")

    groups = [] if full else _kinds(run)
    if full or len(groups) == len(run.steps):  # every step its own kind: nothing to fold
        return "\n".join(lines + [row(r) for r in run.rows + run.phases])
    by_step: dict[int, list[Row]] = {}
    for r in run.rows:
        by_step.setdefault(r.step, []).append(r)  # type: ignore[arg-type]  # the rows of steps have one
    (first, alike), *differ = groups
    lines.append(f"the typical step, {first}: {len(alike)} of {len(run.steps)} steps within {ALIKE:.0%} of it on "
                 f"every rank and phase (steps {ranges(alike)})")
    lines += [row(r) for r in by_step[first]]
    for rep, steps in differ[:DIFFER_SHOWN]:
        lines.append(f"differs: steps {ranges(steps)}, each as step {rep}" if len(steps) > 1 else f"differs: step {rep}")
        lines += [row(r) for r in by_step[rep]]
    if len(differ) > DIFFER_SHOWN:
        more = sum(len(steps) for _, steps in differ[DIFFER_SHOWN:])
        lines.append(f"… {len(differ) - DIFFER_SHOWN} more kinds of step ({more} steps) differ")
    lines.append("over all steps")
    lines += [row(r) for r in run.phases]
    return "\n".join(lines + [FULL_HINT])


def _kinds(run: RunReport) -> list[tuple[int, list[int]]]:
    """The steps grouped by kind, most steps first: a kind's steps run the same phases, each phase's peak
    on every rank within ALIKE of its first step's peak (the typical step's rule, docs/first-screen.md)."""
    if not run.steps:
        return []
    order = list(dict.fromkeys(r.phase for r in run.rows))
    ranks = sorted({k for r in run.rows for k in r.peaks})
    step_at = {n: i for i, n in enumerate(run.steps)}
    peaks = np.full((len(run.steps), len(order), len(ranks)), -1, np.int64)
    col = {k: j for j, k in enumerate(ranks)}
    for r in run.rows:
        for k, v in r.peaks.items():
            peaks[step_at[r.step], order.index(r.phase), col[k]] = v  # type: ignore[index]  # rows of steps
    reps: list[int] = []
    members: list[list[int]] = []
    for i in range(len(run.steps)):
        if reps:
            ref = peaks[reps]
            same_phases = ((ref >= 0) == (peaks[i] >= 0)).all(axis=(1, 2))
            close = (np.abs(ref - peaks[i]) <= ALIKE * ref.max(axis=(1, 2))[:, None, None]).all(axis=(1, 2))
            hit = np.flatnonzero(same_phases & close)
            if len(hit):
                members[int(hit[0])].append(run.steps[i])
                continue
        reps.append(i)
        members.append([run.steps[i]])
    kinds = [(run.steps[rep], steps) for rep, steps in zip(reps, members)]
    return sorted(kinds, key=lambda k: -len(k[1]))


#: Why a role is unknown where only some are (``sharded_parameters`` says so itself).
UNKNOWN_WHY = {"sharded_parameters": " (the trace cannot tell them from optimizer state made before it; "
                                     "instrument() now records their bytes)"}


def _parallel_line(s: RankSummary) -> str:
    head = f"  rank {s.rank} {s.device} peak {format_bytes(s.peak_bytes)}: "
    if s.wrapper is None:
        return head + "no sign of DDP or FSDP2 in the trace"
    told = {"ddp": "DDP", "fsdp2": "FSDP2"}[s.wrapper]
    if all(v is None for v in s.parallel.values()):
        why = "no stack frames" if s.evidence == "none" else "its buckets were made before the recording"
        return head + f"{told}; " + ", ".join(ROLE_NAMES[r] for r in s.parallel) + f" unknown ({why})"
    parts = []
    for r, v in s.parallel.items():
        most = s.parallel_max.get(r)
        # The peak is one moment: a role empty there (FSDP2's gradients before backward makes them)
        # still says the most it held.
        more = f" (at most {format_bytes(most)})" if v is not None and most is not None and most > v else ""
        why = UNKNOWN_WHY.get(r, "") if v is None else ""
        parts.append(f"{ROLE_NAMES[r]} {'unknown' if v is None else format_bytes(v)}{more}{why}")
    return head + f"{told} (by {s.evidence}): " + ", ".join(parts)
