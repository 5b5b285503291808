"""Many ranks of one distributed run as one report: every rank's peaks per step and phase side by side
(max, min, spread), the rank that sets the run's peak and why, the memory FSDP2 and DDP hold (only where
the trace shows it), steps aligned by number across ranks; each rank reduced to a
``RankSummary`` (docs/distributed.md).

Example:
    >>> run = phasemem.analyze_ranks("mem/")          # a folder, a glob, or a list of files
    >>> print(run); run.peak.rank, run.peak.phase
    >>> run.save_png("ranks.png"); run.to_json("ranks.json")
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

import numpy as np

from ..analysis.roles import DDP_ROLES, FSDP2_ROLES, backward_ends, role_bytes, roles
from ..errors import PhasememError
from ..report.breakdown import peak_breakdown, shape_at
from ..report.registry import Written, reporter
from ..report.report import INCOMPLETE_NOTE, Report
from ..vocab import PHASES

#: Columns of curve kept per phase run of a rank (its highest level in each): the lanes' resolution.
LANE_COLUMNS = 64
#: The peak rank's lead in one category is named only from this share of its peak: issue #31's DDP job
#: on 2 gloo ranks peaks in the optimizer on both, 20 B apart (one scalar more alive on one rank) of
#: 7.3 MiB; a real imbalance (tests/distributed/test_distributed.py's FSDP2 job, rank 1 on twice the batch) leads
#: by 2 MiB of 6.7 MiB.
MIN_EXCESS_SHARE = 0.01


@dataclass
class RankSummary:
    """One rank, as the run report needs it: its peaks, where its peak is and what it is made of.

    ``steps[number]`` = ``{"complete", "peak", "phases": {phase: peak}}``; ``parallel[role]`` = bytes
    alive at the peak (None: the role applies but the trace cannot show it); ``lanes`` = per phase run
    inside a step ``(step number, phase, events, highest level per column)``.
    """

    rank: int | None
    name: str
    device: str
    world_size: int | None
    n_events: int
    peak_bytes: int
    peak_event: int
    peak_step: int | None
    peak_phase: str
    peak_shape: str | None
    by_category: dict[str, int]
    steps: dict[int, dict]
    phases: dict[str, int]
    wrapper: str | None = None  # "ddp", "fsdp2", or None: no evidence of either
    evidence: str = "none"  # what told the parallel roles apart: "stack frames", "FSDP2's ranges", "none"
    parallel: dict[str, int | None] = field(default_factory=dict)
    parallel_max: dict[str, int | None] = field(default_factory=dict)  # the most each role held at once
    lanes: list[tuple[int, str, int, list[int]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def number(self) -> int:
        # the rank, once _number gave every summary of a run one
        assert self.rank is not None
        return self.rank


def summarize(report: Report, rank: int | None = None, name: str | None = None) -> RankSummary:
    """A rank's ``Report`` as a ``RankSummary``; ``rank`` defaults to the one its snapshot recorded.

    Example:
        >>> summarize(phasemem.analyze("mem/rank1.pickle.xz")).peak_phase
        'backward'
    """
    meta = report.analysis.trace.meta if report.analysis is not None else {}
    rank = meta.get("rank", rank) if rank is None else rank
    steps = {s.number: {"complete": s.complete, "peak": int(s.peak_bytes),
                        "phases": {p.name: int(p.peak_bytes) for p in s.phases.values() if p.ran}} for s in report.steps}
    s = RankSummary(rank=None if rank is None else int(rank), name=name or f"rank {rank}", device=report.device,
                    world_size=meta.get("world_size"), n_events=report.n_events, peak_bytes=int(report.peak_bytes),
                    peak_event=int(report.peak_event), peak_step=None, peak_phase="other", peak_shape=None,
                    by_category={k: int(v) for k, v in report.by_category.items()}, steps=steps,
                    phases={p.name: int(p.peak_bytes) for p in report.phases.values()}, notes=list(report.notes))
    if report.analysis is None:  # a snapshot without history: live memory only
        return s
    bd = peak_breakdown(report)
    s.peak_step, s.peak_phase, s.peak_shape = bd.step_number, bd.phase, shape_at(report, report.peak_event)
    s.wrapper, s.evidence, s.parallel, s.parallel_max = parallel_parts(report)
    s.lanes = _lanes(report)
    return s


def _lanes(report: Report) -> list[tuple[int, str, int, list[int]]]:
    assert report.analysis is not None  # summarize() asks only with the trace's analysis
    level = report.analysis.timeline.level
    out = []
    for a, b, phase, k in report.label_runs():
        if k < 0:
            continue
        cuts = np.linspace(a, b + 1, min(b + 1 - a, LANE_COLUMNS) + 1).astype(np.int64)[:-1]
        out.append((report.steps[k].number, phase, b + 1 - a, np.maximum.reduceat(level[a:b + 1], cuts - a).tolist()))
    return out


def parallel_parts(report: Report) -> tuple[str | None, str, dict, dict]:
    """(wrapper, evidence, bytes per role at the peak, the most per role at once) of one rank's report
    (``phasemem.analysis.roles``); a role the trace cannot show is None.

    Example:
        >>> parallel_parts(phasemem.analyze("fixtures/heldout4/heldout4_gpt_fsdp2_bf16.pkl.xz"))[:2]
        ('fsdp2', 'stack frames and FSDP2's ranges')
    """
    an = report.analysis
    assert an is not None, "a snapshot without history has no parallel roles"
    found = roles(an.trace, an.timeline, an.labels, an.step_of, backward_ends(report.steps, report.n_events))
    if found.wrapper is None:
        return None, "none", {}, {}
    counted = role_bytes(an.timeline, found.codes, report.peak_event)
    wanted, known = (FSDP2_ROLES if found.wrapper == "fsdp2" else DDP_ROLES), found.known()
    at, most = ({r: (d[r] if known else None) for r in wanted} for d in counted)
    if found.wrapper == "fsdp2":  # fully_shard made the shards before the block: the parameters' bytes
        at["sharded_parameters"] = most["sharded_parameters"] = sharded_parameters(report)
    return found.wrapper, found.evidence, at, most


def sharded_parameters(report: Report) -> int | None:
    """FSDP2's sharded parameters, which live through the whole recording: what ``instrument()`` counted
    of the program's own parameters (``tensor_bytes``), else the ``parameter`` category -- unless an
    optimizer ran and no optimizer state was found: its state was then made before the recording and
    is counted with the parameters (FSDP2 + fused AdamW on the H200: 1.65 GiB "parameters", 542 MiB of
    them the shards), so None (unknown).

    Example:
        >>> sharded_parameters(phasemem.analyze("fixtures/fsdp2/fsdp2_instrument.pkl.xz"))
        568655872
    """
    told = ((report.analysis.trace.meta if report.analysis is not None else {}).get("tensor_bytes") or {}).get("parameters")
    if told is not None:
        return int(told)
    if "optimizer" in report.phases and not report.by_category.get("optimizer_state"):
        return None
    return int(report.by_category.get("parameter", 0))


# ---- the run ---------------------------------------------------------------------------------------

@dataclass
class Row:
    """One (step, phase) across ranks: each rank's peak there (``step`` None: over all steps)."""

    step: int | None
    phase: str
    peaks: dict[int, int]

    @property
    def max(self) -> int:
        return max(self.peaks.values())

    @property
    def min(self) -> int:
        return min(self.peaks.values())

    @property
    def spread(self) -> int:
        return self.max - self.min

    @property
    def max_rank(self) -> int:
        return max(self.peaks, key=lambda r: (self.peaks[r], -r))


@dataclass
class RunPeak:
    """The rank that sets the run's peak and why: where (step, phase, shape), and the category it
    holds most more of than the median other rank holds at its own peak (the largest category, alone)."""

    rank: int
    bytes: int
    step: int | None
    phase: str
    shape: str | None
    category: str | None
    category_excess: int  # bytes over the median other rank in that category (its bytes with one rank)


@dataclass
class RunReport(Written):
    """Every rank of one run, aligned by step number. ``ranks`` in rank order; ``rows`` the common
    steps' (step, phase) peaks; ``phases`` the peaks over all steps; ``peak`` the highest rank.

    Example:
        >>> run = phasemem.analyze_ranks("mem/")
        >>> run.peak.rank, run.spread, [r.spread for r in run.rows]
    """

    ranks: list[RankSummary]
    steps: list[int]
    rows: list[Row]
    phases: list[Row]
    peak: RunPeak
    notes: list[str] = field(default_factory=list)

    def text(self, full: bool = False) -> str:
        """The run as text: the peak, each rank's wrapper, the ranks' peaks per phase of the typical step,
        of the steps that differ from it and over all steps; ``full``: of every step.

        Example:
            >>> print(run.text(full=True))
        """
        return reporter("text", self).render(self, full=full)  # type: ignore[return-value]  # text renders str

    @property
    def spread(self) -> int:
        """Highest rank peak minus lowest."""
        return max(s.peak_bytes for s in self.ranks) - min(s.peak_bytes for s in self.ranks)

    @classmethod
    def of(cls, summaries: list[RankSummary]) -> "RunReport":
        """The run report of some ranks' summaries (pure).

        Example:
            >>> RunReport.of([summarize(r0), summarize(r1)]).peak.rank
        """
        ranks, notes = _number(summaries)
        # A rank whose recording lost phases would read as a plausible, smaller rank: said first.
        notes = [f"rank {s.rank}: {n}" for s in ranks for n in s.notes if n.startswith(INCOMPLETE_NOTE)] + notes
        steps, more = _common_steps(ranks)
        notes += more
        order = [p for p in PHASES if any(p in s.phases for s in ranks)]
        rows = [Row(n, p, {s.number: s.steps[n]["phases"][p] for s in ranks})
                for n in steps for p in order if all(p in s.steps[n]["phases"] for s in ranks)]
        phases = [Row(None, p, {s.number: s.phases[p] for s in ranks}) for p in order if all(p in s.phases for s in ranks)]
        return cls(ranks, steps, rows, phases, _run_peak(ranks), notes)

    def to_dict(self) -> dict:
        """Everything as JSON-ready values (rows with their max, min and spread)."""
        def row(r: Row) -> dict:
            return {"step": r.step, "phase": r.phase, "peaks": {str(k): v for k, v in r.peaks.items()},
                    "max": r.max, "min": r.min, "spread": r.spread, "max_rank": r.max_rank}

        ranks = [_rank_dict(s) for s in self.ranks]
        return {"ranks": ranks, "steps": self.steps, "rows": [row(r) for r in self.rows],
                "phases": [row(r) for r in self.phases], "peak": asdict(self.peak), "spread": self.spread,
                "notes": self.notes}


def _rank_dict(s: RankSummary) -> dict:
    """``asdict(s)`` with the steps' keys as text, copied by hand: asdict deep-copies every number of the
    lanes one by one (9 s of 16 ranks' 1.1M at 217 steps each)."""
    d = {f.name: getattr(s, f.name) for f in fields(s)}
    d.update(by_category=dict(s.by_category), phases=dict(s.phases), parallel=dict(s.parallel),
             parallel_max=dict(s.parallel_max), notes=list(s.notes),
             steps={str(k): {**v, "phases": dict(v["phases"])} for k, v in s.steps.items()},
             lanes=[(k, ph, n, list(env)) for k, ph, n, env in s.lanes])
    return d


def _number(summaries: list[RankSummary]) -> tuple[list[RankSummary], list[str]]:
    if not summaries:
        raise PhasememError("no rank to report on; give the folder or files that run.save wrote")
    notes, taken = [], {s.rank for s in summaries if s.rank is not None}
    free = (r for r in range(len(summaries) + len(taken)) if r not in taken)
    for s in summaries:
        if s.rank is None:
            s.rank = next(free)
            notes.append(f"{s.name} does not say its rank; numbered {s.rank} by its place in the list")
    seen: dict[int, str] = {}
    for s in summaries:
        if s.number in seen:
            raise PhasememError(f"{seen[s.number]} and {s.name} are both rank {s.rank}; give one snapshot per rank")
        seen[s.number] = s.name
    world = max((s.world_size or 0 for s in summaries), default=0)
    if world > len(summaries):
        missing = sorted(set(range(world)) - set(seen))
        notes.append(f"the job had {world} ranks; no snapshot of rank(s) {_list(missing)}")
    return sorted(summaries, key=lambda s: s.number), notes


def _common_steps(ranks: list[RankSummary]) -> tuple[list[int], list[str]]:
    have = [set(s.steps) for s in ranks]
    common = sorted(set.intersection(*have))
    if not common and any(have):
        said = "; ".join(f"rank {s.rank}: {_list(sorted(s.steps)) or 'none'}" for s in ranks)
        raise PhasememError(f"the ranks recorded different steps ({said}), so none can be aligned; record the "
                            "same steps on every rank (instrument() around the same iterations)")
    extra = [f"rank {s.rank} also has step(s) {_list(sorted(h - set(common)))}" for s, h in zip(ranks, have)
             if h - set(common)]
    return common, ([f"aligned on step(s) {_list(common)}, the ones every rank has; " + ", ".join(extra)]
                    if extra else [])


def _run_peak(ranks: list[RankSummary]) -> RunPeak:
    top = max(ranks, key=lambda s: (s.peak_bytes, -s.number))
    others = [s for s in ranks if s is not top]
    excess = {c: v - (int(np.median([o.by_category.get(c, 0) for o in others])) if others else 0)
              for c, v in top.by_category.items()}
    cat = max(excess, key=lambda c: excess[c]) if excess else None
    if cat is not None and excess[cat] < MIN_EXCESS_SHARE * top.peak_bytes:
        cat = None
    return RunPeak(top.number, top.peak_bytes, top.peak_step, top.peak_phase, top.peak_shape, cat,
                   int(excess[cat]) if cat else 0)


def _list(nums: list[int]) -> str:
    """[0, 1, 2, 5] → '0-2, 5'."""
    out, k = [], 0
    while k < len(nums):
        j = k
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[k]) if j == k else f"{nums[k]}-{nums[j]}")
        k = j + 1
    return ", ".join(out)
