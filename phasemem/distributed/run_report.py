"""Many ranks of one distributed run as one report: every rank's peaks per step and phase side by side
(max, min, spread), the rank that sets the run's peak and why, the memory FSDP2 and DDP hold (only where
the trace shows it), steps aligned by number across ranks.

A rank is read through its own ``Report`` (``phasemem.analyze``), reduced to a ``RankSummary``: plain
numbers and a few KiB of curve, what ``run.report(gather=True)`` sends between ranks. ``RunReport.of``
is a pure function of those summaries.

Example:
    >>> run = phasemem.analyze_ranks("mem/")          # a folder, a glob, or a list of files
    >>> print(run); run.peak.rank, run.peak.phase
    >>> run.save_png("ranks.png"); run.to_json("ranks.json")
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from ..report.pipeline import INCOMPLETE_NOTE, analyze
from ..report.breakdown import peak_breakdown, shape_at
from ..errors import PhasememError
from ..output import Written
from .roles import DDP_ROLES, FSDP2_ROLES, backward_ends, role_bytes, roles
from .rank_files import rank_files, rank_of_name
from ..report.report import Report
from ..units import format_bytes
from ..vocab import CATEGORY_NAMES, PHASES, ROLE_NAMES

#: Columns of curve kept per phase run of a rank (its highest level in each): the lanes' resolution.
LANE_COLUMNS = 64
#: The peak rank's lead in one category is named only from this share of its peak: issue #31's DDP job
#: on 2 gloo ranks peaks in the optimizer on both, 20 B apart (one scalar more alive on one rank) of
#: 7.3 MiB; a real imbalance (tests/test_distributed.py's FSDP2 job, rank 1 on twice the batch) leads
#: by 2 MiB of 6.7 MiB.
MIN_EXCESS_SHARE = 0.01
#: Per-rank columns in the text table up to this many ranks; past it only max, min and spread.
TABLE_RANKS = 8


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


def summarize(report: Report, rank: int | None = None, name: str | None = None) -> RankSummary:
    """A rank's ``Report`` as a ``RankSummary``; ``rank`` defaults to the one its snapshot recorded.

    Example:
        >>> summarize(phasemem.analyze("mem/rank1.pickle.xz")).peak_phase
        'backward'
    """
    meta = report.trace.meta if report.trace is not None else {}
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
    level = report.timeline.level
    out = []
    for a, b, phase, k in report.label_runs():
        if k < 0:
            continue
        cuts = np.linspace(a, b + 1, min(b + 1 - a, LANE_COLUMNS) + 1).astype(np.int64)[:-1]
        out.append((report.steps[k].number, phase, b + 1 - a, np.maximum.reduceat(level[a:b + 1], cuts - a).tolist()))
    return out


def parallel_parts(report: Report) -> tuple[str | None, str, dict, dict]:
    """(wrapper, evidence, bytes per role at the peak, the most per role at once) of one rank's report
    (``phasemem.distributed.roles``); a role the trace cannot show is None.

    Example:
        >>> parallel_parts(phasemem.analyze("fixtures/heldout4/heldout4_gpt_fsdp2_bf16.pkl.xz"))[:2]
        ('fsdp2', 'stack frames and FSDP2's ranges')
    """
    found = roles(report.trace, report.timeline, report.label_codes, report.step_of,
                  backward_ends(report.steps, report.n_events))
    if found.wrapper is None:
        return None, "none", {}, {}
    at, most = role_bytes(report.timeline, found.codes, report.peak_event)
    wanted, known = (FSDP2_ROLES if found.wrapper == "fsdp2" else DDP_ROLES), found.known()
    at, most = ({r: (d[r] if known else None) for r in wanted} for d in (at, most))
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
    told = ((report.trace.meta if report.trace is not None else {}).get("tensor_bytes") or {}).get("parameters")
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
        rows = [Row(n, p, {s.rank: s.steps[n]["phases"][p] for s in ranks})
                for n in steps for p in order if all(p in s.steps[n]["phases"] for s in ranks)]
        phases = [Row(None, p, {s.rank: s.phases[p] for s in ranks}) for p in order if all(p in s.phases for s in ranks)]
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

    def picture_writer(self, path, **options):
        """The lanes (or heat strip) picture drawn now, and a function writing it (``output.write_all``)."""
        from ..reporters.picture.ranks import picture_writer  # matplotlib only when a picture is asked for

        return picture_writer(self, path, **options)

    def __str__(self) -> str:
        return format_run(self)


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
        if s.rank in seen:
            raise PhasememError(f"{seen[s.rank]} and {s.name} are both rank {s.rank}; give one snapshot per rank")
        seen[s.rank] = s.name
    world = max((s.world_size or 0 for s in summaries), default=0)
    if world > len(summaries):
        missing = sorted(set(range(world)) - set(seen))
        notes.append(f"the job had {world} ranks; no snapshot of rank(s) {_list(missing)}")
    return sorted(summaries, key=lambda s: s.rank), notes


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
    top = max(ranks, key=lambda s: (s.peak_bytes, -s.rank))
    others = [s for s in ranks if s is not top]
    excess = {c: v - (int(np.median([o.by_category.get(c, 0) for o in others])) if others else 0)
              for c, v in top.by_category.items()}
    cat = max(excess, key=excess.get) if excess else None
    if cat is not None and excess[cat] < MIN_EXCESS_SHARE * top.peak_bytes:
        cat = None
    return RunPeak(top.rank, top.peak_bytes, top.peak_step, top.peak_phase, top.peak_shape, cat,
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


# ---- text ------------------------------------------------------------------------------------------

def format_run(run: RunReport) -> str:
    """The run report's text (``str(run)``): the peak and why, each rank's wrapper, the table."""
    ranks, p = run.ranks, run.peak
    kinds = sorted({s.device.split(":")[0] for s in ranks})
    lines = [f"phasemem run report — {len(ranks)} rank(s) ({', '.join(kinds)}), "
             + (f"step(s) {_list(run.steps)} on every rank" if run.steps else "no steps")]
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
    lines += ["", "what the distributed wrapper holds at each rank's peak:"] + [_parallel_line(s) for s in ranks]
    shown = [s.rank for s in ranks] if len(ranks) <= TABLE_RANKS else []
    head = f"{'step':>5} {'phase':<10}" + "".join(f"{'rank ' + str(r):>11}" for r in shown) + \
        f"{'max':>11}{'min':>11}{'spread':>11}{'max at':>8}"
    lines += ["", head, "-" * len(head)]
    for r in run.rows + run.phases:
        lines.append(f"{'all' if r.step is None else r.step:>5} {r.phase:<10}"
                     + "".join(f"{format_bytes(r.peaks[k]):>11}" for k in shown)
                     + f"{format_bytes(r.max):>11}{format_bytes(r.min):>11}{format_bytes(r.spread):>11}"
                     + f"{'rank ' + str(r.max_rank) if r.spread else '—':>8}")
    return "\n".join(lines)


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


def each_rank(paths: list[str], **analyze_options):
    """``(path, report, summary)`` per file, one at a time (a report holds its whole trace: only its
    summary is kept). ``analyze_options`` go to ``phasemem.analyze``.

    Example:
        >>> [s.peak_bytes for _, _, s in each_rank(rank_files("mem/"), steps="1-2")]
    """
    for path in paths:
        report = analyze(path, **analyze_options)
        meta = report.trace.meta if report.trace is not None else {}
        yield path, report, summarize(report, name=path, rank=meta.get("rank", rank_of_name(path)))


def summarize_file(path: str, name: str | None = None, budgets=(), **analyze_options) -> tuple[RankSummary, list[str]]:
    """One rank's file read, analysed and reduced where this runs (the caller, a worker process, a Dask
    worker): only its summary and the ``budgets`` (``--fail-if``) it breaks come back, never the trace.
    ``name`` is the path as the user gave it (``path`` may be made absolute for a worker): the summary
    and any error say that one.

    Example:
        >>> summary, broken = summarize_file("/runs/mem/rank3.pickle.xz", "mem/rank3.pickle.xz")
    """
    from ..report.budgets import check_report

    name = path if name is None else name
    try:
        # The summary reads no remedy: their replays (a fifth of the analysis) are left out.
        report = analyze(path, what_ifs=False, **analyze_options)
    except PhasememError as e:
        raise _naming(e, path, name) from None
    meta = report.trace.meta if report.trace is not None else {}
    summary = summarize(report, name=name, rank=meta.get("rank", rank_of_name(name)))
    return summary, check_report(list(budgets), report)


def _naming(e: PhasememError, path: str, name: str) -> PhasememError:
    """The error as the serial path says it, whatever read the file: with the file as the user named it."""
    text = str(e).replace(path, name) if path != name else str(e)
    if name not in text:  # a rank's error that does not say which file: one of 16 would be a riddle
        text = f"{name}: {text}"
    try:
        return type(e)(text)
    except TypeError:
        return PhasememError(text)


def local_cores() -> int:
    """The cores this process may run on (its affinity, not the machine's count)."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def rank_summaries(paths: list[str], *, workers: int | None = None, scheduler=None, budgets=(), meanwhile=None,
                   **analyze_options) -> list[tuple[RankSummary, list[str]]]:
    """``(summary, broken budgets)`` of each file, in the order of ``paths``, whichever way they ran:
    one after another (``workers=1``, or one file), on ``workers`` local processes (default: every core
    this process may use, once the files add up to ``MIN_POOL_BYTES``), or on the Dask cluster at
    ``scheduler`` (an address, or a ``distributed.Client``). The first file in ``paths`` that fails raises its error, as one after another.
    ``meanwhile()`` runs here while the workers analyse (the CLI loads the picture's modules then).

    Example:
        >>> [s.peak_bytes for s, _ in rank_summaries(rank_files("mem/"), workers=2)]
    """
    paths = list(paths)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise PhasememError(f"workers={workers!r}: give a whole number of processes, 1 or more (1: one rank after another)")
    if scheduler is not None:
        if workers is not None:
            raise PhasememError("give workers or a scheduler, not both: on a Dask cluster its own workers analyse the ranks")
        return _on_cluster(paths, scheduler, budgets, analyze_options, meanwhile)
    if workers is None:  # every core, where the ranks are enough to pay for starting the workers
        workers = local_cores() if _on_disk(paths) >= MIN_POOL_BYTES else 1
    workers = min(workers, len(paths))
    if workers <= 1:
        if meanwhile is not None:
            meanwhile()
        return [summarize_file(p, p, budgets, **analyze_options) for p in paths]
    return _on_processes(paths, workers, budgets, analyze_options, meanwhile)


