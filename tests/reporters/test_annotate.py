"""phasemem annotate: the labelled snapshot opens in torch's memory_viz tooling, keeps every original
byte, and its labels and ranges are where the raw trace says (docs/memory_viz.md)."""
from __future__ import annotations

import base64
import json
import lzma
import pickle
import pickletools
import re
import subprocess
import sys
from pathlib import Path

import pytest

import phasemem
from helpers.paths import ROOT
from phasemem.commands.cli import main

FIXTURE = ROOT / "fixtures" / "gpt_foreach.pkl.xz"
WILD = ROOT.parent / "shared" / "wild"
GPU = ROOT.parent / "shared" / "gpu-snapshots"

#: The opcodes MemoryViz.js's unpickle() has a case for (torch/utils/viz/MemoryViz.js, the `const X =
#: 'x'.charCodeAt(0)` table; anything else throws "UNKNOWN OPCODE"), and the protocols its PROTO case takes.
MEMORYVIZ_OPCODES = {"APPENDS", "BINGET", "BININT", "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "FRAME",
                     "LONG1", "LONG_BINGET", "MARK", "MEMOIZE", "PROTO", "SETITEMS", "SHORT_BINUNICODE", "STOP",
                     "TUPLE2", "APPEND", "NEWFALSE", "BINPUT", "BINUNICODE", "EMPTY_TUPLE", "NEWTRUE", "NONE",
                     "BINFLOAT", "TUPLE", "TUPLE1", "TUPLE3", "LONG_BINPUT", "LIST", "DICT", "SETITEM"}
MEMORYVIZ_PROTOCOLS = range(2, 5)


def raw_bytes(path: Path) -> bytes:
    return lzma.decompress(path.read_bytes()) if path.suffix == ".xz" else path.read_bytes()


def annotate_cli(src: Path, out: Path, *extra: str) -> bytes:
    assert main(["annotate", str(src), "-o", str(out), *extra]) == 0
    return out.read_bytes()


def check_memoryviz_pickle(data: bytes) -> None:
    """The header byte says protocol 2..4 and every opcode is one MemoryViz.js reads."""
    assert data[0] == 0x80 and data[1] in MEMORYVIZ_PROTOCOLS, data[:2]
    ops = {op.name for op, _, _ in pickletools.genops(data)}
    assert ops <= MEMORYVIZ_OPCODES, ops - MEMORYVIZ_OPCODES


def strip_labels(labelled: dict, original: dict) -> dict:
    """``labelled`` less what annotate may add, checking on the way that nothing else differs."""
    out = dict(labelled)
    n = len(original.get("external_annotations") or [])
    anns = labelled.get("external_annotations") or []
    assert anns[:n] == (original.get("external_annotations") or [])
    assert all(a["name"].startswith("phasemem.") for a in anns[n:])
    if "external_annotations" in original:
        out["external_annotations"] = anns[:n]
    else:
        out.pop("external_annotations", None)
    assert set(out) == set(original)
    traces = []
    for got, had in zip(labelled["device_traces"], original["device_traces"], strict=True):
        events = []
        for g, h in zip(got, had, strict=True):
            g = dict(g)
            if "category" not in h:
                g.pop("category", None)
            if not h.get("user_metadata"):
                assert g.get("user_metadata", "").startswith("phasemem: ") or g.get("user_metadata") == h.get(
                    "user_metadata")
                if "user_metadata" in h:
                    g["user_metadata"] = h["user_metadata"]
                else:
                    g.pop("user_metadata", None)
            assert list(g) == list(h) and g == h
            events.append(g)
        traces.append(events)
    out["device_traces"] = traces
    return out


def marker_intervals(snap: dict, name: str) -> list[tuple[int, int]]:
    """START/END pairs of one record_function name, straight from the raw annotations."""
    out, open_ = [], []
    for a in sorted(snap["external_annotations"], key=lambda a: a["time_us"]):
        if a["name"] == name:
            if a["stage"] == "START":
                open_.append(a["time_us"])
            else:
                out.append((open_.pop(), a["time_us"]))
    return out


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    out = tmp_path_factory.mktemp("annotate") / "labelled.pickle"
    data = annotate_cli(FIXTURE, out)
    return out, data, pickle.loads(data), pickle.loads(raw_bytes(FIXTURE))


def test_output_is_a_pickle_memoryviz_reads(labelled):
    _, data, _, _ = labelled
    check_memoryviz_pickle(data)


def test_original_bytes_unchanged_once_labels_are_removed(labelled):
    _, _, lab, orig = labelled
    stripped = strip_labels(lab, orig)
    # re-pickling the fixture gives its own bytes (torch wrote it with protocol 4), so this is byte for byte
    assert pickle.dumps(orig, protocol=4) == raw_bytes(FIXTURE)
    assert pickle.dumps(stripped, protocol=4) == raw_bytes(FIXTURE)


