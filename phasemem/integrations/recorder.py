"""What the trainer callbacks share: a step window driven by the trainer's step count, the recording,
the files each rank writes for itself (no rank waits for another), and the headline numbers for the
trainer's logger; nothing raises into training (docs/integrations.md, "Files, per rank").
"""
from __future__ import annotations

import logging
import os
import warnings
from typing import Any, Iterable

import torch

from ..capture.window import StepWindow
from ..errors import PhasememError
from ..output import write_all
from ..run import Run
from ..vocab import MARKED

#: The steps recorded when none are named: past warm-up, where step 0 creates the optimizer's state
#: (and torch.compile compiles) and the allocator's cache still grows; three steps, as every fixture
#: has, so the report can tell a steady step from a first one.
DEFAULT_STEPS = "3-5"
#: Output formats and their file suffixes.
SUFFIXES = {"snapshot": ".pickle.xz", "png": ".png", "json": ".json", "txt": ".txt"}
DEFAULT_FORMATS = ("snapshot", "png", "json")
STEM = "rank{rank}"
OOM_STEM = "oom_rank{rank}"
#: The headline numbers' names start with this (``phasemem/peak_allocated_mib``), in MiB.
METRIC_PREFIX = "phasemem/"
MIB = float(1 << 20)

log = logging.getLogger("phasemem")


def check_formats(formats: Any) -> tuple[str, ...]:
    """The formats asked for, checked: a tuple of names from SUFFIXES.

    Example:
        >>> check_formats("png"), check_formats(["snapshot", "json"])
        (('png',), ('snapshot', 'json'))
    """
    items = (formats,) if isinstance(formats, str) else tuple(formats or ())
    bad = [f for f in items if f not in SUFFIXES]
    if bad or not items:
        raise PhasememError(f"formats={formats!r}: choose one or more of {', '.join(SUFFIXES)}")
    return tuple(dict.fromkeys(items))


class Recorder:
    """One callback's recording: ``begin`` when training starts, ``boundary`` after every optimizer
    step, ``end`` when training ends (``failed`` when it raised). ``files`` and ``metrics`` hold what
    the window produced.

    Example:
        >>> rec = Recorder("10-12", "out")
        >>> rec.begin(model, [opt], done=0, rank=0, default_dir=".")
        >>> ...  # after each optimizer step: rec.boundary(global_step)
    """

    def __init__(self, steps: Any = DEFAULT_STEPS, output_dir: Any = None, formats: Any = DEFAULT_FORMATS, *,
                 oom_dump: bool = True, max_entries: int = 1_000_000, stacks: str | None = "python") -> None:
        StepWindow(steps)  # a bad range is an error where the callback is made
        self.steps = steps
        self.output_dir = os.fspath(output_dir) if output_dir is not None else None
        self.formats = check_formats(formats)
        self.oom_dump = bool(oom_dump)
        self.max_entries, self.stacks = int(max_entries), stacks
        self.run: Any = None
        self.window: StepWindow | None = None
        self.folder: str | None = None
        self.stem = STEM.format(rank=0)
        self.files: list[str] = []
        self.metrics: dict[str, float] = {}

    def begin(self, model: Any, optimizers: Iterable, *, done: int, rank: int, default_dir: str,
              hooks: tuple = ()) -> None:
        """Training starts with ``done`` steps completed (more than 0 when resumed): arm the window.
        ``hooks``: more marker installers for the recording (``StepWindow``)."""
        self.folder = self.output_dir or default_dir
        self.stem = STEM.format(rank=int(rank))
        self.window = StepWindow(self.steps, count=False, hooks=hooks)
        self.window.done = int(done)
        oom_name = OOM_STEM.format(rank=int(rank)) + SUFFIXES["snapshot"]
        oom = os.path.join(self.folder, oom_name) if self.oom_dump else None
        try:
            os.makedirs(self.folder, exist_ok=True)  # every rank may make it; exist_ok: no race
            self.run = Run(model, list(optimizers), steps=self.window, oom_dump=oom, max_entries=self.max_entries,
                           stacks=self.stacks)
            self.run.start()
            _watch_cuda_oom(self)
        except Exception as e:  # noqa: BLE001 - the training must run even when its recording cannot
            self.window = None
            warnings.warn(f"phasemem: recording steps={self.steps} cannot start ({type(e).__name__}: {e}); "
                          "training goes on unrecorded", RuntimeWarning, stacklevel=3)

    @property
    def recording(self) -> bool:
        return self.window is not None and self.window.state == "recording"

    def boundary(self, done: int) -> dict[str, float] | None:
        """``done`` optimizer steps have completed; the headline numbers when this closed the window."""
        if self.window is None or self.window.state == "closed":
            return None
        return self._write() if self.window.boundary(int(done)) else None

    def end(self, done: int) -> dict[str, float] | None:
        """Training ended: finish a window still open (its steps so far), or warn that it never opened."""
        if self.window is None or self.window.state == "closed":
            return None
        was = self.window.state
        self.window.done = int(done)
        self.run.stop()
        return self._write() if was == "recording" else None

    def oom_observed(self) -> None:
        """The CUDA allocator is about to raise an out-of-memory: inside the window, end the recording
        and dump it (``oom_rank<r>.*``) now, since no trainer hook runs after the exception (the HF Trainer has
        none). Called by the allocator's OOM observer, after it let go of its lock."""
        if not self.recording:
            return
        self.run.stop(failed=True)  # closes the window too
        if self.oom_dump:
            self.run._dump_oom()

    def failed(self, exc: BaseException) -> None:
        """Training raised ``exc``: stop; an out-of-memory inside the window is dumped (``oom_rank<r>.*``)."""
        if self.window is not None and self.window.state != "closed":
            self.run.__exit__(type(exc), exc, exc.__traceback__)

    # -- files -------------------------------------------------------------------------------
    def _write(self) -> dict[str, float]:
        run, meta = self.run, self.run.snapshot and self.run.snapshot["phasemem"]
        if not meta:
            return {}
        report = None
        try:  # also with formats=("snapshot",): the headline numbers come from the report
            report = run.report()
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"phasemem: the report of steps {self.steps} failed ({type(e).__name__}: {e}); "
                          "writing the snapshot alone", RuntimeWarning, stacklevel=3)
        outputs = self._outputs(report)
        try:
            write_all(outputs)
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"phasemem: {e}", RuntimeWarning, stacklevel=3)
            return {}
        self.files = [os.fspath(p) for p, _ in outputs]
        self.metrics = headline(report) if report is not None else {}
        steps = meta.get("steps")
        log.info("phasemem: steps %s recorded%s; %s", f"{steps[0]}-{steps[1]}" if steps else "(none complete)",
                 f", peak {self.metrics[METRIC_PREFIX + 'peak_allocated_mib']:.1f} MiB" if self.metrics else "",
                 ", ".join(self.files))
        return self.metrics

    def _outputs(self, report: Any) -> list:
        assert self.folder is not None  # begin() chose it
        path = {f: os.path.join(self.folder, self.stem + SUFFIXES[f]) for f in self.formats}
        outputs = []
        if "snapshot" in path:
            outputs.append((path["snapshot"], self.run.save))
        if report is None:
            return outputs
        if "json" in path:
            outputs.append((path["json"], report.json_writer()))
        if "txt" in path:
            text = str(report)
            outputs.append((path["txt"], lambda tmp: open(tmp, "w").write(text + "\n")))
        if "png" in path:
            try:
                outputs.append((path["png"], report.picture_writer(path["png"])))
            except Exception as e:  # noqa: BLE001 - a picture that cannot be drawn keeps the other files
                warnings.warn(f"phasemem: the picture could not be drawn ({type(e).__name__}: {e})",
                              RuntimeWarning, stacklevel=4)
        return outputs


