"""The remedies and scalings a what-if replays, each a function of what the trace shows: it takes
``Facts`` and returns a ``Change`` or the reason it does not apply (thresholds: docs/what-if.md).

Example:
    >>> f = Facts(report.analysis, report.patterns)          # phasemem.predictions.blocks
    >>> REMEDIES["chunked_cross_entropy"](f, chunks=8).size  # each block's size with the loss chunked
    >>> SCALINGS["batch_x2"](f).size                        # ... at twice the batch
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable

from ..scaling import BATCH_FACTORS, SEQ_FACTORS
from .checkpointing import _activation_checkpointing
from .cross_entropy import _bf16_logits, _chunked_cross_entropy
from .optimizer_step import _fused_optimizer, _smaller_optimizer_state, _zero_grad_before_forward
from .per_token import _scale

#: The remedies, by name (what ``--what-if`` prints and the JSON's "remedy" says).
REMEDIES: dict[str, Callable[..., Any]] = {
    "fused_optimizer": _fused_optimizer,
    "chunked_cross_entropy": _chunked_cross_entropy,
    "bf16_logits": _bf16_logits,
    "zero_grad_before_forward": _zero_grad_before_forward,
    "activation_checkpointing": _activation_checkpointing,
    "smaller_optimizer_state": _smaller_optimizer_state,
}
#: The scalings, replayed as the remedies are (issue 30): batch_x0.5 ... seq_x4.
SCALINGS: dict[str, Callable[..., Any]] = {**{f"batch_x{b:g}": partial(_scale, batch=b) for b in BATCH_FACTORS},
            **{f"seq_x{q:g}": partial(_scale, seq=q) for q in SEQ_FACTORS}}
