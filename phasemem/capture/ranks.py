"""One recording per rank of a ``torch.distributed`` job: which rank and device this process is, the
file each rank writes, and the gather of per-rank summaries for ``run.report(gather=True)``.

Nothing here waits on another rank except ``all_gather``, so a rank that dies cannot hang the others
(docs/distributed.md).

Example:
    >>> with instrument(ddp_model, opt) as run:     # inside an initialised process group
    ...     train(3)
    >>> run.save("mem/")                             # mem/rank{r}.pickle.xz and mem/rank{r}.json
    >>> run.report(gather=True)                      # every rank: the RunReport of all of them
"""
from __future__ import annotations

import os
import re
from typing import Any

#: What ``run.save(folder)`` names each rank's files: the snapshot, and its report as JSON.
RANK_SNAPSHOT = "rank{rank}.pickle.xz"
RANK_JSON = "rank{rank}.json"
#: What ``ranked_path`` keeps at the end of a name (the rank goes before it): the suffixes that
#: ``run.save`` compresses by and ``phasemem analyze`` reads.
_KEPT_SUFFIXES = (".pickle.xz", ".pkl.xz", ".pickle.gz", ".pkl.gz", ".pickle", ".pkl", ".xz", ".gz")
_RANK_WORD = re.compile(r"rank[_-]?(\d+)", re.I)


def _dist() -> Any:
    # torch.distributed is imported only when a run asks about ranks (capture is torch's floor).
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def describe() -> dict:
    """This process's place in the job for ``snapshot["phasemem"]``: ``rank``, ``world_size``,
    ``backend`` and ``local_rank`` (from ``LOCAL_RANK``, as torchrun sets it); {} outside a process group.

    Example:
        >>> describe()
        {'rank': 1, 'world_size': 2, 'backend': 'gloo', 'local_rank': 1}
    """
    dist = _dist()
    if dist is None:
        return {}
    local = os.environ.get("LOCAL_RANK", "")
    return {"rank": int(dist.get_rank()), "world_size": int(dist.get_world_size()),
            "backend": str(dist.get_backend()), "local_rank": int(local) if local.isdigit() else None}


def rank_device(model: Any) -> Any:
    """The device this rank trains on, for ``instrument(device=None)`` inside a process group: that of
    the model's first parameter or buffer (each rank put its model on its own device; FSDP2's DTensor
    parameters report their shard's). None outside a process group, or with nothing to read, so the
    single-process default (the current CUDA device, else the CPU) stays.

    Example:
        >>> rank_device(ddp_model)
        device(type='cuda', index=1)
    """
    if _dist() is None or model is None:
        return None
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return None


def is_folder(path: str | os.PathLike) -> bool:
    """Whether ``run.save(path)`` means a folder of per-rank files: an existing folder, or a path
    ending in a separator (made if missing)."""
    text = os.fspath(path)
    return os.path.isdir(text) or text.endswith((os.sep, "/"))


def ranked_path(path: str | os.PathLike, meta: dict) -> str:
    """Where ``run.save(path)`` writes a file: ``path`` itself, or, for one rank of a job of several
    ranks (``meta``'s ``rank`` and ``world_size``, else the live process group's), ``path`` with
    ``.rank{r}`` before its pickle/compression suffix; a name that already says ``rank{r}`` is kept.

    Example:
        >>> ranked_path("mem.pkl.xz", {"rank": 1, "world_size": 2}), ranked_path("mem", {"rank": 0, "world_size": 2})
        ('mem.rank1.pkl.xz', 'mem.rank0')
    """
    path = os.fspath(path)
    where = meta if meta.get("world_size") is not None else describe()
    rank, world = where.get("rank"), where.get("world_size")
    if rank is None or not world or int(world) <= 1:
        return path
    folder, base = os.path.split(path)
    if any(int(m.group(1)) == int(rank) for m in _RANK_WORD.finditer(base)):
        return path
    suffix = next((s for s in _KEPT_SUFFIXES if base.lower().endswith(s) and len(base) > len(s)), "")
    stem = base[:len(base) - len(suffix)]
    return os.path.join(folder, f"{stem}.rank{int(rank)}{base[len(stem):]}")


def save_rank(run: Any, folder: str | os.PathLike) -> str:
    """Write this rank's snapshot (``rank{r}.pickle.xz``) into ``folder``; returns its path. Outside a
    process group the rank is 0.

    Example:
        >>> save_rank(run, "mem/")
        'mem/rank1.pickle.xz'
    """
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)  # every rank may make it; exist_ok makes that race harmless
    return run._write(os.path.join(folder, RANK_SNAPSHOT.format(rank=rank_of(run.snapshot))))


def rank_of(snapshot: dict | None) -> int:
    """The rank a snapshot was recorded on (0 outside a process group), which names its files."""
    return int(((snapshot or {}).get("phasemem") or {}).get("rank", 0))


def all_gather(mine: Any) -> list:
    """Every rank's ``mine`` (a summary of a few KiB, never a trace), gathered with
    ``all_gather_object``, in rank order, on every rank; ``[mine]`` outside a process group. Every rank
    must call it (it is a collective).

    Example:
        >>> all_gather(summarize(run.report(), rank=0))    # what run.report(gather=True) does
    """
    dist = _dist()
    if dist is None:
        return [mine]
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every