#: By default the ranks go to worker processes only from this many bytes of files: a worker costs a fresh
#: interpreter importing phasemem (0.5 s of a core here), and smaller runs finish sooner one after another
#: (fixtures/pairs as 4 ranks, 8k events and 45 KB each: see docs/performance.md). ``workers=N`` is obeyed.
MIN_POOL_BYTES = 2 << 20


def _on_disk(paths: list[str]) -> int:
    import os

    return sum(os.path.getsize(p) for p in paths if os.path.exists(p))


def _biggest_first(paths: list[str]) -> list[str]:
    """The order to hand files out in: the longest analyses first, so no worker is left with one at the end."""
    import os

    return sorted(paths, key=lambda p: -os.path.getsize(p) if os.path.exists(p) else 0)


def _on_processes(paths: list[str], workers: int, budgets, options: dict, meanwhile=None) -> list[tuple[RankSummary, list[str]]]:
    """The files on a pool of fresh processes. Not fork: the caller may have imported torch (threads, a
    CUDA context) and a forked child inherits their locks held; forkserver (else spawn) starts clean.
    Each worker holds one rank's analysis at a time, so memory is ``workers`` ranks' at most."""
    import os
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    with ProcessPoolExecutor(workers, mp_context=_start_method()) as pool:
        with _main_unseen():  # the workers start in these submits
            futures = {p: pool.submit(summarize_file, os.path.abspath(p), p, tuple(budgets), **options)
                       for p in _biggest_first(paths)}
        try:
            if meanwhile is not None:
                meanwhile()
            out = []
            for p in paths:  # in the user's order: the first bad file is the one the serial path names
                try:
                    out.append(futures[p].result())
                except BrokenProcessPool:
                    raise PhasememError(f"{p}: the process analysing it stopped (killed, or out of memory?); "
                                        "try fewer workers (--workers 1: one rank at a time)") from None
            return out
        except BaseException:  # a bad file (the ranks before it are done), Ctrl-C: the rest is not wanted
            running = dict(getattr(pool, "_processes", None) or {})  # shutdown forgets them
            pool.shutdown(wait=False, cancel_futures=True)
            for proc in running.values():
                proc.terminate()  # or each would finish its rank, and the one queued for it, first
            raise


