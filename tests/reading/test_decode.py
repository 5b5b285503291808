"""The fast decoder (phasemem.read.decoder) gives the ordinary reader's Trace, reads most events with
numpy, and gives up (the slower readers then apply) on whatever it does not know."""
import copy
import gc
import gzip
import lzma
import os
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.paths import ROOT, fixture_paths, shared_paths
from helpers.snapshots import load_snapshot
from helpers.traces import assert_same_trace
from phasemem import PhasememError
from phasemem.read import trace as read_trace
from phasemem.read.decoder import decode_trace
from phasemem.read.decoder.machine import Columns
from phasemem.read.snapshot import read_snapshot_file
from phasemem.read.trace import Trace

WILD = ROOT.parent / "shared" / "wild"
TORCH_DEFAULTS = ROOT / "fixtures" / "plain_gpt_torch_defaults.pkl.xz"  # stacks="all", C++ frames
sys.path.insert(0, str(ROOT / "benchmarks"))
from scale_snapshot import replicate, unshare  # noqa: E402


def plain(path, device=None) -> Trace:
    return Trace.from_snapshot(read_snapshot_file(path, trusted=True), device)


def write(tmp_path, snap, name="s.pickle", protocol=4, compress=None) -> Path:
    data = pickle.dumps(snap, protocol=protocol)
    p = tmp_path / name
    p.write_bytes(compress(data) if compress else data)
    return p


@pytest.fixture
def one_by_one(monkeypatch):
    """Counts the events the decoder parsed one opcode at a time (the rest: with numpy)."""
    seen = []
    add_one = Columns.add_one

    def counting(self, ev):
        seen.append(1)
        return add_one(self, ev)

    monkeypatch.setattr(Columns, "add_one", counting)
    return seen


@pytest.mark.parametrize("path", fixture_paths(), ids=lambda p: p.name.split(".")[0])
def test_every_fixture_decodes_to_the_ordinary_trace(path):
    trace = decode_trace(path, always=True)
    assert trace is not None  # all recorded by torch 2.11: the form the decoder reads
    assert_same_trace(trace, plain(path))


def _shared():
    return shared_paths() + (sorted(WILD.glob("*.pickle")) if WILD.is_dir() else [])


@pytest.mark.parametrize("path", _shared() or [None], ids=lambda p: p.name.split(".")[0] if p else "missing")
def test_shared_and_wild_snapshots_decode_or_give_way_shared(path):
    if path is None:
        pytest.skip("no ../shared snapshots")
    trace = decode_trace(path, always=True)
    try:
        want = plain(path)
    except PhasememError as e:  # no history: said the same way
        assert trace is None
        with pytest.raises(PhasememError, match=str(e).split(":")[1][:30]):
            read_trace(path)
        return
    # None: older formats (no time_us), a busier second device
    assert_same_trace(trace or read_trace(path), want)


def test_every_event_with_frame_dicts_of_its_own_reads_as_pickle_load_does(tmp_path, monkeypatch):
    """The form a snapshot has after other tools rebuilt it: no traceback or frame shared by two
    events. The decoder would parse every event one opcode at a time (48 s for 100,000 events):
    it gives way to the unpickler, and the Trace and the report are those of pickle.load."""
    import phasemem
    from phasemem.read import decoder as decode
    from phasemem.read.decoder.layout import Unprofitable

    snap = unshare(load_snapshot(TORCH_DEFAULTS))
    events = snap["device_traces"][0]
    assert len({id(e["frames"]) for e in events if e["frames"]}) == sum(1 for e in events if e["frames"])
    p = write(tmp_path, snap)
    want = plain(p)
    assert_same_trace(read_trace(p), want)
    assert_same_trace(decode_trace(p, always=True), want)  # right, only slow
    monkeypatch.setattr(decode, "HEAD", 1 << 16)  # as if the file were large: the form decides
    with pytest.raises(Unprofitable, match="new dicts"):
        decode_trace(p)
    assert_same_trace(read_trace(p), want)
    with open(p, "rb") as f:
        by_pickle = phasemem.analyze(pickle.load(f))
    assert phasemem.analyze(p).to_dict() == by_pickle.to_dict()


def test_the_decoder_gives_way_where_most_events_are_read_one_by_one(tmp_path, monkeypatch, one_by_one):
    from phasemem.read import decoder as decode
    from phasemem.read.decoder.layout import Unprofitable

    snap = unshare(load_snapshot(TORCH_DEFAULTS))
    p = write(tmp_path, snap)
    monkeypatch.setattr(decode, "HEAD", 1 << 16)
    monkeypatch.setattr(decode, "NEW_DICTS_MIN", 1 << 40)  # only the count of events read one by one
    with pytest.raises(Unprofitable, match="one opcode at a time"):
        decode_trace(p)
    assert decode.VM_EVENTS_MIN < len(one_by_one) < 2 * decode.VM_EVENTS_MIN


