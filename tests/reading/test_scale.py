"""Scale: the streaming pickle reader gives the ordinary reader's Trace, and ``steps=`` analyses only
some steps with the numbers the whole analysis gives them."""
import bz2
import gzip
import mmap
import os
import pickle
import sys
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

import phasemem
from helpers.analyses import analyzed
from helpers.paths import ROOT, fixture_paths, shared_paths
from helpers.snapshots import load_snapshot, prefix_of
from helpers.traces import assert_same_trace
from phasemem import PhasememError
from phasemem.analysis.segmentation import Segmentation, segment
from phasemem.analysis.step_index import build_index, can_slice, cut, segment_marked
from phasemem.analysis.timeline import Timeline
from phasemem.commands.cli import main
from phasemem.read import read
from phasemem.read import trace as read_trace
from phasemem.read.batched import _find_events
from phasemem.read.batched import read_batched as _stream
from phasemem.read.columnar import EVENTS, read_index, save_trace
from phasemem.read.snapshot import read_snapshot_file
from phasemem.read.trace import Trace

PATHS = shared_paths() + fixture_paths()
ids = lambda p: f"{p.parent.name}/{p.name.split('.')[0]}"  # noqa: E731


def plain(path, device=None) -> Trace:
    return Trace.from_snapshot(read_snapshot_file(path), device)


# -- the streaming reader ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS, ids=ids)
def test_streamed_trace_equals_the_ordinary_readers(path):
    streamed = _stream(str(path), None, False)  # the streaming path itself, not its fallback
    assert streamed is not None
    assert_same_trace(streamed, plain(path))


def _write(tmp_path, name, obj, protocol=4, compress=None) -> Path:
    data = pickle.dumps(obj, protocol=protocol)
    if compress:
        data = compress(data)
    p = tmp_path / name
    p.write_bytes(data)
    return p


@pytest.mark.parametrize("protocol,compress", [(4, None), (5, gzip.compress), (2, bz2.compress), (3, None)])
def test_streamed_across_pickle_protocols_and_compressions(tmp_path, protocol, compress):
    snap = load_snapshot(PATHS[0])
    p = _write(tmp_path, "s.pickle", snap, protocol, compress)
    streamed = _stream(str(p), None, False)
    assert streamed is not None  # protocols 2 and 3 (no frames, BINPUT) stream too
    assert_same_trace(streamed, plain(p))


def _variant(snap, kind):
    ev = snap["device_traces"][0]
    if kind == "second device busiest":  # the first list with events is not the one read
        snap["device_traces"] = [ev[:40], ev]
    elif kind == "first device empty":
        snap["device_traces"] = [[], ev, []]
    elif kind == "one event":  # a list of one item is APPEND, not APPENDS
        snap["device_traces"] = [ev[:1]]
    elif kind == "shared frame lists":  # as replicate_steps and torch's shared stacks make them
        fr = next(e["frames"] for e in ev if e.get("frames"))
        for e in ev[::3]:
            e["frames"] = fr
    elif kind == "older format":  # keys missing in some batches only
        for e in ev[1500:2600]:
            e.pop("time_us", None)
            e.pop("stream", None)
            e.pop("frames", None)
    elif kind == "oom":
        ev.append({"action": "oom", "addr": 0, "size": 1 << 30, "stream": 0, "time_us": ev[-1]["time_us"],
                   "device_free": 5 << 20, "frames": []})
    elif kind == "device_traces as a frame name":
        ev[0]["frames"] = [{"filename": "x.py", "line": 1, "name": "device_traces"}]
        snap = {"junk": ["device_traces", 1], **snap}
    return snap


@pytest.mark.parametrize("kind", ["second device busiest", "first device empty", "one event", "shared frame lists",
                                  "older format", "oom", "device_traces as a frame name"])
def test_read_trace_equals_the_ordinary_reader_on_odd_layouts(tmp_path, kind):
    p = _write(tmp_path, "s.pickle", _variant(load_snapshot(PATHS[0]), kind))
    want = plain(p)
    assert_same_trace(read_trace(p), want)
    if kind not in ("second device busiest",):
        assert _stream(str(p), None, False) is not None
    if kind == "second device busiest":
        assert_same_trace(read_trace(p, device=0), plain(p, 0))


