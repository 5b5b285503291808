"""Held-out set 12 (fixtures/heldout12, fixtures/record_heldout12.py): inference whose KV caches, and
whose weights, are made inside the recording. Truth from the raw snapshot: the blocks made before the
first gt::step and kept to the end, split by the code their stacks name."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers.analyses import marked_and_plain
from helpers.snapshots import recording

ROOT = Path(__file__).resolve().parents[1]
HELDOUT12 = ROOT / "fixtures" / "heldout12"


def _made_before_steps_and_kept(snap: dict, where: str) -> int:
    """Bytes of the blocks allocated before the first gt::step range, alive at the end, whose stack
    runs through a file containing ``where``."""
    start = min(a["time_us"] for a in snap["external_annotations"]
                if a["name"].startswith("gt::step") and a["stage"] == "START")
    alive = {}
    for e in snap["device_traces"][0]:
        if e["action"] == "alloc":
            alive[e["addr"]] = e
        elif e["action"] == "free_completed":
            alive.pop(e["addr"], None)
    return sum(e["size"] for e in alive.values() if e["time_us"] < start
               and any(where in f["filename"] for f in e.get("frames") or []))


def test_a_static_kv_cache_made_in_the_trace_is_not_parameters():
    """gpt-fast's setup_caches: torch.zeros in the script before the first forward, kept to the end.
    Before: "parameters 336.5 MiB" (256.5 MiB of weights and the 80 MiB cache)."""
    snap = recording(HELDOUT12, "h12_static_kv_decode")
    meta = snap["phasemem"]["meta"]
    cache = _made_before_steps_and_kept(snap, "record_heldout12.py")
    assert cache >= meta["cache_bytes"]
    for how, r in marked_and_plain(snap):
        assert r.by_category["parameter"] == meta["param_bytes"], how
        assert r.by_category["other"] >= meta["cache_bytes"], how


@pytest.mark.parametrize("name,where", [("h12_build_in_trace_infer", "torch/nn/modules/module.py"),
                                        ("h12_from_pretrained_in_trace", "transformers/")])
def test_weights_made_in_the_trace_stay_parameters(name, where):
    """A model moved with .to() or loaded by from_pretrained inside the recording: its weights."""
    snap = recording(HELDOUT12, name)
    meta = snap["phasemem"]["meta"]
    made = _made_before_steps_and_kept(snap, where)
    assert made >= meta["param_bytes"]
    # blocks from before recording (what earlier workloads of the process left, 16 B and 1 MiB) are
    # parameters by inference's rule; cuBLAS's 32 MiB workspaces are not among them
    allocated = {e["addr"] for e in snap["device_traces"][0] if e["action"] == "alloc"}
    left = sum(b["size"] for seg in snap["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"
               and b["address"] not in allocated and b["size"] != 32 << 20)
    for how, r in marked_and_plain(snap):
        assert made <= r.by_category["parameter"] <= made + left, how