def headline(report: Any) -> dict[str, float]:
    """The report's headline numbers for a trainer's logger, in MiB; ``peak_step`` is the training
    step that holds the peak (a window's steps are numbered as the loop numbered them).

    Example:
        >>> headline(report)["phasemem/peak_allocated_mib"]
        632.8
    """
    out = {"peak_allocated_mib": report.peak_bytes / MIB,
           "peak_reserved_mib": report.reserved_peak_bytes / MIB,
           "preexisting_mib": report.preexisting_bytes / MIB}
    for step in report.steps:
        if step.start_event <= report.peak_event <= step.end_event:
            out["peak_step"] = float(step.number)
    for name in MARKED + ("loss",):
        phase = report.phases.get(name)
        if phase is not None and phase.n_events:
            out[f"{name}_peak_mib"] = phase.peak_bytes / MIB
    for category, size in report.by_category.items():
        out[f"at_peak_{category}_mib"] = size / MIB
    return {METRIC_PREFIX + k: round(float(v), 3) for k, v in out.items()}


# The recorders whose window is open or waiting; the CUDA allocator's OOM observer (one per process:
# torch cannot detach one) tells each of them.
_WATCHING: list[Recorder] = []
_OBSERVING = [False]


def _watch_cuda_oom(rec: Recorder) -> None:
    _WATCHING[:] = [r for r in _WATCHING if r.window is not None and r.window.state != "closed"] + [rec]
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if _OBSERVING[0] or attach is None or not torch.cuda.is_available():
        return
    attach(_oom_observed)
    _OBSERVING[0] = True


def _oom_observed(device: int, alloc: int, device_allocated: int, device_free: int) -> None:
    for rec in list(_WATCHING):
        try:
            rec.oom_observed()
        except Exception as e:  # noqa: BLE001 - the user's OOM is what must surface, not ours
            warnings.warn(f"phasemem: could not dump the out-of-memory ({type(e).__name__}: {e})",
                          RuntimeWarning, stacklevel=2)