def _reframed(data: bytes, cut: int) -> bytes:
    """The same protocol-4 pickle in two frames, the second starting at ``cut`` (an opcode boundary)."""
    import pickletools

    frames = [pos for op, _, pos in pickletools.genops(data) if op.name == "FRAME"]
    body = bytearray(data[2:])  # without PROTO
    for pos in reversed(frames):
        del body[pos - 2:pos - 2 + 9]
        if pos - 2 < cut - 2:
            cut -= 9
    cut -= 2
    parts = (bytes(body[:cut]), bytes(body[cut:]))
    return data[:2] + b"".join(b"\x95" + len(x).to_bytes(8, "little") + x for x in parts)


def test_a_frame_starting_between_the_list_and_its_first_event(tmp_path):
    # A list of one event is EMPTY_LIST MEMOIZE then the event: a new frame may start between them,
    # after the walk has seen the list; the frame to patch is the one the list is in.
    snap = _variant(load_snapshot(PATHS[0]), "one event")
    data = pickle.dumps(snap, protocol=4)
    at = data.index(b"device_traces") + len(b"device_traces")
    cut = data.index(b"]\x94]\x94", at) + 4  # after the inner list and its MEMOIZE
    p = tmp_path / "s.pickle"
    p.write_bytes(_reframed(data, cut))
    assert pickle.loads(p.read_bytes()) == snap
    streamed = _stream(str(p), None, False)
    assert streamed is not None
    assert_same_trace(streamed, plain(p))


def test_trusted_streaming_reads_any_global(tmp_path):
    snap = load_snapshot(PATHS[0])
    snap["phasemem"] = {"note": Path("x")}  # a global the restricted reader refuses
    p = _write(tmp_path, "s.pickle", snap)
    with pytest.raises(PhasememError, match="names pathlib"):
        read_trace(p)
    assert _stream(str(p), None, True) is not None
    assert_same_trace(read_trace(p, trusted=True), Trace.from_snapshot(read_snapshot_file(p, trusted=True)))