@pytest.mark.parametrize("share", ["torch", "lists"])
def test_a_stretched_torch_defaults_trace_is_read_with_numpy(tmp_path, share, one_by_one):
    seed = load_snapshot(TORCH_DEFAULTS)
    big = replicate(seed, 30, share=share)  # ~28k events, steps 1-2 repeated
    p = write(tmp_path, big)
    trace = decode_trace(p, always=True)
    assert trace is not None
    assert_same_trace(trace, plain(p))
    n = len(big["device_traces"][0])
    assert len(trace) == n > 25_000
    # the seed's first copy spells out its frames (read one by one); the copies are not
    assert len(one_by_one) < len(seed["device_traces"][0])


def test_annotations_after_the_events_do_not_count_as_events_with_frame_dicts(tmp_path, monkeypatch, one_by_one):
    """Every annotation is a dict, and all of them come after the events, in the list's last chunk:
    10M events of torch's form (257,926 annotations beside that chunk's 38,164 events) gave way to
    pickle.load (7 GiB) as if each event had frame dicts of its own. Here a run whose modules are
    all marked: 30 annotations where the stretched seed has one."""
    from phasemem.read import decoder as decode

    big = replicate(load_snapshot(TORCH_DEFAULTS), 30, share="torch")
    anns = big["external_annotations"]
    big["external_annotations"] = anns + [{**a, "name": f"module.{k}"} for a in anns for k in range(29)]
    n = len(big["device_traces"][0])
    assert len(big["external_annotations"]) > max(decode.NEW_DICTS_MIN, decode.NEW_DICTS_PER_EVENT * n)
    p = write(tmp_path, big)
    monkeypatch.setattr(decode, "HEAD", 1 << 16)  # as if the file were large: the events decide
    trace = decode_trace(p)
    assert trace is not None and len(trace) == n
    assert_same_trace(trace, plain(p))
    assert len(one_by_one) < len(load_snapshot(TORCH_DEFAULTS)["device_traces"][0])


def _tweak(snap, kind):
    ev = snap["device_traces"][0]
    if kind == "oom":  # an extra key: read one by one, device_free kept
        ev.insert(900, {"action": "oom", "addr": 0, "size": 1 << 34, "device_free": 5 << 20, "stream": 0,
                        "time_us": ev[900]["time_us"], "frames": []})
    elif kind == "exactly 2000 events":  # the list ends at a batch boundary
        del ev[2000:]
    elif kind == "2001 events":  # the last event alone, with APPEND
        del ev[2001:]
    elif kind == "one event":
        del ev[1:]
    elif kind == "odd integers":  # negative, 8-byte and zero-length LONG1 values
        ev[700]["size"], ev[701]["addr"], ev[702]["stream"] = -5, (1 << 63) - 1, 0
        ev[703]["time_us"], ev[704]["size"] = -(1 << 40), -(1 << 31)
    elif kind == "long strings":  # a compile_context longer than eventscan keeps
        for e in ev[100:140]:
            e["compile_context"] = "torch.compile frame 7 of a long context " + str(e["addr"])
    elif kind == "non-ascii frames":
        for e in ev[300:340]:
            e["frames"] = [{"filename": "modèle/ünï.py", "line": 3, "name": "前向"}] + list(e["frames"])
    elif kind == "a frame first seen late":
        late = {"filename": "late.py", "line": 9, "name": "late"}
        for e in ev[-300:]:
            e["frames"] = [late] + list(e["frames"])
    elif kind == "a list of 1500 frames":
        ev[500]["frames"] = [{"filename": f"f{i}.py", "line": i, "name": "deep"} for i in range(1500)]
    elif kind == "frames shared across steps":
        for e in ev[1::2]:
            e["frames"] = ev[0]["frames"]
    elif kind == "annotations use an event's string":  # the tail refers to a string made among the events
        meta = ev[1234]["user_metadata"] = "phase=backward"
        snap["external_annotations"][0]["name"] = meta
    elif kind == "the tail refers to a traceback":
        snap["phasemem"] = {**snap.get("phasemem", {}), "last_frames": ev[-1]["frames"]}
    elif kind == "no frames key":
        for e in ev:
            e.pop("frames", None)
    return snap


KINDS = ["oom", "exactly 2000 events", "2001 events", "one event", "odd integers", "long strings",
         "non-ascii frames", "a frame first seen late", "a list of 1500 frames", "frames shared across steps",
         "annotations use an event's string", "the tail refers to a traceback", "no frames key"]


