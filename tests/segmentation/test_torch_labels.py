"""The labels a program sets with ``torch.cuda.memory._set_memory_metadata``, as torch 2.11 writes them:
every trace entry's ``user_metadata``, the string last set on the thread that made it, ``""`` when none
(docs/torch_labels.md). Labels that name phases are marks, labels that name categories are set beside
phasemem's categories, anything else is kept and shown on the page's hover.

On the real snapshot (../shared/torch-labels, torch 2.11 on an H100; skipped without it), on the shared
gpu-snapshots' real sticky label, and on fixtures/torch_labels/gpt_foreach_metadata.pkl.xz (the real
gpt_foreach recording with its labels written as torch 2.11 writes them: fixtures/make_torch_labels.py).
Every expected value is counted from the raw entries (their user_metadata, frames, sizes, the recording's
own ranges), never from phasemem.
"""
from __future__ import annotations

import copy
import lzma
import pickle
from pathlib import Path

import numpy as np
import pytest

import phasemem
from helpers.paths import ROOT
from phasemem.read import trace as read_trace
from phasemem.read.batched import read_batched
from phasemem.read.columnar import load_trace, save_trace
from phasemem.read.decoder import decode_trace
from phasemem.read.snapshot import read_snapshot_file
from phasemem.read.torch_labels import (
    CATEGORY_LABELS,
    MIN_PHASES_NAMED,
    PHASE_LABELS,
    category_of,
    from_codes,
    from_values,
    phase_of,
    phase_runs,
)
from phasemem.read.trace import Trace
from phasemem.vocab import CATEGORIES, PHASES

SHARED = ROOT.parent / "shared"
REAL = SHARED / "torch-labels" / "torch_metadata_labels.pickle.xz"
STICKY = SHARED / "gpu-snapshots" / "gpt_adamw_foreach.pkl.xz"
FIXTURE = ROOT / "fixtures" / "torch_labels" / "gpt_foreach_metadata.pkl.xz"
RECORDING = ROOT / "fixtures" / "gpt_foreach.pkl.xz"  # the same run, with its phasemem:: ranges


def _raw(path: Path) -> dict:
    obj = pickle.loads(lzma.decompress(path.read_bytes()))
    return obj.get("snapshot", obj)


def _real() -> dict:
    if not REAL.exists():
        pytest.skip(f"no real torch 2.11 labelled snapshot at {REAL}")
    return _raw(REAL)


def _python_frames(e: dict) -> bool:
    return any(str(f["filename"]).endswith(".py") for f in e["frames"])


def _labelled(events: list) -> list[tuple[int, str]]:
    return [(i, e["user_metadata"]) for i, e in enumerate(events) if e.get("user_metadata")]


def _as_pairs(labels) -> list[tuple[int, str]]:
    return [] if labels is None else [(int(e), labels.texts[t]) for e, t in zip(labels.event, labels.text)]


def _lifetimes(events: list) -> dict[int, int]:
    """alloc entry → its free_completed entry (len(events) if never freed)."""
    live, out = {}, {}
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            live[e["addr"]] = i
        elif e["action"] == "free_completed" and e["addr"] in live:
            out[live.pop(e["addr"])] = i
    return {**out, **{i: len(events) for i in live.values()}}


# -- what a label names ----------------------------------------------------------------------------------


def test_labels_name_phases_and_categories_by_the_tables():
    assert set(PHASE_LABELS.values()) <= set(PHASES) - {"other"}
    assert set(CATEGORY_LABELS.values()) <= set(CATEGORIES) - {"other"}
    assert [phase_of(t) for t in ("forward", " Backward ", "zero-grad", "Optimizer step", "phase=backward", "step")] \
        == ["forward", "backward", "zero_grad", "optimizer", None, None]
    assert [category_of(t) for t in ("parameters", "Optimizer State", "grads", "activations", "kv cache", "forward")] \
        == ["parameter", "optimizer_state", "gradient", "activation", None, None]


def test_labels_are_read_entry_by_entry():
    values = ["", "forward", "forward", None, "phasemem: step 0, forward, activation", {"layer": 3}, "kv cache",
              "forward"]
    labels = from_values(values)
    # "" and None are no label; phasemem annotate's own words are never read back; a dict is JSON
    assert _as_pairs(labels) == [(1, "forward"), (2, "forward"), (5, '{"layer": 3}'), (6, "kv cache"), (7, "forward")]
    assert from_values(["", "", None]) is None
    # whichever order a reader numbered the texts in, they are numbered by first use (Trace equality)
    other = from_codes(np.array([-1, 2, 2, 0, -1, 1], np.int32), ["kv cache", "{}", "forward"])
    assert other.texts == ("forward", "kv cache", "{}") and other.text.tolist() == [0, 0, 1, 2]
    assert labels.text_at(np.array([0, 2, 6, 99])) == ["", "forward", "kv cache", ""]


def test_phase_runs_take_in_the_unlabelled_entries_between_and_need_two_phases():
    runs = phase_runs(from_values(["forward", "kv", "forward", "backward", "", "", "backward", "", "optimizer", ""]))
    assert runs == [("forward", 0, 2), ("backward", 3, 6), ("optimizer", 8, 8)]
    # one phase named alone (a sticky label): where it ends is unknown, so no marks
    assert MIN_PHASES_NAMED == 2 and phase_runs(from_values(["backward", "", "backward", "x"])) == []


