"""Many rank files analysed at once (``analyze_ranks``, ``phasemem analyze FOLDER``): one after
another, on this machine's cores (a pool of fresh processes), or on a Dask cluster; each worker reads,
analyses and reduces one rank's file to its ``RankSummary``, and only summaries come back.

Example:
    >>> run = phasemem.analyze_ranks("mem/", workers=4)      # or scheduler="tcp://head:8786"
"""
from __future__ import annotations

import sys
from contextlib import contextmanager

from ..errors import PhasememError
from ..report.pipeline import analyze
from .rank_files import rank_files, rank_of_name
from .run_report import RankSummary, RunReport, summarize


def each_rank(paths: list[str], **analyze_options):
    """``(path, report, summary)`` per file, one at a time (a report holds its whole trace: only its
    summary is kept). ``analyze_options`` go to ``phasemem.analyze``.

    Example:
        >>> [s.peak_bytes for _, _, s in each_rank(rank_files("mem/"), steps="1-2")]
    """
    for path in paths:
        report = analyze(path, **analyze_options)
        meta = report.analysis.trace.meta if report.analysis is not None else {}
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
    meta = report.analysis.trace.meta if report.analysis is not None else {}
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
    """``(summary, broken budgets)`` of each file, in the order of ``paths``: one after another, on
    ``workers`` local processes, or on the Dask cluster at ``scheduler``; the first file in ``paths`` that
    fails raises its error. ``meanwhile()`` runs while the workers analyse (the defaults: docs/distributed.md).

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
