"""What a plan changes: the trace's blocks resized and re-timed, and the wrapper's own blocks added
(DDP's buckets, FSDP2's gathered layers and buffers), each with its role and the category it counts in."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..blocks import Change, Facts
from .params import Params

#: Which category each of the wrapper's own blocks counts as in a plan's categories.
ROLE_CATEGORY = {"ddp_buckets": "gradient", "unsharded_parameters": "parameter", "all_gather_buffers": "parameter",
                 "reduce_scatter_buffers": "gradient", "sharded_gradients": "gradient"}
ROLES = tuple(ROLE_CATEGORY)


class Added:
    """Blocks a plan adds: alloc event, free event, size, role (a ROLES position)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int, int]] = []

    def add(self, alloc: int, free: int, size: int, role: str) -> None:
        if size > 0 and free > alloc:
            self.rows.append((int(alloc), int(free), int(size), ROLES.index(role)))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if not self.rows:
            z = np.zeros(0, np.int64)
            return z, z, z, z
        a = np.array(self.rows, np.int64)
        return a[:, 0], a[:, 1], a[:, 2], a[:, 3]


@dataclass
class PlanChange:
    """A plan as a change of the trace's blocks (``Change``: sizes, frees, added blocks, all constant
    in the batch) with the role of each added block and the notes that say what was assumed."""

    facts: Facts
    change: Change
    roles: np.ndarray
    notes: list[str]
    params: Params
    low: np.ndarray | None  # blocks halved too in the lower reading (None: one reading)