def test_every_allocation_has_a_category_and_unknown_is_among_them(labelled):
    _, _, lab, _ = labelled
    events = lab["device_traces"][0]
    allocs = [e for e in events if e["action"] == "alloc"]
    assert allocs and all(e["category"] in {"parameter", "gradient", "optimizer_state", "activation", "temporary",
                                            "input", "unknown"} for e in allocs)
    # MemoryViz.js pushes a missing 'unknown' onto `snapshot.categores` (sic) and fails to load
    assert "unknown" in {e.get("category") for e in events}


def test_ranges_are_the_reports_boundaries_at_the_raw_event_times(labelled):
    _, _, lab, orig = labelled
    events = orig["device_traces"][0]
    report = phasemem.analyze(str(FIXTURE))
    numbers = [s.number for s in report.steps]
    want = set()
    for s in report.steps:
        want |= {(f"phasemem.step#{s.number}", "START", events[s.start_event]["time_us"]),
                 (f"phasemem.step#{s.number}", "END", events[s.end_event]["time_us"])}
    for a, b, ph, s in report.label_runs():
        if ph != "other" and s >= 0:
            want |= {(f"phasemem.{ph}#{numbers[s]}", "START", events[a]["time_us"]),
                     (f"phasemem.{ph}#{numbers[s]}", "END", events[b]["time_us"])}
    for p in report.patterns:
        want |= {(f"phasemem.{p.kind}#{numbers[p.step]}", "START", events[p.start_event]["time_us"]),
                 (f"phasemem.{p.kind}#{numbers[p.step]}", "END", events[p.end_event]["time_us"])}
    got = {(a["name"], a["stage"], a["time_us"]) for a in lab["external_annotations"] if a["name"].startswith("phasemem.")}
    assert got == want and len(want) == 2 * (3 + 14 + len(report.patterns))


def test_phase_ranges_and_labels_sit_inside_the_recorded_markers(labelled):
    _, _, lab, orig = labelled
    for phase in ("forward", "backward"):
        marked = marker_intervals(orig, f"phasemem::{phase}")
        ours = marker_intervals(lab, f"phasemem.{phase}#0") + marker_intervals(lab, f"phasemem.{phase}#1") + \
            marker_intervals(lab, f"phasemem.{phase}#2")
        assert len(marked) == len(ours) == 3
        for (m0, m1), (o0, o1) in zip(marked, ours):
            assert m0 <= o0 <= o1 <= m1
        # every allocation made inside the k-th marker is labelled step k, that phase
        for k, (m0, m1) in enumerate(marked):
            inside = [e for e in lab["device_traces"][0] if e["action"] == "alloc" and m0 < e["time_us"] < m1]
            assert inside and all(e["user_metadata"].startswith(f"phasemem: step {k}, {phase},") for e in inside)


def test_the_logits_block_is_labelled_logits(labelled):
    _, _, lab, orig = labelled
    meta = orig["phasemem"]["meta"]
    logits = meta["batch"] * meta["seq"] * meta["vocab"] * 4  # fp32 scores, from what the recording says it ran
    m0, m1 = marker_intervals(orig, "phasemem::forward")[0]
    block = [e for e in lab["device_traces"][0]
             if e["action"] == "alloc" and e["size"] == logits and m0 <= e["time_us"] <= m1]
    assert len(block) == 1
    assert block[0]["category"] == "activation" and "logits" in block[0]["user_metadata"].split(", ")


def test_labelled_snapshot_analyses_as_the_original(labelled):
    # the ranges are not markers: phasemem reads the labelled file exactly as the original
    out, _, _, _ = labelled
    assert phasemem.analyze(str(out)).to_dict() == phasemem.analyze(str(FIXTURE)).to_dict()


def test_torch_memory_viz_tooling_opens_it(labelled, tmp_path):
    pytest.importorskip("torch")  # torch's own tooling
    out, _, lab, _ = labelled
    html = tmp_path / "x.html"
    for argv in (["trace_plot", str(out), "-o", str(html)], ["stats", str(out)], ["trace", str(out)]):
        run = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", *argv], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
    # the page trace_plot wrote carries the snapshot with phasemem's labels, for MemoryViz.js to read
    files = json.loads(re.search(r"const local_files = (\[.*?\])\n", html.read_text()).group(1))
    shipped = base64.b64decode(files[0]["base64"])
    check_memoryviz_pickle(shipped)
    assert pickle.loads(shipped)["device_traces"] == lab["device_traces"]


def test_input_dict_is_not_changed():
    from phasemem.read.snapshot import load_snapshot
    from phasemem.reporters.memory_viz import annotate

    snap = load_snapshot(str(FIXTURE))
    before = pickle.dumps(snap, protocol=4)
    labels = annotate(snap, [phasemem.analyze(snap)])
    assert pickle.dumps(snap, protocol=4) == before and labels.snapshot is not snap


