"""Snapshots other people recorded and published (../shared/wild, never committed), and what each
program did, read from its source at the commit ../shared/wild/SOURCES.md names (docs/wild.md has one
row per file). The tests that read them skip where ../shared/wild is absent."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers.analyses import analyzed
from helpers.paths import WILD

LM_SHAPES = {"logits", "softmax_spike", "logits_release"}
OPTIMIZER_SHAPES = {"optimizer_state_init", "optimizer_temporaries"}

# What each program did, from its source (docs/wild.md): forward, backward, optimizer, vocabulary-sized
# cross-entropy, and the logits' size where the source gives batch × context × vocabulary × bytes.
PROGRAMS = {
    "magma27_cs336": dict(backward=True, optimizer=False, ce=True, logits=32 * 256 * 10000 * 4),
    "bcrafton_cs336": dict(backward=True, optimizer=True, ce=True, logits=1 * 64 * 50257 * 4, rebinds_state=True),
    "wedsonlin_medium512_train": dict(backward=True, optimizer=True, ce=True, rebinds_state=True),
    "kkaitlyn_ctx128_fullstep": dict(backward=True, optimizer=True, ce=True, state_created=True),
    "nothanmin_cs336": dict(backward=True, optimizer=True, ce=False),  # loss = logits.sum()
    "cranberrii_ftcourse": dict(backward=True, optimizer=False, ce=True),
    "silmont_mem_snapshot": dict(backward=True, optimizer=False, ce=False),  # toy attention, .sum()
    "silmont_memory_forward_bf16_128": dict(backward=False, optimizer=False, ce=False),
    "silmont_memory_forward_fp32_128": dict(backward=False, optimizer=False, ce=False),
    "kkaitlyn_ctx256_forward_mixed": dict(backward=False, optimizer=False, ce=False),
    "octreenca_mysnap": dict(backward=False, optimizer=False, ce=False),  # a cellular automaton
    "sqattn_cuda": dict(backward=False, optimizer=False, ce=False),  # layer-by-layer calibration
}


def wild_path(name: str) -> Path:
    p = WILD / f"{name}.pickle"
    if not p.exists():
        pytest.skip(f"{p} is not here (../shared/wild is never committed)")
    return p


def wild_report(name: str):
    """The published file analysed as a user would (``phasemem.analyze(path)``), once a session."""
    return analyzed(wild_path(name), "file")