# -- the real torch 2.11 snapshot ------------------------------------------------------------------------


def test_every_reader_carries_user_metadata_shared(tmp_path):
    snap = _real()
    want = _labelled(snap["device_traces"][0])
    assert {t for _, t in want} == {"forward", "zero_grad", "backward", "optimizer"}  # the README's four
    p = tmp_path / "s.pickle"
    p.write_bytes(pickle.dumps(snap, protocol=4))
    decoded = decode_trace(p, always=True)
    streamed = read_batched(str(p), None, False)
    assert decoded is not None and streamed is not None  # neither gives way for the labels
    for t in (Trace.from_snapshot(copy.deepcopy(snap)), Trace.from_snapshot(read_snapshot_file(p)), decoded, streamed,
              read_trace(REAL)):
        assert _as_pairs(t.torch_labels) == want
    save_trace(decoded, tmp_path / "t.npz")
    assert _as_pairs(load_trace(tmp_path / "t.npz").torch_labels) == want


def _readme_truth(events: list) -> list[str]:
    """Every entry's phase as the README says the run was labelled: its own label where it has one; an
    unlabelled entry between two entries labelled "backward" is the autograd thread's, in backward."""
    labels = [e["user_metadata"] for e in events]
    named = [i for i, x in enumerate(labels) if x]
    out = list(labels)
    for a, b in zip(named, named[1:]):
        if b > a + 1:
            fill = "backward" if labels[a] == labels[b] == "backward" else "other"
            out[a + 1:b] = [fill] * (b - a - 1)
    return [x or "other" for x in out]


def test_phases_from_metadata_are_the_readme_truth_shared():
    snap = _real()
    events = snap["device_traces"][0]
    truth = _readme_truth(events)
    # the README's account: the unlabelled entries are the autograd thread's (no Python frame), all in backward
    gap = [i for i, e in enumerate(events) if not e["user_metadata"]]
    assert gap and all(truth[i] == "backward" and not _python_frames(events[i]) for i in gap)
    report = phasemem.analyze(copy.deepcopy(snap))
    assert report.labels.tolist() == truth
    assert {report.sources[p] for p in ("forward", "zero_grad", "backward", "optimizer")} == {"metadata"}
    # three steps, each from its first forward entry to its last optimizer entry
    fwd = [i for i, x in enumerate(truth) if x == "forward" and (i == 0 or truth[i - 1] != "forward")]
    opt = [i for i, x in enumerate(truth) if x == "optimizer" and (i + 1 == len(truth) or truth[i + 1] != "optimizer")]
    assert [(s.start_event, s.end_event) for s in report.steps] == list(zip(fwd, opt)) and len(fwd) == 3


def test_a_label_naming_a_category_is_set_beside_phasemems_shared():
    """The program labels its first optimizer step "optimizer state" (the AdamW state is made there):
    every entry of that step carries it. What stays to the end is state, and phasemem agrees; what the
    step freed again is scratch under the label, and phasemem says temporary, rightly."""
    snap = _real()
    events = snap["device_traces"][0]
    second = next(i for i in range(1, len(events)) if events[i]["user_metadata"] == "forward"
                  and events[i - 1]["user_metadata"] != "forward")
    for e in events[:second]:
        if e["user_metadata"] == "optimizer":
            e["user_metadata"] = "optimizer state"
    truth = _readme_truth(_raw(REAL)["device_traces"][0])
    life = _lifetimes(events)
    made = [i for i, e in enumerate(events) if e["action"] == "alloc" and e["user_metadata"] == "optimizer state"]
    kept = sum(events[i]["size"] for i in made if life[i] == len(events))
    freed = [i for i in made if life[i] < len(events)]
    report = phasemem.analyze(snap)
    la = report.torch_labels
    assert la.labelled == len(made) and la.label_bytes == {"optimizer_state": sum(events[i]["size"] for i in made)}
    assert la.agreed_bytes == kept > 0
    (row,) = la.disagreements
    assert (row.label, row.phasemem, row.right) == ("optimizer_state", "temporary", "phasemem")
    assert (row.allocations, row.bytes) == (len(freed), sum(events[i]["size"] for i in freed))
    # the step's phases do not move: torch's Optimizer.step range still places step 0's update
    assert report.labels.tolist() == truth


def test_a_sticky_label_naming_no_phase_is_kept_and_changes_no_phase_shared():
    """The shared gpu-snapshots (torch 2.11, H200) carry a real label, "phase=backward", left set on the
    main thread into the next step's forward: it names no phase (docs/trace.md) and is kept."""
    if not STICKY.exists():
        pytest.skip(f"no {STICKY}")
    pytest.importorskip("torch")  # its meta holds a TorchVersion: read with pickle, it needs torch
    snap = _raw(STICKY)
    events = snap["device_traces"][0]
    made = [i for i, e in enumerate(events) if e["action"] == "alloc" and e["user_metadata"] == "phase=backward"]
    report = phasemem.analyze(copy.deepcopy(snap))
    assert report.torch_labels.kept == {"phase=backward": {"allocations": len(made),
                                                          "bytes": sum(events[i]["size"] for i in made)}}
    assert report.torch_labels.phases == [] and report.torch_labels.labelled == 0
    for e in events:
        e["user_metadata"] = ""
    assert phasemem.analyze(snap).labels.tolist() == report.labels.tolist()