@pytest.mark.skipif(not (GPU / "mlp_fp16_scaler.pkl.xz").exists(), reason=f"no snapshots at {GPU}")
def test_users_own_metadata_is_kept_and_the_wrapper_left_shared(tmp_path):
    pytest.importorskip("torch")  # the wrapper's meta holds a TorchVersion: pickle.loads below needs torch
    # These files wrap the snapshot ({"snapshot": ..., "meta": ...}, meta holding a TorchVersion, a GLOBAL
    # MemoryViz.js has no opcode for) and label backward allocations with user_metadata "phase=backward".
    src = GPU / "mlp_fp16_scaler.pkl.xz"
    assert {op.name for op, _, _ in pickletools.genops(raw_bytes(src))} - MEMORYVIZ_OPCODES
    data = annotate_cli(src, tmp_path / "l.pickle", "--markers", "gt::")
    check_memoryviz_pickle(data)
    lab, orig = pickle.loads(data), pickle.loads(raw_bytes(src))["snapshot"]
    strip_labels(lab, orig)  # the user's own user_metadata is among what is unchanged
    kept = [e for e in lab["device_traces"][0] if e["user_metadata"] == "phase=backward"]
    assert kept and all(e["action"] != "alloc" or e["category"] for e in kept)


def test_types_memoryviz_cannot_read_are_written_as_plain_values():
    from collections import OrderedDict

    from phasemem.read.snapshot import load_snapshot
    from phasemem.reporters.memory_viz import annotate, memoryviz_pickle

    class Version(str):  # what a TorchVersion is: a str subclass, pickled as a GLOBAL
        pass

    snap = load_snapshot(str(FIXTURE))
    snap["extra"] = {"torch": Version("2.11.0"), "order": OrderedDict(a=1), "flags": {3, 1}, "raw": b"\x01"}
    labels = annotate(snap, [phasemem.analyze(snap)])
    data = memoryviz_pickle(labels.snapshot)
    check_memoryviz_pickle(data)
    assert pickle.loads(data)["extra"] == {"torch": "2.11.0", "order": {"a": 1}, "flags": [1, 3], "raw": "\x01"}
    assert labels.converted == {"Version": 1, "OrderedDict": 1, "set": 1, "bytes": 1}
    assert type(snap["extra"]["torch"]) is Version  # the caller's dict is left as it was


WILD_TRAINING = ["wedsonlin_medium512_train.pickle", "kkaitlyn_ctx128_fullstep.pickle", "cranberrii_ftcourse.pickle"]


@pytest.mark.parametrize("name", WILD_TRAINING)
def test_wild_snapshot_shared(name, tmp_path):
    src = WILD / name
    if not src.exists():
        pytest.skip(f"no {src}")
    data = annotate_cli(src, tmp_path / "l.pickle", "--device", "all")
    check_memoryviz_pickle(data)
    lab, orig = pickle.loads(data), pickle.loads(src.read_bytes())
    assert pickle.dumps(strip_labels(lab, orig), protocol=4) == src.read_bytes()
    assert "unknown" in {e.get("category") for t in lab["device_traces"] for e in t}
    pytest.importorskip("torch")  # torch's own tooling opens it
    run = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", str(tmp_path / "l.pickle"),
                          "-o", str(tmp_path / "x.html")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


# -- bad input: one line, exit 2, no output ---------------------------------------------------------


def _no_history(tmp_path: Path) -> Path:
    p = tmp_path / "segments.pickle"
    p.write_bytes(pickle.dumps({"segments": [{"device": 0, "address": 0, "total_size": 1024, "stream": 0,
                                              "blocks": [{"size": 1024, "state": "active_allocated"}]}],
                                "device_traces": [[]]}, protocol=4))
    return p


@pytest.mark.parametrize("case", ["same-file", "compressed-output", "no-history", "not-a-pickle", "no-folder",
                                  "labelled-twice"])
def test_bad_input_is_one_line_exit_2(case, tmp_path, capsys):
    src, out = FIXTURE, tmp_path / "out.pickle"
    if case == "same-file":
        src = out = tmp_path / "in.pickle"
        src.write_bytes(raw_bytes(FIXTURE))
    elif case == "compressed-output":
        out = tmp_path / "out.pickle.xz"
    elif case == "no-history":
        src = _no_history(tmp_path)
    elif case == "not-a-pickle":
        src = tmp_path / "notes.txt"
        src.write_text("hello")
    elif case == "no-folder":
        out = tmp_path / "missing" / "out.pickle"
    elif case == "labelled-twice":
        src = tmp_path / "once.pickle"
        annotate_cli(FIXTURE, src)
        capsys.readouterr()
    before = src.read_bytes()
    rc = main(["annotate", str(src), "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("phasemem: error: ") and err.count("\n") == 1, err
    assert src.read_bytes() == before
    assert case == "same-file" or not out.exists()
