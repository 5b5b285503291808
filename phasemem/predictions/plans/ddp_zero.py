"""DDP's buckets and ZeRO's share of the optimizer state (stage 1) and of the gradients (stage 2), as
changes of a one-GPU trace's blocks."""
from __future__ import annotations

import numpy as np

from ...units import format_bytes
from ...vocab import C
from ..blocks import Facts
from .params import Params, owned_share, round_block, zero_owner

#: DDP's buckets: the first holds at most 1 MiB, the others 25 MiB (torch's defaults).
DDP_FIRST_BUCKET, DDP_BUCKET = 1 << 20, 25 << 20


def _ddp_buckets(params: Params) -> list[int]:
    """DDP's buckets' sizes: the trainable parameters' gradients, in reverse order, filled up to 1 MiB
    for the first bucket and 25 MiB after (a parameter larger than a bucket gets one of its own)."""
    out, cur, cap = [], 0, DDP_FIRST_BUCKET
    for b in params.bytes[params.trainable][::-1]:
        cur += int(b)
        if cur >= cap:
            out.append(cur)
            cur, cap = 0, DDP_BUCKET
    if cur:
        out.append(cur)
    return out


def _grads_of(f: Facts) -> np.ndarray:
    return np.flatnonzero((f.cat == C["gradient"]) & (f.alloc >= 0))


def ddp(f, steps, params, ranks, rank, st, ch, add) -> list[str]:
    for b in _ddp_buckets(params):
        add.add(-1, f.n, int(round_block(b)), "ddp_buckets")
    total = int(round_block(params.bytes[params.trainable].sum()))
    second = steps[1] if len(steps) > 1 else (steps[0] if steps else None)
    if st.get("rebuild_buckets", True) and second is not None and second.forward is not None:
        end = second.backward[1] if second.backward else second.forward[1]
        if st.get("bucket_view") and len(second.grads):  # the first gradient copied in lets the old set go
            end = int(f.alloc[second.grads[0]])
        add.add(second.forward[0], end, total, "ddp_buckets")
    notes = [f"DDP's buckets hold a copy of every gradient ({format_bytes(total)}), made when the model is wrapped; "
             "after the first iteration DDP builds them again in the order the gradients came, and the first set "
             "may live through the next iteration (torch 2.11): one more copy for that iteration"]
    if st.get("bucket_view"):
        g = _grads_of(f)
        ch.free[g] = np.minimum(ch.free[g], f.alloc[g] + 1)
        notes.append("gradient_as_bucket_view: each gradient is copied into its bucket as soon as it is made, "
                     "and .grad is a view of the bucket")
    return notes


def _optimizer_share(f, params, owned, ch) -> None:
    """ZeRO: only the state (and the update's temporaries) of the parameters a rank owns."""
    state = np.flatnonzero(f.cat == C["optimizer_state"])
    keep = owned_share(state, f, params, owned)
    ch.size[state] = np.round(f.size[state] * keep).astype(np.int64)
    temps = f.members("optimizer_temporaries")
    if len(temps):
        keep = owned_share(temps, f, params, owned)
        ch.size[temps] = np.round(f.size[temps] * keep).astype(np.int64)


def zero(f, steps, params, ranks, rank, st, ch, add, stage: int) -> list[str]:
    owner = zero_owner(np.where(params.trainable, params.bytes, 0), ranks)
    owned = (owner == rank) & params.trainable
    _optimizer_share(f, params, owned, ch)
    mine = int(params.bytes[owned].sum())
    notes = [f"ZeroRedundancyOptimizer gives rank {rank} {int(owned.sum())} of {int(params.trainable.sum())} "
             f"parameters ({format_bytes(mine)}, largest first to the rank holding least): their optimizer state only"]
    if stage == 1:
        notes += ddp(f, steps, params, ranks, rank, st, ch, add)
        return notes
    for s in steps:  # ZeRO-2: a gradient the rank does not own is reduced and dropped as soon as it is made
        if not len(s.grads):
            continue
        keep = owned_share(s.grads, f, params, owned) > 0.5
        gone = s.grads[~keep]
        ch.free[gone] = np.minimum(ch.free[gone], f.alloc[gone] + 1)
    notes.append("ZeRO-2: each gradient the rank does not own is freed as soon as it is reduced (DeepSpeed's "
                 "reduce bucket not counted)")
    return notes