# -- the fixture: gpt_foreach, labelled as torch 2.11 writes labels ------------------------------------------


def _recording_truth() -> list[str]:
    """Each entry's phase by the recording's own phasemem:: ranges (the innermost holding its time), the
    loss between a forward's end and the next backward's start."""
    snap = _raw(RECORDING)
    t = [e["time_us"] for e in snap["device_traces"][0]]
    open_, ranges = {}, []
    for a in sorted(snap["external_annotations"], key=lambda a: a["time_us"]):
        if a["name"].startswith("phasemem::"):
            if a["stage"] == "START":
                open_[a["name"]] = a["time_us"]
            else:
                ranges.append((a["name"][10:], open_.pop(a["name"]), a["time_us"]))
    out = []
    for x in t:
        inside = sorted((b - a, p) for p, a, b in ranges if a <= x <= b)
        if inside:
            out.append(inside[0][1])
            continue
        before = [(b, p) for p, a, b in ranges if b < x]
        after = [(a, p) for p, a, b in ranges if a > x]
        out.append("loss" if before and after and max(before)[1] == "forward" and min(after)[1] in
                   ("zero_grad", "backward") else "other")
    return out


@pytest.fixture(scope="module")
def fixture_report():
    return phasemem.analyze(str(FIXTURE))


def test_fixture_phases_from_labels_are_the_recordings_ranges(fixture_report):
    snap = _raw(FIXTURE)
    assert not any(a["name"].startswith("phasemem::") for a in snap["external_annotations"])  # labels only
    assert fixture_report.labels.tolist() == _recording_truth()
    assert fixture_report.sources["backward"] == "metadata" and fixture_report.torch_labels.phases == \
        ["forward", "zero_grad", "backward", "optimizer"]


def test_fixture_categories_and_kept_labels(fixture_report):
    events = _raw(FIXTURE)["device_traces"][0]
    batch = [e["size"] for e in events if e["action"] == "alloc" and e["user_metadata"] == "batch"]
    loss = [e["size"] for e in events if e["action"] == "alloc" and e["user_metadata"] == "cross-entropy"]
    la = fixture_report.torch_labels
    # "batch" names the inputs; phasemem's reading of the batch agrees
    assert la.label_bytes == {"input": sum(batch)} and la.labelled == len(batch) and la.agreed_bytes == sum(batch)
    # "cross-entropy" names neither a phase nor a category: kept with what it covers
    assert la.kept == {"cross-entropy": {"allocations": len(loss), "bytes": sum(loss)}}
    assert fixture_report.to_dict()["torch_labels"]["kept"] == la.kept
    assert "torch_labels" not in phasemem.analyze(str(RECORDING)).to_dict()  # no label, no entry


def test_fixture_every_reader_carries_the_labels(tmp_path):
    snap = _raw(FIXTURE)
    want = _labelled(snap["device_traces"][0])
    p = tmp_path / "s.pickle"
    p.write_bytes(pickle.dumps(snap, protocol=4))
    decoded, streamed = decode_trace(p, always=True), read_batched(str(p), None, False)
    assert decoded is not None and streamed is not None
    for t in (decoded, streamed, read_trace(FIXTURE), Trace.from_snapshot(copy.deepcopy(snap))):
        assert _as_pairs(t.torch_labels) == want


def test_labels_longer_than_the_decoders_short_strings_are_read(tmp_path):
    """The decoder reads a new label of up to 15 bytes with numpy; a longer one is parsed one entry at a
    time, and a label seen before is a reference: all read as written."""
    snap = _raw(FIXTURE)
    events = snap["device_traces"][0]
    for k, e in enumerate(events):
        if e["user_metadata"] == "cross-entropy":
            e["user_metadata"] = f"loss, cross-entropy over the vocabulary #{k % 2}"
    p = tmp_path / "s.pickle"
    p.write_bytes(pickle.dumps(snap, protocol=4))
    decoded = decode_trace(p, always=True)
    assert decoded is not None and _as_pairs(decoded.torch_labels) == _labelled(events)


def test_the_page_shows_the_programs_label_on_hover(fixture_report):
    from phasemem.reporters.html import page as html
    from phasemem.reporters.html import template as html_page

    life = fixture_report.analysis.timeline.lifetimes
    events = _raw(FIXTURE)["device_traces"][0]
    drawn = list(range(len(life.size)))
    meta, _ = html._band_meta(fixture_report, drawn)
    for i in drawn:
        a = int(life.alloc_event[i])
        assert meta[i][7] == (events[a]["user_metadata"] if a >= 0 else "")
    assert "labelled by the program: ${r[7]}" in Path(html_page.__file__).read_text()  # the tip prints it
