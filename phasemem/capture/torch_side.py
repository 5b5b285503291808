"""What ``instrument()`` asks of torch: the device to record, the optimizers to mark, the tensors alive
when recording starts, and switching the CUDA allocator's history on and off across torch versions."""

from __future__ import annotations

import inspect
from typing import Any, Iterable, Literal, Sequence

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


def record_memory_history(enabled: Literal["state", "all"] | None, **kwargs: Any) -> None:
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


def plain_tensors(t: torch.Tensor, depth: int = 0) -> Iterable[torch.Tensor]:
    """The tensors that own memory behind ``t``: ``t`` itself, or the inner tensors of a wrapper
    subclass (FSDP2's ``DTensor`` parameters hold their shard in ``_local_tensor`` and have no storage
    of their own)."""
    flatten = getattr(t, "__tensor_flatten__", None)
    if flatten is None or depth > 4:
        yield t
        return
    try:
        names, _ = flatten()
    except Exception:  # noqa: BLE001 -- an odd subclass is skipped, never a failed recording
        return
    for name in names:
        inner = getattr(t, name, None)
        if isinstance(inner, torch.Tensor):
            yield from plain_tensors(inner, depth + 1)


def tensor_bytes(model: torch.nn.Module | None, opts: Sequence[torch.optim.Optimizer], device: str) -> dict[str, int]:
    """Bytes of the parameters, their gradients and the optimizers' state on ``device`` now, each storage
    counted once (FSDP2's DTensors by their local shards): what the program itself holds, for the
    snapshot's metadata. A trace cannot always tell these apart (optimizer state made before the
    recording looks like parameters); the program can.

    Example:
        >>> tensor_bytes(model, [opt], "cuda:0")
        {'parameters': 568655872, 'gradients': 568655872, 'optimizer_state': 1137311752}
    """
    want = torch.device(device)
    seen: set[int] = set()

    def total(tensors: Iterable[torch.Tensor | None]) -> int:
        n = 0
        for outer in tensors:
            if not isinstance(outer, torch.Tensor):
                continue
            for t in plain_tensors(outer):
                if t.device.type != want.type or (want.index is not None and t.device.index != want.index):
                    continue
                try:
                    storage = t.untyped_storage()
                    ptr, nbytes = storage.data_ptr(), storage.nbytes()
                except (RuntimeError, NotImplementedError):
                    continue
                if ptr and ptr not in seen:
                    seen.add(ptr)
                    n += nbytes
        return n

    params = list(model.parameters()) if model is not None else []
    params += [p for opt in opts for g in opt.param_groups for p in g["params"]]
    return {"parameters": total(params), "gradients": total(p.grad for p in params),
            "optimizer_state": total(v for opt in opts for st in opt.state.values() for v in st.values())}


def parameter_table(model: torch.nn.Module | None, opts: Sequence[torch.optim.Optimizer]) -> list[list]:
    """Each parameter as ``[name, shape, dtype, requires_grad]`` (the full shape of a DTensor): what a
    parallel plan needs and a trace cannot say (which blocks are layers, the parameters' dtype).

    Example:
        >>> parameter_table(nn.Linear(4, 2), [])
        [['weight', [2, 4], 'float32', True], ['bias', [2], 'float32', True]]
    """
    rows, seen = [], set()
    named = list(model.named_parameters()) if model is not None else []
    named += [(f"optimizer.{i}.{j}", p) for i, opt in enumerate(opts)
              for g in opt.param_groups for j, p in enumerate(g["params"])]
    for name, p in named:
        if id(p) in seen or not isinstance(p, torch.Tensor):
            continue
        seen.add(id(p))
        rows.append([name, [int(d) for d in p.shape], str(p.dtype).replace("torch.", ""), bool(p.requires_grad)])
    return rows
