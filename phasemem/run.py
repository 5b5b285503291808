"""``instrument()``: what a user records with, and ``Run``, the recording with its report; what is
added above the snapshot lives here, above the pipeline and the reporters, so that no floor imports one
above it (docs/design.md). Importing it imports torch.

Example:
    >>> with phasemem.instrument(model, opt) as run:
    ...     train(3)
    >>> print(run.report()); run.save("mem/")
"""
from __future__ import annotations

import os
from typing import Any

import torch

from .capture import ranks
from .capture.instrument import Recording
from .distributed.run_report import RunReport, summarize
from .report.pipeline import analyze
from .report.report import Report


class Run(Recording):
    """One recording; ``instrument()`` returns it and ``with`` hands back the same object.

    After the block: ``run.snapshot`` is the snapshot dict (plain Python types, loadable without torch),
    ``run.report()`` analyses it, ``run.save(path)`` writes it (``.xz``/``.gz`` compress).
    """

    def report(self, gather: bool = False, **kwargs: Any) -> Report | RunReport:
        """``phasemem.analyze(run.snapshot, **kwargs)``; ``gather=True`` (every rank of a process group
        must call it) gathers each rank's summary with ``all_gather_object`` and returns the
        ``phasemem.distributed.run_report.RunReport`` of all of them, on every rank.

        Example:
            >>> run.report().phases["backward"].peak_bytes
        """
        snap = self._need_snapshot()
        report = analyze(snap, **kwargs)
        if not gather:
            return report
        mine = summarize(report, rank=(snap.get("phasemem") or {}).get("rank"))
        return RunReport.of(ranks.all_gather(mine))

    def save(self, path: str | os.PathLike) -> str:
        """``Recording.save``; a folder also gets this rank's report as ``rank{r}.json`` (what
        ``phasemem analyze FOLDER`` reads beside the snapshots).

        Example:
            >>> run.save("mem/")          # mem/rank{r}.pickle.xz + mem/rank{r}.json
        """
        folder = ranks.is_folder(path)
        written = super().save(path)
        if folder:
            rank = ranks.rank_of(self.snapshot)
            self.report().to_json(os.path.join(os.fspath(path), ranks.RANK_JSON.format(rank=rank)))
        return written

    def _dump_beside(self, stem: str) -> str:
        report = self.report()
        report.to_json(stem + ".json")
        report.save_png(stem + ".png")
        return "snapshot, report and picture"


def instrument(
    model: torch.nn.Module | None,
    optimizer: Any = None,
    *,
    device: Any = None,
    max_entries: int = 1_000_000,
    stacks: str | None = "python",
    oom_dump: str | os.PathLike | None = None,
    steps: str | None = None,
) -> Run:
    """Record GPU (or, without CUDA, CPU) memory around a training loop, marking its phases.

    Build the model and optimizer first: their memory then counts as pre-existing, as in a real job.
    Inside the block every model forward, ``optimizer.zero_grad``, ``backward`` and ``optimizer.step``
    is wrapped in ``record_function("phasemem::<phase>")``; on exit (also on an exception) the
    snapshot is taken, recording is restored to what it was, and every hook and patch is removed.

    >>> model, opt = Net().cuda(), torch.optim.AdamW(model.parameters())
    >>> with instrument(model, opt) as run:
    ...     for x, y in batches[:3]:
    ...         loss = F.cross_entropy(model(x), y)
    ...         opt.zero_grad(set_to_none=True)
    ...         loss.backward()
    ...         opt.step()
    >>> print(run.report())
    >>> run.save("step.pkl.xz")

    ``optimizer`` may be one optimizer, a list, or None (inference). ``device``: None picks the current
    CUDA device, else the CPU profiler; ``"cpu"`` forces the profiler. ``max_entries`` bounds the CUDA
    ring buffer (older events are overwritten). ``stacks``: ``"python"``, ``"all"`` (C++ frames too) or
    None (no frames: smaller, faster). ``oom_dump="oom.pkl.xz"``: when the block raises
    ``torch.OutOfMemoryError``, write the snapshot there and its report and picture beside it
    (``oom.json``, ``oom.png``), then re-raise.

    ``steps="5000-5002"`` records only those steps of the block (counted from 0 by the first optimizer's
    ``step()`` calls, or the model's forward calls without one): recording starts when step 4999 ends
    and the snapshot is taken when step 5002 ends, so the steps outside pay one Python call each before
    the window and nothing after it (``docs/integrations.md``).
    """
    return Run(model, optimizer, device=device, max_entries=max_entries, stacks=stacks, oom_dump=oom_dump,
               steps=steps)