@pytest.mark.parametrize("kind", KINDS)
def test_odd_events_and_layouts(tmp_path, kind):
    src = ROOT / "fixtures" / "gpt_foreach.pkl.xz"
    snap = _tweak(load_snapshot(src), kind)
    p = write(tmp_path, snap)
    want = plain(p)
    trace = decode_trace(p, always=True)
    if kind == "the tail refers to a traceback":  # the events' lists are not kept: the stream reader's job
        assert trace is None
        trace = read_trace(p)
    assert trace is not None
    assert_same_trace(trace, want)
    if kind == "oom":
        assert list(trace.oom_device_free.values()) == [5 << 20]
    if kind == "annotations use an event's string":
        assert trace.markers.name.count("phase=backward") == 1


@pytest.mark.parametrize("protocol,compress,decoded", [
    (4, None, True), (5, None, True), (4, gzip.compress, True), (4, lzma.compress, True), (2, None, False),
    (3, None, False)])
def test_protocols_and_compressions(tmp_path, protocol, compress, decoded):
    snap = load_snapshot(TORCH_DEFAULTS)
    p = write(tmp_path, snap, "s.pickle.x", protocol, compress)
    trace = decode_trace(p, always=True)
    assert (trace is not None) == decoded  # protocols 2-3 number the memo explicitly: the stream reader's
    assert_same_trace(trace or read_trace(p), plain(p))


def test_a_second_device_busier_is_left_to_the_other_readers(tmp_path):
    snap = load_snapshot(TORCH_DEFAULTS)
    ev = snap["device_traces"][0]
    snap["device_traces"] = [copy.deepcopy(ev[:50]), ev]  # another device's events share no object
    p = write(tmp_path, snap)
    assert decode_trace(p, always=True) is None
    assert_same_trace(decode_trace(p, device=0, always=True), plain(p, 0))
    assert_same_trace(read_trace(p), plain(p))


def test_truncated_or_hostile_files_are_refused_as_before(tmp_path):
    raw = pickle.dumps(load_snapshot(TORCH_DEFAULTS), protocol=4)
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(raw[: len(raw) * 2 // 3])
    assert decode_trace(cut, always=True) is None
    with pytest.raises(PhasememError, match="truncated or corrupt"):
        read_trace(cut)
    marker = Path("/tmp/phasemem-decode-pwned")
    marker.unlink(missing_ok=True)

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    snap = load_snapshot(TORCH_DEFAULTS)
    snap["device_traces"][0][600]["frames"] = [Evil()]
    p = write(tmp_path, snap, "evil.pickle")
    assert decode_trace(p, always=True) is None  # among the events: never unpickled by the decoder
    with pytest.raises(PhasememError, match="names (posix|os).system"):
        read_trace(p)
    snap = load_snapshot(TORCH_DEFAULTS)
    snap["phasemem"] = {"x": Evil()}  # after the events: the restricted unpickler refuses it
    with pytest.raises(PhasememError, match="names (posix|os).system"):
        decode_trace(write(tmp_path, snap, "evil2.pickle"), always=True)
    assert not marker.exists()
    # a persistent id of the file's own, after the events: refused as pickle.load refuses it
    data = pickle.dumps(load_snapshot(TORCH_DEFAULTS), protocol=4)
    stop = data.rindex(b".")
    bad = tmp_path / "persid.pickle"
    bad.write_bytes(data[:stop] + b"K\x07Q0" + data[stop:])
    with pytest.raises(pickle.UnpicklingError):
        pickle.loads(bad.read_bytes())
    assert decode_trace(bad, always=True) is None


def test_trusted_files_decode_with_any_global_after_the_events(tmp_path):
    snap = load_snapshot(TORCH_DEFAULTS)
    snap["phasemem"] = {**snap["phasemem"], "note": Path("x")}  # a global the restricted reader refuses
    p = write(tmp_path, snap)
    with pytest.raises(PhasememError, match="names pathlib"):
        decode_trace(p, always=True)
    trace = decode_trace(p, trusted=True, always=True)
    assert trace is not None and trace.meta["note"] == Path("x")
    assert_same_trace(trace, plain(p))


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_restored_after_reading_and_after_an_error(tmp_path, enabled):
    good = write(tmp_path, load_snapshot(TORCH_DEFAULTS))
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"\x80\x04not a pickle")
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        read_trace(good)
        assert gc.isenabled() == enabled
        with pytest.raises(PhasememError):
            read_trace(bad)
        assert gc.isenabled() == enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_event_columns_are_the_raw_values(tmp_path):
    """Independently of any reader: every column against the snapshot's own dicts."""
    snap = load_snapshot(TORCH_DEFAULTS)
    ev = snap["device_traces"][0]
    trace = decode_trace(write(tmp_path, snap), always=True)
    for key in ("addr", "size", "stream", "time_us"):
        assert trace.__dict__[key].tolist() == [e[key] for e in ev], key
    names = [trace.frames[f] for f in trace.stacks[trace.stack[0]]]
    assert names == [(f["filename"], f["line"], f["name"]) for f in ev[0]["frames"]]
    assert np.array_equal(trace.stack < 0, np.array([not e["frames"] for e in ev]))
