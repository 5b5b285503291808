"""``PhasememCallback`` for the Hugging Face ``Trainer``: records some steps of ``trainer.train()``.

Each rank (``args.process_index``) writes its own ``rank<r>.*`` files into ``output_dir`` (default
``<args.output_dir>/phasemem``); the headline numbers go through ``Trainer.log``. How it finds the
model and optimizer, and when the window opens and closes: docs/integrations.md.

Example:
    >>> from phasemem.integrations.huggingface import PhasememCallback
    >>> trainer = Trainer(model, args, train_dataset=data, callbacks=[PhasememCallback(steps="10-12")])
    >>> trainer.train()   # writes <output_dir>/phasemem/rank0.pickle.xz, rank0.png, rank0.json
"""
from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Any

from . import require
from .recorder import DEFAULT_FORMATS, DEFAULT_STEPS, Recorder

transformers = require("transformers", "hf", "phasemem.integrations.huggingface")

#: How many frames up from a callback the Trainer is looked for: CallbackHandler.call_event, the
#: handler's on_<event>, then the Trainer's method (``_inner_training_loop`` or ``_run_epoch``).
TRAINER_FRAMES = 8


class PhasememCallback(transformers.TrainerCallback):  # type: ignore[name-defined]  # imported by require()
    """Record ``steps`` of ``Trainer.train()`` and write the snapshot, picture and JSON per rank.

    ``steps``: "10-12", "10" or "10-" (to the end), counted from 0 like ``state.global_step``
    (default ``"3-5"``, after warm-up). ``output_dir``: the folder (default ``<args.output_dir>/phasemem``).
    ``formats``: any of "snapshot", "png", "json", "txt". ``oom_dump``: an out-of-memory inside the window
    writes ``oom_rank<r>.pickle.xz``/``.json``/``.png`` there (CUDA). ``trainer``: where the callback
    cannot find the Trainer that calls it (a custom loop calling the callbacks), the one to log through.

    Example:
        >>> Trainer(..., callbacks=[PhasememCallback(steps="5000-5002", formats=("snapshot", "png"))])
    """

    def __init__(self, steps: Any = DEFAULT_STEPS, output_dir: Any = None, formats: Any = DEFAULT_FORMATS, *,
                 oom_dump: bool = True, trainer: Any = None, max_entries: int = 1_000_000,
                 stacks: str | None = "python") -> None:
        self.recorder = Recorder(steps, output_dir, formats, oom_dump=oom_dump, max_entries=max_entries,
                                 stacks=stacks)
        self.trainer = trainer

    @property
    def files(self) -> list[str]:
        """The files this rank wrote (empty until the window closed)."""
        return self.recorder.files

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.trainer = self.trainer or _calling_trainer()
        self.recorder.begin(_forward_module(self.trainer, model), _real_optimizers(optimizer),
                            done=state.global_step, rank=args.process_index,
                            default_dir=os.path.join(args.output_dir or ".", "phasemem"))

    def on_step_end(self, args, state, control, **kwargs):
        self._log(self.recorder.boundary(state.global_step), state)

    def on_train_end(self, args, state, control, **kwargs):
        self._log(self.recorder.end(state.global_step), state)

    def _log(self, metrics: dict | None, state) -> None:
        if not metrics:
            return
        if self.trainer is not None and hasattr(self.trainer, "log"):
            self.trainer.log(dict(metrics))
        else:  # no Trainer to call: at least the history the Trainer keeps
            state.log_history.append({**metrics, "step": state.global_step})


def _calling_trainer() -> Any:
    # A TrainerCallback is handed the model, optimizer and data, never the Trainer; its log() is what
    # sends numbers to every report_to logger, so the Trainer is found among the callers' frames.
    frame: FrameType | None = sys._getframe(2)
    for _ in range(TRAINER_FRAMES):
        if frame is None:
            break
        obj = frame.f_locals.get("self")
        if isinstance(obj, transformers.Trainer):
            return obj
        frame = frame.f_back
    return None


def _forward_module(trainer: Any, model: Any) -> Any:
    """The module whose forward is marked: the compiled wrapper when the Trainer compiled the model
    (its forward runs in eager and encloses the compiled graph), else the model the Trainer trains."""
    wrapped = getattr(trainer, "model_wrapped", None)
    if wrapped is not None and hasattr(wrapped, "_orig_mod"):  # torch._dynamo's OptimizedModule
        return wrapped
    return model


def _real_optimizers(optimizer: Any) -> list:
    if optimizer is None:
        return []
    # accelerate's AcceleratedOptimizer calls the real optimizer's step(); that is what gets the markers.
    inner = getattr(optimizer, "optimizer", None)
    return [inner if inner is not None and hasattr(inner, "param_groups") else optimizer]
