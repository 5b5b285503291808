"""PyTorch's own labels of allocations (component tracking, ``_annotate_memory``): read from the
snapshot, compared with phasemem's categories (issue #32).

No installed torch writes them (2.13 here, 2.11 on the H200): fixtures/make_torch_labels.py adds them
to the real gpt_foreach recording as the sources say torch would. Every expected number here is
counted from the raw trace entries and the recording's own phase ranges, never from phasemem.
"""
from __future__ import annotations

import copy
import lzma
import pickle
from pathlib import Path

import pytest

import phasemem
from phasemem.torch_labels import ANNOTATED, COMPONENTS, STAMPED, read

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "fixtures" / "torch_labels" / "gpt_foreach_components.pkl.xz"


def _ev(action, addr, size=1024, t=0, **extra):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": [], **extra}


def test_stamps_and_annotations_are_read_as_torch_writes_them():
    events = [
        _ev("alloc", 1, component="activation"),  # 0
        _ev("alloc", 2, component="ComponentType.OPTIMIZER_STATE"),  # 1: the enum's str()
        _ev("alloc", 3),  # 2: no stamp
        _ev("annotate", 3, user_metadata='{"component": "gradient", "by": "hook"}'),  # 3: JSON (PR 193432)
        _ev("annotate", 1, user_metadata="layers.3.mlp"),  # 4: metadata that names no component
        _ev("free_completed", 2),  # 5
        _ev("annotate", 2, user_metadata="temp"),  # 6: a freed address: nothing alive to label
        _ev("alloc", 2, component="nonsense"),  # 7: an unknown stamp
        _ev("annotate", 2, user_metadata="Parameter"),  # 8: the block now at address 2
    ]
    labels = read(events)
    got = [(int(e), COMPONENTS[c], int(s)) for e, c, s in zip(labels.event, labels.code, labels.source)]
    assert got == [(0, "activation", STAMPED), (1, "optimizer_state", STAMPED), (2, "gradient", ANNOTATED),
                   (7, "parameter", ANNOTATED)]
    assert read([_ev("alloc", 1), _ev("free_completed", 1)]) is None


def _raw() -> dict:
    return pickle.loads(lzma.decompress(FIXTURE.read_bytes()))


def _ranges(snap, phase):
    starts = sorted(a["time_us"] for a in snap["external_annotations"] if a["name"] == f"phasemem::{phase}"
                    and a["stage"] == "START")
    ends = sorted(a["time_us"] for a in snap["external_annotations"] if a["name"] == f"phasemem::{phase}"
                  and a["stage"] == "END")
    return list(zip(starts, ends))


def _lifetimes(events):
    """alloc index → free_completed index (len(events) if never freed)."""
    live, out = {}, {}
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            live[e["addr"]] = i
        elif e["action"] == "free_completed" and e["addr"] in live:
            out[live.pop(e["addr"])] = i
    return {**out, **{i: len(events) for i in live.values()}}


@pytest.fixture(scope="module")
def labelled():
    snap = _raw()
    return snap, phasemem.analyze(copy.deepcopy(snap)), phasemem.analyze(str(FIXTURE))


def test_every_label_is_read_and_the_last_one_wins(labelled):
    snap, report, streamed = labelled
    events = snap["device_traces"][0]
    allocs = [e for e in events if e["action"] == "alloc"]
    la = report.torch_labels
    assert la.labelled == len(allocs) and la.annotated == sum(e["action"] == "annotate" for e in events) == 53
    assert la.labelled_bytes == sum(e["size"] for e in allocs)
    want = {}
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            comp = "gradient" if i + 1 < len(events) and events[i + 1]["action"] == "annotate" else e["component"]
            want[comp] = want.get(comp, 0) + e["size"]
    assert la.torch_bytes == want
    # the file read streamed (phasemem analyze PATH) gives the same as the dict
    assert streamed.torch_labels == la
    assert "torch_labels" in report.to_dict() and "torch_labels" not in phasemem.analyze(
        str(ROOT / "fixtures" / "gpt_foreach.pkl.xz")).to_dict()


def test_where_torch_calls_a_gradient_a_temporary(labelled):
    """Steps 1 and 2 have no annotating hook: torch stamps their gradients temp (made in a module's
    backward); they outlive backward (step 1's until step 2's zero_grad, step 2's to the end; the
    autograd thread's workspace was made in step 0). phasemem: gradients."""
    snap, report, _ = labelled
    events = snap["device_traces"][0]
    life = _lifetimes(events)
    kept = 0
    for s, e in _ranges(snap, "backward")[1:]:
        end = max(i for i, ev in enumerate(events) if ev["time_us"] <= e)
        kept += sum(ev["size"] for i, ev in enumerate(events) if ev["action"] == "alloc" and s <= ev["time_us"] <= e
                    and end < life[i])  # step 2's are kept to the end: no zero_grad follows
    row = {(d.torch, d.phasemem): d for d in report.torch_labels.disagreements}[("temp", "gradient")]
    assert row.bytes == kept and row.right == "phasemem"
    # the same blocks, where step 0's hook annotated them, agree: 53 gradients a step
    assert row.allocations == 2 * report.torch_labels.annotated


def test_where_torch_calls_a_forward_temporary_an_activation(labelled):
    """Made under a module's forward and freed before forward ends: torch's activation, phasemem's
    temporary (it holds nothing for backward)."""
    snap, report, _ = labelled
    events = snap["device_traces"][0]
    life = _lifetimes(events)
    freed_in_forward = 0
    for s, e in _ranges(snap, "forward"):
        freed_in_forward += sum(ev["size"] for i, ev in enumerate(events)
                                if ev["action"] == "alloc" and s <= ev["time_us"] <= e and ev["component"] == "activation"
                                and life[i] < len(events) and events[life[i]]["time_us"] <= e)
    row = {(d.torch, d.phasemem): d for d in report.torch_labels.disagreements}[("activation", "temporary")]
    assert row.bytes == freed_in_forward > 0 and row.right == "phasemem"
    assert all(d.right in ("phasemem", "torch", "unknown") and d.why for d in report.torch_labels.disagreements)
