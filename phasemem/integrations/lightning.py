"""``PhasememCallback`` for Lightning: records some steps of ``trainer.fit()``.

Each rank (``trainer.global_rank``) writes its own ``rank<r>.*`` files into ``output_dir`` (default
``<default_root_dir>/phasemem``); the headline numbers go to every ``trainer.loggers``. Which forwards
it marks, and when the window opens and closes: docs/integrations.md.

Example:
    >>> from phasemem.integrations.lightning import PhasememCallback
    >>> L.Trainer(max_steps=20, callbacks=[PhasememCallback(steps="10-12")]).fit(module, loader)
"""
from __future__ import annotations

import os
from typing import Any

from . import MissingExtra, require
from .recorder import DEFAULT_FORMATS, DEFAULT_STEPS, Recorder


def _callback_base() -> type:
    try:
        return require("lightning.pytorch", "lightning", "phasemem.integrations.lightning").Callback
    except MissingExtra as missing:
        try:  # the standalone package is the same framework under its older name
            return require("pytorch_lightning", "lightning", "phasemem.integrations.lightning").Callback
        except MissingExtra:
            raise missing from None


class PhasememCallback(_callback_base()):  # type: ignore[misc]  # lightning's Callback, found at import
    """Record ``steps`` of ``Trainer.fit()`` and write the snapshot, picture and JSON per rank.

    ``steps``: "10-12", "10" or "10-" (to the end), counted from 0 like ``trainer.global_step``
    (default ``"3-5"``, after warm-up). ``output_dir``: the folder (default ``<default_root_dir>/phasemem``).
    ``formats``: any of "snapshot", "png", "json", "txt". ``oom_dump``: an out-of-memory inside the window
    writes ``oom_rank<r>.pickle.xz``/``.json``/``.png`` there. ``model``: the module whose forward to
    mark, where it is neither the LightningModule nor one of its direct children.

    Example:
        >>> L.Trainer(..., callbacks=[PhasememCallback(steps="5000-5002", formats=("snapshot", "png"))])
    """

    def __init__(self, steps: Any = DEFAULT_STEPS, output_dir: Any = None, formats: Any = DEFAULT_FORMATS, *,
                 oom_dump: bool = True, model: Any = None, max_entries: int = 1_000_000,
                 stacks: str | None = "python") -> None:
        self.recorder = Recorder(steps, output_dir, formats, oom_dump=oom_dump, max_entries=max_entries,
                                 stacks=stacks)
        self.model = model

    @property
    def files(self) -> list[str]:
        """The files this rank wrote (empty until the window closed)."""
        return self.recorder.files

    def on_train_start(self, trainer, pl_module) -> None:
        from ..capture.hooks import hook_forward  # capture imports torch, which Lightning has loaded

        target = self.model if self.model is not None else pl_module
        children = [] if self.model is not None else _parameter_children(pl_module)
        self.recorder.begin(target, trainer.optimizers, done=trainer.global_step, rank=trainer.global_rank,
                            default_dir=os.path.join(trainer.default_root_dir or ".", "phasemem"),
                            hooks=tuple((lambda c=c: hook_forward(c)) for c in children))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        _log(trainer, self.recorder.boundary(trainer.global_step))

    def on_train_end(self, trainer, pl_module) -> None:
        _log(trainer, self.recorder.end(trainer.global_step))

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self.recorder.failed(exception)


def _parameter_children(module: Any) -> list:
    return [c for c in module.children() if next(c.parameters(), None) is not None]


def _log(trainer: Any, metrics: dict | None) -> None:
    # Not pl_module.log_dict: Lightning sends a step's logged values to its loggers only on a
    # log_every_n_steps step and drops them otherwise, so the window's numbers would mostly be lost.
    if not metrics:
        return
    for logger in getattr(trainer, "loggers", None) or ():
        logger.log_metrics(dict(metrics), step=trainer.global_step)
    try:
        import torch  # loaded already: callback_metrics holds tensors

        trainer.callback_metrics.update({k: torch.tensor(v, dtype=torch.float64) for k, v in metrics.items()})
    except (AttributeError, TypeError):  # a trainer without callback_metrics: the loggers have them
        pass
