"""What ``instrument()`` asks of torch: the device to record, the optimizers to mark, the tensors alive
when recording starts, and switching the CUDA allocator's history on and off across torch versions."""

from __future__ import annotations

import inspect
from typing import Any, Iterable, Sequence

import torch

from ..errors import PhasememError


def resolve_device(device: Any) -> torch.device:
    if device is None:
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
    d = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise PhasememError(f"instrument(device={device!r}): CUDA is not available")
        if d.index is None:
            d = torch.device("cuda", torch.cuda.current_device())
    elif d.type != "cpu":
        raise PhasememError(f"instrument(device={device!r}): only cuda and cpu are supported")
    return d


def history_enabled() -> bool | None:
    """Whether the CUDA allocator is recording now; None where this torch cannot tell."""
    probe = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    return bool(probe()) if probe is not None else None


def record_memory_history(enabled: str | None, **kwargs: Any) -> None:
    mem = torch.cuda.memory
    # Since torch 2.x the public function is ``(enabled, *args, **kwargs)`` dispatching to
    # ``_record_memory_history_impl``; the impl's signature says which keywords this torch knows
    # (``clear_history`` and ``global_record_annotations`` are newer than torch 2.4).
    target = getattr(mem, "_record_memory_history_impl", mem._record_memory_history)
    params = inspect.signature(target).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    mem._record_memory_history(enabled, **kwargs)


def real_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    if optimizer is None:
        return []
    items = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
    unique: dict[int, Any] = {}
    for opt in items:
        # Lightning's LightningOptimizer wraps the real one; markers belong on the real instance,
        # which is what the precision plugins call.
        opt = getattr(opt, "_optimizer", opt)
        unique.setdefault(id(opt), opt)
    return list(unique.values())


def live_tensors(model: torch.nn.Module | None, opts: Sequence[torch.optim.Optimizer]) -> Iterable[torch.Tensor]:
    if model is not None:
        for p in model.parameters():
            yield p
            if p.grad is not None:
                yield p.grad
        yield from model.buffers()
    for opt in opts:
        for group in opt.param_groups:
            for p in group["params"]:
                yield p
                if p.grad is not None:
                    yield p.grad
        for state in opt.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    yield v
