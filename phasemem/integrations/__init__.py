"""Trainer callbacks that record some steps of a training run and write phasemem's files per rank.

- ``phasemem.integrations.huggingface.PhasememCallback``: a ``transformers.TrainerCallback``
  (``pip install 'phasemem[hf]'``);
- ``phasemem.integrations.lightning.PhasememCallback``: a ``lightning.pytorch.Callback`` (or, where only
  the standalone package is installed, a ``pytorch_lightning.Callback``; ``pip install 'phasemem[lightning]'``).

Neither framework is a dependency of phasemem (what the two share, and how: docs/integrations.md).

Example:
    >>> from phasemem.integrations.huggingface import PhasememCallback
    >>> Trainer(model, args, train_dataset=data, callbacks=[PhasememCallback(steps="10-12")]).train()
"""
from __future__ import annotations

import importlib

from ..errors import PhasememError


class MissingExtra(PhasememError, ImportError):
    """The framework an integration is for is not installed."""


def require(module: str, extra: str, what: str):
    """Import ``module`` or raise MissingExtra naming the extra that installs it.

    Example:
        >>> transformers = require("transformers", "hf", "phasemem.integrations.huggingface")
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtra(f"{what} needs {module.split('.')[0]}, which is not installed ({e}); "
                           f"install it with: pip install 'phasemem[{extra}]'") from None
