"""The command line: outputs on success; one line, exit 2 and untouched outputs on every bad input."""
from __future__ import annotations

import json
import lzma
import pickle
import subprocess
import sys

import pytest

import phasemem
from helpers.paths import FIXTURES, ROOT, SHARED
from helpers.png import png_size
from helpers.snapshots import read as raw
from phasemem.commands.cli import main

SNAPSHOTS = sorted(SHARED.glob("*.pkl.xz"))
needs_snapshots = pytest.mark.skipif(not SNAPSHOTS, reason=f"no real GPU snapshots at {SHARED}")




@needs_snapshots
@pytest.mark.parametrize("path", SNAPSHOTS, ids=lambda p: p.name.split(".")[0])
def test_analyze_writes_picture_and_json_shared(path, tmp_path, capsys):
    png, js = tmp_path / "memory.png", tmp_path / "memory.json"
    rc = main(["analyze", str(path), "-o", str(png), "--json", str(js), "--markers", "gt::", "--size", "1200x700"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert err == ""
    assert png_size(png) == (1200, 700)
    report = json.loads(js.read_text())
    snap = raw(path)
    optimizer_starts = [a for a in snap["external_annotations"] if a["name"] == "gt::optimizer" and a["stage"] == "START"]
    assert len(report["steps"]) == len(optimizer_starts) == 3
    assert report["n_events"] == len(snap["device_traces"][0])
    assert set(report["phases"]) >= {"forward", "backward", "optimizer"}
    # the printed report is str(report): its header and every step
    assert out.startswith(f"phasemem report — cuda:0, {report['n_events']:,} events, 3 step(s)")
    assert f"wrote {png}, {js}" in out


@needs_snapshots
def test_default_markers_are_phasemem_ones_shared(tmp_path, capsys):
    # Without --markers gt:: no gt:: marker is read: the steps come from PyTorch's own
    # Optimizer.step annotations, and forward is not taken from markers.
    js = tmp_path / "m.json"
    assert main(["analyze", str(SNAPSHOTS[0]), "-o", str(tmp_path / "m.svg"), "--json", str(js)]) == 0
    report = json.loads(js.read_text())
    assert report["sources"].get("optimizer") == "annotations"
    assert report["sources"].get("forward") != "markers"
    assert len(report["steps"]) == 3
    assert (tmp_path / "m.svg").read_bytes().lstrip().startswith(b"<?xml")


FOREACH = ROOT / "fixtures" / "gpt_foreach.pkl.xz"
needs_foreach = pytest.mark.skipif(not FOREACH.exists(), reason=f"{FOREACH} is not there")


@needs_foreach
@pytest.mark.parametrize("steps", ["1-2", "2", "1-", "-1"])
def test_analyze_picture_options(steps, tmp_path, capsys):
    png = tmp_path / "zoom.png"
    rc = main(["analyze", str(FOREACH), "-o", str(png), "--steps", steps, "--by", "time", "--color", "stack",
               "--max-bands", "10", "--size", "800x600", "--dpi", "72"])
    out, err = capsys.readouterr()
    assert rc == 0 and err == "", err
    assert png_size(png) == (800, 600)
    assert f"wrote {png}" in out


@needs_foreach
def test_analyze_vector_pictures_have_the_size_asked_for(tmp_path, capsys):
    import re

    svg, pdf = tmp_path / "m.svg", tmp_path / "m.pdf"
    assert main(["analyze", str(FOREACH), "-o", str(svg), "--size", "1000x500", "--dpi", "125", "--color", "phase"]) == 0
    assert main(["analyze", str(FOREACH), "-o", str(pdf), "--size", "1000x500", "--dpi", "125"]) == 0
    head = svg.read_text()[:2000]
    assert 'width="576pt"' in head and 'height="288pt"' in head  # 1000 px / 125 dpi * 72
    m = re.search(rb"/MediaBox\s*\[\s*0\s+0\s+([\d.]+)\s+([\d.]+)", pdf.read_bytes())
    assert m and (float(m.group(1)), float(m.group(2))) == (576, 288)


@needs_foreach
@pytest.mark.parametrize("steps", ["2-1", "x", "1-x", "-", "9", "7-9", "3-"])
def test_bad_step_range_is_one_line_exit_2(steps, tmp_path, capsys):
    png = tmp_path / "memory.png"
    png.write_bytes(b"yesterday's picture")
    rc = main(["analyze", str(FOREACH), "-o", str(png), "--steps", steps])
    out, err = capsys.readouterr()
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("phasemem: error: steps=") and "Traceback" not in err
    # a range that cannot be read fails before the analysis; one naming steps the trace lacks, before the report
    assert out == ""
    assert png.read_bytes() == b"yesterday's picture"


# -- bad input: one line, exit 2, nothing overwritten ----------------------------------------------


def _missing(tmp):
    return tmp / "nothing-here.pickle"


def _text(tmp):
    p = tmp / "notes.txt"
    p.write_text("this is not a snapshot\n" * 10)
    return p


def _truncated(tmp):
    data = lzma.decompress(FOREACH.read_bytes())
    p = tmp / "cut.pickle"
    p.write_bytes(data[: len(data) // 2])
    return p


def _list(tmp):
    p = tmp / "list.pickle"
    p.write_bytes(pickle.dumps([1, 2, 3]))
    return p


def _empty_traces(tmp):
    # no trace and no segments: nothing to read (segments alone give the live memory: see below)
    snap = raw(FOREACH)
    snap["device_traces"] = []
    snap["segments"] = []
    p = tmp / "empty.pickle"
    p.write_bytes(pickle.dumps(snap))
    return p


BAD = {
    "missing-file": (_missing, []),
    "text-file": (_text, []),
    "truncated-pickle": (_truncated, []),
    "pickle-of-a-list": (_list, []),
    "empty-device-traces": (_empty_traces, []),
    "unknown-device": (lambda tmp: FOREACH, ["--device", "7"]),
}


@needs_foreach
@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_exit_2_and_leaves_outputs(case, tmp_path, capsys):
    make, extra = BAD[case]
    src = make(tmp_path)
    png, js = tmp_path / "memory.png", tmp_path / "memory.json"
    png.write_bytes(b"yesterday's picture")
    js.write_text('{"yesterday": true}')
    rc = main(["analyze", str(src), "-o", str(png), "--json", str(js), *extra])
    out, err = capsys.readouterr()
    assert rc == 2
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("phasemem: error: ")
    assert "Traceback" not in err and "Traceback" not in out
    assert png.read_bytes() == b"yesterday's picture"
    assert js.read_text() == '{"yesterday": true}'
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".phasemem-")]
    if case == "unknown-device":
        assert "device 7" in err


@pytest.mark.parametrize("argv", [
    [],
    ["analyze"],
    ["analyze", "x.pickle", "-o", "memory.jpg"],
    ["analyze", "x.pickle", "--size", "12"],
    ["analyze", "x.pickle", "--dpi", "zero"],
    ["demo", "--device", "tpu"],
    ["demo", "--steps", "0"],
    ["analyze", "x.pickle", "--color", "rainbow"],
    ["analyze", "x.pickle", "--by", "pixels"],
    ["analyze", "x.pickle", "--max-bands", "-1"],
    ["analyze", "x.pickle", "--max-bands", "many"],
    ["demo", "--color", "rainbow"],
    ["frobnicate"],
])
def test_bad_usage_exits_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


def test_missing_output_folder_fails_before_analysis(tmp_path, capsys):
    rc = main(["analyze", str(tmp_path / "whatever.pickle"), "-o", str(tmp_path / "no" / "m.png")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "does not exist" in err


def test_ctrl_c_exits_130_quietly(monkeypatch, tmp_path, capsys):
    analyze_mod = sys.modules["phasemem.report.pipeline"]

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(analyze_mod, "analyze", interrupted)
    assert main(["analyze", str(tmp_path / "s.pickle"), "-o", str(tmp_path / "m.png")]) == 130
    out, err = capsys.readouterr()
    assert err == "" and "Traceback" not in out


def test_python_dash_m_runs_the_same_cli(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "phasemem", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert ok.returncode == 0 and "analyze" in ok.stdout and "demo" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "phasemem", "analyze", str(tmp_path / "none.pickle"),
                          "-o", str(tmp_path / "m.png")], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and bad.stderr.startswith("phasemem: error: ")
    assert "none.pickle" in bad.stderr


# -- demo: kept quick (~2 s on a 2-core CPU) so it runs in CI with everything else ------------------


def test_demo_trains_records_and_draws(tmp_path, capsys):
    pytest.importorskip("torch")  # the demo trains a tiny model
    png, js = tmp_path / "demo.png", tmp_path / "demo.json"
    rc = main(["demo", "-o", str(png), "--json", str(js), "--device", "cpu", "--steps", "2"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert png_size(png) == (1600, 900)
    report = json.loads(js.read_text())
    assert len(report["steps"]) == 2 and report["device"] == "cpu"
    assert {"forward", "loss", "backward", "optimizer"} <= set(report["phases"])
    # the logits (8 × 128 × 8192 fp32 = 32 MiB) are the largest thing the forward pass makes
    assert report["phases"]["loss"]["peak_bytes"] - report["phases"]["forward"]["start_bytes"] >= 32 * 2**20
    assert out.startswith("phasemem report — cpu")


def test_convert_then_analyze_the_columnar_file_gives_the_same_report(tmp_path, capsys):
    src = FIXTURES / "gpt_foreach.pkl.xz"
    npz = tmp_path / "trace.npz"
    assert main(["convert", str(src), "-o", str(npz)]) == 0
    assert npz.stat().st_size < src.stat().st_size * 20
    a, b = phasemem.analyze(src), phasemem.analyze(npz)
    assert str(a) == str(b)
    assert a.analysis.timeline.active_after.tolist() == b.analysis.timeline.active_after.tolist()
    assert [(p.kind, p.bytes) for p in a.patterns] == [(p.kind, p.bytes) for p in b.patterns]
    capsys.readouterr()
    # a corrupt columnar file: one line, exit 2
    bad = tmp_path / "bad.npz"
    bad.write_bytes(npz.read_bytes()[: npz.stat().st_size // 2])
    assert main(["analyze", str(bad), "-o", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a readable phasemem trace file" in err[0]
    assert main(["convert", str(src), "-o", str(tmp_path / "x.pickle")]) == 2


def test_segments_without_history_give_the_live_memory(tmp_path, capsys):
    """A snapshot with segments but no trace (a legacy recording, torch.cuda.memory_snapshot()) is read,
    and says so: the allocated bytes are those of its active blocks, counted here from the raw dict."""
    snap = raw(FOREACH)
    snap["device_traces"] = []
    want = sum(b.get("requested_size", b["size"]) for s in snap["segments"] for b in s["blocks"]
               if b["state"] in ("active_allocated", "active_pending_free"))
    src = tmp_path / "segments.pickle"
    src.write_bytes(pickle.dumps(snap["segments"]))  # the bare list memory_snapshot() returns
    png, js = tmp_path / "live.png", tmp_path / "live.json"
    assert main(["analyze", str(src), "-o", str(png), "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "holds no allocation history" in out.splitlines()[0]
    assert json.loads(js.read_text())["live"]["allocated_bytes"] == want
    assert png.stat().st_size > 10_000


def test_replays_run_only_where_the_output_shows_them(tmp_path, capsys, monkeypatch):
    """The remedies are replayed for --what-if and --json only: a plain analyze prints the same report
    without them, and the JSON holds what the API replays (fixtures/gpt_foreach, a real H200 trace)."""
    import importlib

    pipeline = importlib.import_module("phasemem.report.pipeline")  # the module (the package exports its function)

    src = str(ROOT / "fixtures" / "gpt_foreach.pkl.xz")
    want = phasemem.analyze(src)
    assert want.what_if, "the trace must have remedies to replay for this test to mean anything"
    calls = []
    real = pipeline.replays
    monkeypatch.setattr(pipeline, "replays", lambda *a: calls.append(1) or real(*a))
    assert main(["analyze", src, "-o", str(tmp_path / "a.png")]) == 0
    plain = capsys.readouterr().out
    assert calls == [] and plain.startswith(str(want))
    assert main(["analyze", src, "-o", str(tmp_path / "b.png"), "--json", str(tmp_path / "b.json")]) == 0
    assert calls == [1] and capsys.readouterr().out.startswith(str(want))
    got = json.loads((tmp_path / "b.json").read_text())["what_if"]
    assert [w["remedy"] for w in got] == [w.remedy for w in want.what_if]
    assert [w["predicted_peak_bytes"] for w in got] == [w.predicted_peak_bytes for w in want.what_if]
    assert main(["analyze", src, "-o", str(tmp_path / "c.png"), "--what-if"]) == 0
    assert calls == [1, 1] and "what-if (the trace replayed" in capsys.readouterr().out