@contextmanager
def _main_unseen():
    """The caller's main module hidden from the workers while they start: spawn and forkserver run the
    caller's script again in each worker (as ``__mp_main__``) unless its body sits under ``if __name__ ==
    "__main__":``; a script without that guard would train again, or die, in every worker. What the
    workers run is phasemem's own, so they need nothing of it."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    try:
        if main is not None:
            main.__dict__.pop("__file__", None)
            main.__spec__ = None
        yield
    finally:
        if main is not None:
            main.__dict__.update(saved)
            if "__spec__" not in saved:
                main.__dict__.pop("__spec__", None)


def _start_method():
    """forkserver where there is one (Linux, macOS), else spawn; its server imports phasemem once, and
    each worker is a fork of it with phasemem loaded (spawn: each worker imports it, 0.5 s here)."""
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["phasemem.distributed.run_report"])
    return ctx


#: Seconds to wait for a Dask scheduler to answer: one on this network answers in well under a second
#: (a LocalCluster here: 0.01 s); Dask's own default is 30 s.
SCHEDULER_CONNECT_S = 10


def _on_cluster(paths: list[str], scheduler, budgets, options: dict, meanwhile=None) -> list[tuple[RankSummary, list[str]]]:
    """The files on an existing Dask cluster: each worker reads its rank's file by path (the workers see
    the same filesystem) and sends back only the summary. The cluster is left running."""
    import functools
    import os

    try:
        from distributed import Client
    except ImportError:
        raise PhasememError("a Dask scheduler needs dask.distributed: pip install 'phasemem[dask]' "
                            "(phasemem must be installed on the cluster's workers too)") from None
    own = not isinstance(scheduler, Client)
    try:
        client = Client(scheduler, timeout=SCHEDULER_CONNECT_S, set_as_default=False) if own else scheduler
    except (OSError, ValueError, TypeError) as e:
        raise PhasememError(f"no Dask scheduler answered at {scheduler} ({' '.join(str(e).split()) or type(e).__name__}); "
                            "give the address the scheduler prints (tcp://HOST:8786), or leave --scheduler out "
                            "to use this machine's cores") from None
    try:
        task = functools.partial(summarize_file, budgets=tuple(budgets), **options)
        order = _biggest_first(paths)
        futures = dict(zip(order, client.map(task, [os.path.abspath(p) for p in order], order, pure=False)))
        try:
            if meanwhile is not None:
                meanwhile()
            out = []
            for p in paths:
                try:
                    out.append(futures[p].result())
                except ImportError as e:
                    raise PhasememError(f"the Dask workers cannot import phasemem ({e}); install it where they "
                                        "run (pip install phasemem)") from None
            return out
        except BaseException:
            client.cancel(list(futures.values()))  # the ranks not yet analysed: the cluster is not ours
            raise
    finally:
        if own:
            client.close()


def analyze_ranks(sources, *, workers: int | None = None, scheduler=None, **analyze_options) -> RunReport:
    """Analyse every rank of a run: a folder ``run.save`` wrote, a glob, or several files; the options
    (``device``, ``trusted``, ``marker_prefix``, ``steps``) go to ``phasemem.analyze`` for each rank.
    The ranks run on every local core (``workers=N`` sets how many; 1: one after another), or on the
    Dask cluster at ``scheduler``; the report is the same whichever way.

    Example:
        >>> run = phasemem.analyze_ranks("mem/", workers=4)      # or scheduler="tcp://head:8786"
        >>> run.peak.rank, run.rows[0].spread
    """
    got = rank_summaries(rank_files(sources), workers=workers, scheduler=scheduler, **analyze_options)
    return RunReport.of([s for s, _ in got])