def test_bad_events_still_give_the_ordinary_errors(tmp_path):
    snap = load_snapshot(PATHS[0])
    del snap["device_traces"][0][1200]["action"]
    with pytest.raises(PhasememError, match="malformed"):
        read_trace(_write(tmp_path, "a.pickle", snap))
    with pytest.raises(PhasememError, match="device 3 is not in this snapshot"):
        read_trace(_write(tmp_path, "b.pickle", load_snapshot(PATHS[0])), device=3)
    raw = pickle.dumps(load_snapshot(PATHS[0]), protocol=4)
    (tmp_path / "cut.pickle").write_bytes(raw[: len(raw) * 2 // 3])
    with pytest.raises(PhasememError, match="truncated or corrupt"):
        read_trace(tmp_path / "cut.pickle")
    (tmp_path / "cut.pickle.gz").write_bytes(gzip.compress(raw)[:-5000])
    with pytest.raises(PhasememError, match="compressed stream is truncated"):
        read_trace(tmp_path / "cut.pickle.gz")


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/phasemem-stream-pwned",))


def test_a_global_among_the_events_is_refused_and_runs_nothing(tmp_path):
    marker = Path("/tmp/phasemem-stream-pwned")
    marker.unlink(missing_ok=True)
    snap = load_snapshot(PATHS[0])
    snap["device_traces"][0][2000]["frames"] = [_Evil()]
    p = _write(tmp_path, "e.pickle", snap)
    assert _find_events(open(p, "rb")) is not None  # the streaming path is the one that meets it
    with pytest.raises(PhasememError, match="names (posix|os).system"):
        read_trace(p)
    assert not marker.exists()
    # the file naming the collector itself: refused like any other global
    from phasemem.read.batched import _Events

    class Sneaky:
        def __reduce__(self):
            return (_Events, ())

    snap["device_traces"][0][2000]["frames"] = [Sneaky()]
    with pytest.raises(PhasememError, match="names phasemem.read.batched._Events"):
        read_trace(_write(tmp_path, "twice.pickle", snap))


# -- steps=: only some steps, the full analysis's numbers ------------------------------------------


def _phase_fields(p, off):
    def shift(e):
        return None if e is None else e + off
    return (p.name, p.peak_bytes, p.start_bytes, p.end_bytes, shift(p.start_event), shift(p.end_event),
            shift(p.peak_event), p.n_events, p.source, p.confidence,
            None if p.at_event is None else p.at_event + off)


def assert_slice_matches(full, part):
    off, n = part.analysis.trace.first_event, part.n_events
    numbers = [s.number for s in part.steps]
    mine = [s for s in full.steps if s.number in numbers]
    assert [s.number for s in mine] == numbers and numbers
    for s, f in zip(part.steps, mine):
        assert s.complete == f.complete
        assert (s.start_event + off, s.end_event + off, s.peak_event + off) == (f.start_event, f.end_event, f.peak_event)
        assert (s.start_bytes, s.peak_bytes, s.end_bytes) == (f.start_bytes, f.peak_bytes, f.end_bytes)
        # every step holds the keys of the phases its report's steps ran: a phase that ran only outside
        # the slice is a key of the whole's steps alone (ran False there)
        assert [k for k, p in s.phases.items() if p.ran] == [k for k, p in f.phases.items() if p.ran]
        for name, p in s.phases.items():
            if not p.ran:
                assert not f.phases[name].ran, (s.number, name)
                continue
            q = f.phases[name]
            assert _phase_fields(p, off) == _phase_fields(q, 0), (s.number, name)
            assert [(a.event + off, a.size, a.stack) for a in p.top_allocations] == \
                   [(a.event, a.size, a.stack) for a in q.top_allocations]
            for a, b in zip(p.top_allocations, q.top_allocations):
                # freed after the last step read: not seen, so "still alive"
                assert (a.free_event + off if a.free_event is not None else None) == \
                       (b.free_event if b.free_event is not None and b.free_event < off + n else None)
    a, b = off, off + n
    assert a == mine[0].start_event and b == mine[-1].end_event + 1
    assert part.peak_bytes == max(s.peak_bytes for s in mine)
    assert np.array_equal(part.analysis.labels, full.analysis.labels[a:b])
    assert np.array_equal(part.analysis.step_of + mine[0].index, full.analysis.step_of[a:b])
    assert np.array_equal(part.analysis.timeline.active_after, full.analysis.timeline.active_after[a:b])
    assert np.array_equal(part.analysis.timeline.reserved_after, full.analysis.timeline.reserved_after[a:b])
    assert any(n.startswith("only step") for n in part.notes)


def _specs(numbers):
    lo, hi = numbers[0], numbers[-1]
    out = [str(k) for k in numbers] + [f"{lo}-{lo + 1}", f"{hi - 1}-", f"-{lo}"]
    return [s for s in out if s]


@pytest.mark.parametrize("path", PATHS, ids=ids)
def test_steps_analyse_only_those_steps_with_the_full_numbers(path, tmp_path):
    prefix = prefix_of(path)
    full = analyzed(path, "file", marker_prefix=prefix)
    trace = read_trace(path)
    index = build_index(trace, prefix)
    npz = tmp_path / "t.npz"
    save_trace(trace, npz, index)
    numbers = [s.number for s in full.steps]
    assert index.number.tolist() == numbers if index.exact else True
    for spec in _specs(numbers):
        from_pickle = phasemem.analyze(path, marker_prefix=prefix, steps=spec)
        from_npz = phasemem.analyze(npz, steps=spec)
        if not index.exact:  # inferred phases (or no optimizer to cut at): the whole trace, as before
            assert from_pickle.n_events == from_npz.n_events == full.n_events
            continue
        for part in (from_pickle, from_npz):
            assert_slice_matches(full, part)
        assert from_npz.to_dict() == from_pickle.to_dict()


# ... and traces whose steps an OOM cut short, that start mid-step, skip updates, update inside backward
EDGES = PATHS + sorted(ROOT.glob("fixtures/oom/*.pkl.xz")) + [
    ROOT / "fixtures" / d / f"{name}.pkl.xz" for d, name in (
        ("heldout6", "h6_optim_in_backward"), ("heldout8", "h8_mid_step_start"), ("heldout9", "h9_scaler_skips_first"),
        ("heldout9", "h9_train_eval_interleaved"))]


@pytest.mark.parametrize("path", EDGES, ids=ids)
def test_the_step_index_segments_a_marked_trace_as_segment_does(path):
    # the index is built from the marks alone (segment_marked), never from a whole segmentation
    prefix = prefix_of(path)
    trace = read_trace(path)
    if not can_slice(trace, prefix):
        pytest.skip("phases inferred: no step index is built from them")
    tl = Timeline.from_trace(trace)
    whole, marked = segment(trace, prefix, tl), segment_marked(trace, prefix, lambda: tl.lifetimes)
    assert whole.steps, "a marked trace has steps"
    for f in fields(Segmentation):
        a, b = getattr(whole, f.name), getattr(marked, f.name)
        if isinstance(a, np.ndarray):
            assert np.array_equal(a, b), f.name
        else:
            assert a == b, f.name


def test_slices_of_a_long_trace_equal_the_full_analysis(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_analyze import replicate_steps

    # a fixture, not ../shared: a clean checkout (CI) has only the repository
    src = ROOT / "fixtures" / "plain_gpt_foreach.pkl.xz"  # marked with gt::, as the shared ones are
    big = replicate_steps(load_snapshot(src), 12)  # 25 steps
    full = phasemem.analyze(big, marker_prefix="gt::")
    trace = Trace.from_snapshot(big)
    npz = tmp_path / "big.npz"
    save_trace(trace, npz, build_index(trace, "gt::"))
    index = read_index(npz)
    assert index.exact and len(index) == len(full.steps) == 25
    for spec in ("0", "7", "11-13", "24", "20-"):
        assert_slice_matches(full, phasemem.analyze(npz, steps=spec))
    # only those events are read: the file's event columns are mapped, and the cut copies out its steps'
    got = read(npz, steps="11-13")
    assert all(isinstance(getattr(getattr(got.trace, name).base, "obj", None), mmap.mmap) for name in EVENTS)
    part = cut(got).trace
    assert all(getattr(part, name).flags.owndata for name in EVENTS)
    assert len(part) == full.steps[13].end_event + 1 - full.steps[11].start_event


def test_steps_on_a_file_converted_for_other_markers_or_before_the_index(tmp_path):
    path = ROOT / "fixtures" / "plain_gpt_foreach.pkl.xz"  # gt:: markers; in every checkout
    trace = read_trace(path)
    old = tmp_path / "old.npz"
    save_trace(trace, old)  # no step index: a file from an older phasemem
    assert read_index(old) is None
    full = analyzed(path, "file", marker_prefix="gt::")
    assert_slice_matches(full, phasemem.analyze(old, marker_prefix="gt::", steps="1"))
    other = tmp_path / "other.npz"
    save_trace(trace, other, build_index(trace, "phasemem::"))
    assert_slice_matches(full, phasemem.analyze(other, marker_prefix="gt::", steps="1"))


def test_cli_convert_then_steps(tmp_path, capsys):
    path = ROOT / "fixtures" / "gpt_foreach.pkl.xz"
    npz, png, js = tmp_path / "t.npz", tmp_path / "m.png", tmp_path / "m.json"
    assert main(["convert", str(path), "-o", str(npz)]) == 0
    assert "3 step(s)" in capsys.readouterr().out
    assert main(["analyze", str(npz), "--steps", "1-2", "-o", str(png), "--json", str(js)]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "2 step(s)" in out and "only steps 1-2 of 3 read" in out
    png.write_bytes(b"kept")
    for bad in ("5", "3-", "2-1"):
        assert main(["analyze", str(npz), "--steps", bad, "-o", str(png)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("phasemem: error: steps=") and err.count("\n") == 1
    assert png.read_bytes() == b"kept"


def test_damaged_columnar_file_is_one_line(tmp_path, capsys):
    path = ROOT / "fixtures" / "gpt_foreach.pkl.xz"
    npz = tmp_path / "t.npz"
    assert main(["convert", str(path), "-o", str(npz)]) == 0
    data = npz.read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    capsys.readouterr()
    for args in (["--steps", "1"], []):
        assert main(["analyze", str(tmp_path / "cut.npz"), "-o", str(tmp_path / "m.png")] + args) == 2
        err = capsys.readouterr().err
        assert err.startswith("phasemem: error: ") and err.count("\n") == 1
