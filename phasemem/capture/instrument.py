"""``Recording``: the allocator recorded around a training loop, with phase markers, as a snapshot dict.
``phasemem.instrument()`` makes one (``phasemem.run.Run``, which adds the report); capture gives the
snapshot only, so nothing here imports the analysis."""

from __future__ import annotations

import gzip
import lzma
import os
import pickle
import tempfile
import threading
import time
import warnings
from typing import Any, Callable, Literal

import torch

from ..errors import PhasememError
from . import cpu, lost, ranks
from .hooks import MARKERS, PREFIX, hook_forward, hook_optimizer, patch_backward, wrap_method
from .torch_side import (
    history_enabled,
    live_tensors,
    parameter_table,
    real_optimizers,
    record_memory_history,
    resolve_device,
    tensor_bytes,
)
from .window import StepWindow


def _error(msg: str) -> Exception:
    return PhasememError(msg)


# The phasemem CUDA runs now recording, outermost first. A run started while another records does not
# touch the recorder (its settings stay the outer run's); the last one out turns recording off when
# the first one in found it off.
_CUDA_RUNS: list["Recording"] = []
_CUDA_TURN_OFF = [False]


class Recording:
    """One recording; ``with`` hands back the same object. ``phasemem.instrument()`` returns a
    ``phasemem.run.Run``, this with its report.

    After the block: ``run.snapshot`` is the snapshot dict (plain Python types, loadable without torch),
    ``run.save(path)`` writes it (``.xz``/``.gz`` compress).
    """

    def __init__(
        self,
        model: torch.nn.Module | None,
        optimizer: Any = None,
        *,
        device: Any = None,
        max_entries: int = 1_000_000,
        stacks: str | None = "python",
        oom_dump: str | os.PathLike | None = None,
        steps: Any = None,
    ) -> None:
        # A bad range fails here, where the user wrote it, not thousands of steps later.
        self._window = steps if isinstance(steps, StepWindow) or steps is None else StepWindow(steps)
        self._model = model
        self.oom_dump = os.fspath(oom_dump) if oom_dump is not None else None
        self._opts = real_optimizers(optimizer)
        self._device_arg = device
        self.max_entries = int(max_entries)
        self.stacks = stacks
        self.device: str | None = None
        self.source: str | None = None
        self.snapshot: dict | None = None
        self._failure = ""  # why the snapshot could not be taken, when it could not
        self._markers = MARKERS  # shared by all runs, as the hooks are (hooks.py)
        self._mark = 0
        self._calls_before: dict = {}
        self._home = 0  # the thread that started the recording
        self.lost: list[dict] = []  # phases the recording lost (capture/lost.py); [] when it holds them all
        self.nested = False
        self._undo: list[Callable[[], None]] = []
        self._prof: Any = None
        self._was_recording: bool | None = None
        self._t0_us = 0
        self._state = "new"
        # Record every thread's record_function ranges, not only this thread's; measured no dearer
        # than the calling thread's alone (docs/performance.md, run 4), see docs/capture.md.
        self.global_annotations = True

    # -- context manager -------------------------------------------------------------------
    def __enter__(self) -> "Recording":
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        recording = self._state == "running"  # an OOM outside a step window left nothing to dump
        self.stop(failed=exc_type is not None)
        if self.oom_dump and recording and isinstance(exc, torch.OutOfMemoryError):
            self._dump_oom()
        return False

    def _dump_oom(self) -> None:
        """Write the snapshot to ``oom_dump`` and what ``_dump_beside`` adds beside it; the OOM is
        re-raised by the caller whatever happens here, so a failure to dump is only a warning."""
        assert self.oom_dump is not None  # __exit__ calls this only with oom_dump set
        try:
            # Beside the file save() wrote: on one rank of several that name carries the rank, so the
            # ranks' reports and pictures do not overwrite each other either.
            written = self.save(self.oom_dump)
            stem = written[:-3] if written.endswith((".xz", ".gz")) else written
            stem = os.path.splitext(stem)[0]
            what = self._dump_beside(stem)
            warnings.warn(f"phasemem: out of memory; {what} written to {stem}.*", stacklevel=3)
        except Exception as e:  # noqa: BLE001 - never replace the user's OOM with our error
            warnings.warn(f"phasemem: could not write the OOM dump to {self.oom_dump}: {e}", stacklevel=3)

    def _dump_beside(self, stem: str) -> str:
        """What an OOM dump writes beside the snapshot (``stem`` + suffix), in words for its warning:
        nothing more here; ``phasemem.run.Run`` adds the report and its picture."""
        return "snapshot"

    def start(self) -> "Recording":
        if self._state != "new":
            raise _error("this instrument() run was already started; make a new one per recording")
        if self._window is not None:
            resolve_device(self._device_arg)  # a bad device fails now, not when the window opens
            self._state = "waiting"
            # Counts steps; calls _begin() when the window opens (at once for step 0) and stop() after it.
            self._window.arm(self, self._opts, self._model)
            return self
        return self._begin()

    def _begin(self) -> "Recording":
        self._state = "running"
        # In a process group each rank records its own device: the one its model is on.
        dev = resolve_device(self._device_arg if self._device_arg is not None else ranks.rank_device(self._model))
        self.device = f"cuda:{dev.index}" if dev.type == "cuda" else "cpu"
        self.source = "cuda" if dev.type == "cuda" else "cpu-profiler"
        try:
            self._t0_us = time.time_ns() // 1000
            self._mark = self._markers.mark()
            self._calls_before, self._home = self._markers.calls(), threading.get_ident()
            if dev.type == "cuda":
                self._start_cuda()
            else:
                self._start_cpu()
            self._install()
        except BaseException:
            self._teardown(take_snapshot=False)
            raise
        return self

    def stop(self, failed: bool = False) -> None:
        """End the recording; ``failed`` says the block raised, so cleanup errors must not mask it."""
        if self._state == "waiting":
            assert self._window is not None  # only a step window waits
            self._window.block_ended(self)
        if self._state != "running":
            return
        errors = self._teardown(take_snapshot=True)
        if self._window is not None:  # after the hooks: one wrapped over the step counter is gone by now
            self._window.close()
        if self.lost and not failed:
            warnings.warn(f"phasemem: {lost.sentence(self.lost)}", RuntimeWarning, stacklevel=3)
        if errors and not failed:
            first = errors[0]
            if not isinstance(first, Exception):  # KeyboardInterrupt/SystemExit are the user's: pass them on
                raise first
            # The training inside the block has finished by now; raising here would kill the job at
            # its next line (often the checkpoint save) over a recording problem.
            self._failure = f"{type(first).__name__}: {first}"
            warnings.warn(f"phasemem: the recording could not be finished ({self._failure}); the training run "
                          "is unaffected, but this block has no snapshot or report", RuntimeWarning, stacklevel=3)

    # -- recording -------------------------------------------------------------------------
    def _start_cuda(self) -> None:
        torch.cuda.init()
        self._was_recording = on = history_enabled()
        outer = _CUDA_RUNS[-1] if _CUDA_RUNS else None
        _CUDA_RUNS.append(self)
        if outer is not None and on is not False:
            # Nested in another instrument() block: its recording goes on untouched (same settings,
            # history not cleared), and the hooks it installed are shared, so no range is doubled.
            self.nested = True
            self.stacks, self.max_entries = outer.stacks, outer.max_entries
            return
        if len(_CUDA_RUNS) == 1 or not on:
            _CUDA_TURN_OFF[0] = not on
        record_memory_history(
            "all",
            # "alloc", not "all": with frees' stacks recorded too, torch 2.11 crashes the backward of
            # non-reentrant activation checkpointing around dropout or cross-entropy (SystemError ...
            # returned NULL without setting an exception; docs/trace.md, fixtures/ckpt_crash.py).
            # The allocations' stacks are what phasemem reads; a free's adds nothing to the markers.
            context="alloc" if self.stacks else None,
            stacks=self.stacks or "python",
            max_entries=self.max_entries,
            # Clearing someone else's ongoing history would destroy their recording.
            clear_history=not on,
            # Markers are also emitted off the main thread (Lightning, autograd reentrancy).
            global_record_annotations=self.global_annotations,
        )

    def _leave_cuda(self) -> None:
        """This run stops recording: the recorder is turned off once no phasemem run records and the
        first of them found it off. (Otherwise it stays on: torch has no getter for the previous
        settings, so a recording that was on before stays on with ours.)"""
        if self in _CUDA_RUNS:
            _CUDA_RUNS.remove(self)
        if not _CUDA_RUNS and _CUDA_TURN_OFF[0]:
            _CUDA_TURN_OFF[0] = False
            record_memory_history(None)

    def _start_cpu(self) -> None:
        if cpu.profiler_enabled():
            raise _error("instrument() on CPU needs torch.profiler, which is already running "
                         "(another instrument() block or a torch.profiler.profile): on CPU, blocks do not nest")
        self._prof = cpu.start_profiler()

    def _finish(self) -> dict:
        assert self.device is not None and self.source is not None  # _install set both before recording
        if self.source == "cuda":
            try:
                torch.cuda.synchronize(self.device)
                snap = torch.cuda.memory._snapshot()
            finally:
                self._leave_cuda()
        else:
            prof, self._prof = self._prof, None
            cpu.stop_profiler(prof)
            snap = cpu.snapshot_from_profiler(prof, live_tensors(self._model, self._opts))
        snap = dict(snap)
        snap["phasemem"] = {
            "device": self.device,
            "source": self.source,
            "torch": str(torch.__version__),
            "markers": PREFIX,
            "window_us": [int(self._t0_us), int(time.time_ns() // 1000)],
            "max_entries": self.max_entries,
            "stacks": self.stacks,
            "recording_was_on": self._was_recording,
            "nested": self.nested,
            **ranks.describe(),  # rank, world_size, backend, local_rank inside a process group
        }
        if self._window is not None:
            snap["phasemem"].update(self._window.meta())
        # What the program holds at the end, by its own tensors: the trace alone cannot tell parameters
        # from optimizer state made before the recording (FSDP2 + fused AdamW on the H200).
        snap["phasemem"]["tensor_bytes"] = tensor_bytes(self._model, self._opts, self.device)
        snap["phasemem"]["parameters"] = parameter_table(self._model, self._opts)
        before = self._calls_before
        calls = {k: n - before.get(k, 0) for k, n in self._markers.calls().items() if n > before.get(k, 0)}
        self.lost = lost.lost(snap, calls, self._home, self.source, self.max_entries)
        snap["phasemem"]["calls"] = {name: sum(n for (m, _), n in calls.items() if m == name)
                                     for name in sorted({m for m, _ in calls})}
        snap["phasemem"]["lost"] = self.lost
        if self.lost:  # the report's first note (analyze.py reads it; the analysis side imports no torch)
            snap["phasemem"]["lost_note"] = lost.sentence(self.lost)
        return snap

    # -- hooks -----------------------------------------------------------------------------
    def _install(self) -> None:
        m = self._markers
        if self._model is not None:
            self._undo.append(hook_forward(self._model, m))
            if hasattr(self._model, "zero_grad"):
                # model.zero_grad() is the other common way to clear grads.
                self._undo.append(wrap_method(self._model, "zero_grad", "zero_grad", m))
        for opt in self._opts:
            self._undo.append(hook_optimizer(opt, m))
        self._undo.append(patch_backward(m))

    def _teardown(self, take_snapshot: bool) -> list[BaseException]:
        """Close markers, take the snapshot, restore the recorder, undo every hook: each step runs
        even when an earlier one failed; the errors come back in order."""
        errors: list[BaseException] = []

        def attempt(fn: Callable[[], Any]) -> Any:
            try:
                return fn()
            except BaseException as e:  # KeyboardInterrupt mid-cleanup must not leave patches behind
                errors.append(e)
                return None

        # ENDs first, so the snapshot holds them (only this run's: an outer run's ranges stay open).
        attempt(lambda: self._markers.close_since(self._mark))
        if take_snapshot:
            self.snapshot = attempt(self._finish)
        else:
            attempt(self._abort_recording)
        while self._undo:
            attempt(self._undo.pop())
        # Dropping the references lets the caller free the model right after the block.
        self._model, self._opts = None, []
        self._state = "done"
        return errors

    def _abort_recording(self) -> None:
        if self._prof is not None:
            prof, self._prof = self._prof, None
            cpu.stop_profiler(prof)
        elif self.source == "cuda":
            self._leave_cuda()

    # -- results ---------------------------------------------------------------------------
    def _need_snapshot(self) -> dict:
        if self.snapshot is None:
            if self._failure:
                raise _error(f"no snapshot: the recording could not be finished ({self._failure})")
            raise _error("no snapshot: the instrument() block has not finished (or capture failed)")
        return self.snapshot

    def save(self, path: str | os.PathLike) -> str:
        """Write the snapshot as a pickle (xz/gzip by suffix), atomically: readers never see half a file;
        returns the path written.

        A folder (one that exists, or a path ending in "/") gets this rank's ``rank{r}.pickle.xz`` (and,
        from ``phasemem.run.Run``, its report's ``rank{r}.json``), with no rank waiting on another.
        Recorded by one rank of several (a process group of world size > 1), a file path gets the rank in
        its name, so that no rank overwrites another's: ``run.save("mem.pkl.xz")`` writes ``mem.rank1.pkl.xz`` on rank 1,
        ``run.save("mem")`` writes ``mem.rank1`` (a name that already says ``rank1`` is kept as it is).

        >>> run.save("mem/")          # mem/rank{r}.pickle.xz + mem/rank{r}.json: phasemem analyze mem/
        >>> run.save("step.pkl.xz")   # one process: step.pkl.xz; rank 3 of 8: step.rank3.pkl.xz
        """
        snap = self._need_snapshot()
        if ranks.is_folder(path):
            return ranks.save_rank(self, path)
        return self._write(ranks.ranked_path(path, snap.get("phasemem") or {}))

    def _write(self, path: str | os.PathLike) -> str:
        snap = self._need_snapshot()
        path = os.fspath(path)
        data = pickle.dumps(snap, protocol=4)
        if path.endswith(".xz"):
            data = lzma.compress(data)
        elif path.endswith(".gz"):
            data = gzip.compress(data)
        folder = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".phasemem-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return path
