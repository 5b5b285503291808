"""Odd but valid traces, and random garbage: a clean PhasememError or a valid report, never a crash."""
import lzma
import pickle
import random

import pytest

import phasemem
from helpers.paths import fixture_paths, shared_paths
from helpers.raw import close
from helpers.reference import replay
from helpers.snapshots import load_snapshot
from helpers.wild import wild_path, wild_report
from phasemem import PhasememError

PATHS = shared_paths()[:1] + [p for p in fixture_paths() if p.name.startswith("gpt_foreach")]


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name.split(".")[0])
def test_oom_is_reported_with_its_phase_step_and_what_was_live(path):
    from helpers.snapshots import prefix_of

    snap = load_snapshot(path)
    prefix = prefix_of(path)
    full = phasemem.analyze(load_snapshot(path), marker_prefix=prefix)
    st = full.steps[1]
    cut = st.phases["backward"].start_event + 3  # the allocator gives up early in step 1's backward
    events = snap["device_traces"][0][:cut]
    last = events[-1]
    events.append({"action": "oom", "addr": 0, "size": 3 << 30, "stream": 0, "time_us": last["time_us"],
                   "device_free": 123 << 20, "frames": []})
    snap["device_traces"][0] = events
    report = phasemem.analyze(snap, marker_prefix=prefix)
    assert len(report.ooms) == 1
    o = report.ooms[0]
    assert (o.event, o.phase, o.step) == (cut, "backward", 1)
    assert (o.requested_bytes, o.device_free_bytes) == (3 << 30, 123 << 20)
    _, after, _ = replay(snap["device_traces"][0][:cut], [])
    # The trace now ends at the OOM, so blocks alive in the snapshot's segments are what was live
    # at the end of the full run, not at the OOM: compare the change from the first event instead.
    assert o.allocated_bytes - report.analysis.timeline.active_after[0] == after[-1] - after[0]
    assert sum(o.by_category.values()) == o.allocated_bytes
    assert "OUT OF MEMORY" in str(report)


def test_several_devices_pick_the_busiest_and_honour_device():
    snap = load_snapshot(PATHS[0])
    busy = snap["device_traces"][0]
    snap["device_traces"] = [busy[:50], busy]
    prefix = "gt::" if "gt::" in str(snap.get("external_annotations", ""))[:2000] else "phasemem::"
    r = phasemem.analyze(snap, marker_prefix=prefix)
    assert r.n_events == len(busy)
    assert phasemem.analyze(snap, device=0, marker_prefix=prefix).n_events == 50


def test_random_bytes_give_a_clean_error(tmp_path):
    rng = random.Random(1234)
    raw = lzma.decompress(PATHS[0].read_bytes())
    for k in range(40):
        kind = k % 4
        if kind == 0:
            data = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 400)))
        elif kind == 1:  # a real pickle, cut anywhere
            data = raw[: rng.randint(0, len(raw) - 1)]
        elif kind == 2:  # a real pickle with a few bytes flipped
            b = bytearray(raw)
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] = rng.getrandbits(8)
            data = bytes(b)
        else:
            data = b"\x80\x04" + bytes(rng.getrandbits(8) for _ in range(200))
        p = tmp_path / f"f{k}.pickle"
        p.write_bytes(data)
        try:
            report = phasemem.analyze(p)
        except PhasememError as e:
            assert "\n" not in str(e)
        else:
            assert report.n_events > 0


def _mutate(snap, rng):
    events = snap["device_traces"][0]
    op = rng.randrange(7)
    if op == 0:  # drop a random slice (a lost stretch of trace)
        a = rng.randrange(len(events))
        del events[a:a + rng.randint(1, 200)]
    elif op == 1:  # duplicate events (a double free, a double alloc)
        for _ in range(20):
            i = rng.randrange(len(events))
            events.insert(i, dict(events[i]))
    elif op == 2:  # nonsense field values
        for _ in range(20):
            e = events[rng.randrange(len(events))]
            e[rng.choice(["size", "addr", "time_us", "stream"])] = rng.choice([0, -1, 2**62, 7])
    elif op == 3:  # unknown actions
        for _ in range(10):
            events[rng.randrange(len(events))]["action"] = rng.choice(["weird", "segment_map", "snapshot"])
    elif op == 4:  # annotations out of balance
        anns = snap.get("external_annotations") or []
        for _ in range(min(5, len(anns))):
            anns.pop(rng.randrange(len(anns)))
    elif op == 5:  # frames of odd shape
        for _ in range(10):
            events[rng.randrange(len(events))]["frames"] = [{"filename": "x", "line": 1, "name": "y"}] * rng.randint(0, 3)
    else:  # segments garbled
        for seg in snap["segments"][:5]:
            seg["blocks"] = [{"size": 512, "state": "active_allocated"}]
    return snap


@pytest.mark.parametrize("seed", range(12))
def test_random_trace_mutations_give_an_error_or_a_valid_report(seed):
    rng = random.Random(seed)
    snap = load_snapshot(PATHS[seed % len(PATHS)])
    for _ in range(rng.randint(1, 3)):
        snap = _mutate(snap, rng)
    try:
        report = phasemem.analyze(snap)
    except PhasememError as e:
        assert "\n" not in str(e)
        return
    assert len(report.labels) == report.n_events == len(snap["device_traces"][0])
    assert sum(report.categories().values()) == report.peak_bytes
    report.to_dict()
    str(report)


@pytest.mark.parametrize("path", PATHS[-1:], ids=lambda p: p.name.split(".")[0])
def test_older_and_newer_snapshot_formats_degrade_gracefully(path):
    from helpers.snapshots import prefix_of

    snap = load_snapshot(path)
    marked = phasemem.analyze(load_snapshot(path), marker_prefix=prefix_of(path))
    # Older PyTorch: no time_us, no stream, no compile_context/user_metadata; block addresses only
    # implied by their order in the segment. Newer: keys we do not know.
    for e in snap["device_traces"][0]:
        for k in ("time_us", "stream", "compile_context", "user_metadata"):
            e.pop(k, None)
        e["some_new_field"] = {"x": 1}
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            b.pop("address", None)
        seg["future_key"] = 3
    snap["brand_new_top_level"] = []
    report = phasemem.analyze(snap, marker_prefix=prefix_of(path))
    assert report.analysis.timeline.active_after.tolist() == marked.analysis.timeline.active_after.tolist()
    assert any("no event times" in n for n in report.notes)
    # frames still tell the phases: forward, backward and optimizer are found
    assert {"forward", "backward", "optimizer"} <= set(report.phases)
    assert len(report.steps) == len(marked.steps)


# -- numbers past 64 bits ------------------------------------------------------------------------------
# torch writes addresses, sizes and times as int64; a corrupt file can hold more (8 of 100 random
# corruptions of two published snapshots did, issue 40). Each reader path says so in one line.
_I64 = 1 << 63


def _past_64_bits(snap, where):
    ev = snap["device_traces"][0]
    if where == "event size":
        ev[700]["size"] = 1 << 64
    elif where == "event address":
        ev[700]["addr"] = -_I64 - 1
    elif where == "event time":
        ev[700]["time_us"] = 1 << 100
    elif where == "segment total":
        snap["segments"][0]["total_size"] = 1 << 64
    elif where == "block address":
        snap["segments"][0]["blocks"][0].update(address=1 << 64, state="active_allocated")
    else:  # an annotation's time
        snap["external_annotations"][3]["time_us"] = 1 << 64
    return snap


PAST = ["event size", "event address", "event time", "segment total", "block address", "annotation time"]
FOREACH_XZ = [p for p in fixture_paths() if p.name == "gpt_foreach.pkl.xz"][0]


@pytest.mark.parametrize("where", PAST)
def test_a_number_past_64_bits_is_one_line_in_every_reader(tmp_path, where, capsys):
    import pickle

    from phasemem.commands.cli import main
    from phasemem.read import trace as read_trace
    from phasemem.read.batched import read_batched
    from phasemem.read.decoder import decode_trace

    snap = _past_64_bits(load_snapshot(FOREACH_XZ), where)
    with pytest.raises(PhasememError, match="too large for 64 bits") as e:  # the dict
        phasemem.analyze(snap)
    assert "\n" not in str(e.value)
    p = tmp_path / "s.pickle"
    p.write_bytes(pickle.dumps(snap, protocol=4))
    # the fast readers give way (None) or say it; the whole-pickle reader says it
    for fast in (lambda: decode_trace(p, always=True), lambda: read_batched(str(p), None, False)):
        try:
            assert fast() is None
        except PhasememError as e:
            assert "too large for 64 bits" in str(e) and "\n" not in str(e)
    with pytest.raises(PhasememError, match="too large for 64 bits"):
        read_trace(p)
    capsys.readouterr()
    assert main(["analyze", str(p), "-o", str(tmp_path / "m.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "too large for 64 bits" in err and not (tmp_path / "m.png").exists()


WILD = fixture_paths()[0].parents[1].parent / "shared" / "wild"


@pytest.mark.parametrize("name", ["silmont_mem_snapshot", "yiyi_oom"])
def test_published_snapshots_with_a_size_past_64_bits_shared(tmp_path, name):
    import pickle

    path = WILD / f"{name}.pickle"
    if not path.exists():
        pytest.skip(f"no {path}")
    snap = pickle.loads(path.read_bytes())
    snap = snap.get("snapshot", snap)
    ev = max(snap["device_traces"], key=len)
    ev[len(ev) // 2]["size"] = 1 << 64
    p = tmp_path / "s.pickle"
    p.write_bytes(pickle.dumps(snap, protocol=4))
    with pytest.raises(PhasememError, match="too large for 64 bits"):
        phasemem.analyze(p)


def test_garbled_segments_of_a_snapshot_without_history_are_one_line(tmp_path):
    """What was alive is read from the segments' blocks and their frames; frames that are no frames
    (a corrupt file: 12 of 400 random byte flips in four published snapshots) are said in one line."""
    snap = load_snapshot(FOREACH_XZ)
    snap["device_traces"] = [[]]
    blk = next(b for seg in snap["segments"] for b in seg["blocks"] if b.get("state") == "active_allocated")
    blk["frames"] = [7, None]
    with pytest.raises(PhasememError, match="segments are malformed") as e:
        phasemem.analyze(snap)
    assert "\n" not in str(e.value)


def test_odd_traces_streams_cudagraph_expandable():
    """Recorded on the H200: a side stream with record_stream (frees requested and completed apart),
    a CUDA-graphed model (replays allocate nothing; the optimizer still does), expandable segments
    (segment_map instead of segment_alloc)."""
    from helpers.paths import FIXTURES
    from helpers.reference import replay

    for name in ("odd_streams", "odd_cudagraph", "odd_expandable"):
        snap = load_snapshot(FIXTURES / f"{name}.pkl.xz")
        report = phasemem.analyze(snap)
        _, curve, _ = replay(snap["device_traces"][0], snap["segments"])
        assert report.analysis.timeline.active_after.tolist() == curve
        assert len(report.steps) == 3 and all(s.complete for s in report.steps)
        # reserved memory ends where the snapshot's segments say, expandable segments included
        assert report.analysis.timeline.reserved_after[-1] == sum(s["total_size"] for s in snap["segments"])
        if name == "odd_cudagraph":
            assert all(st.phases["forward"].n_events == 0 for st in report.steps[1:])
            assert report.patterns_of("gradients") == []  # the graph writes them into its own pool
            state = report.patterns_of("optimizer_state_init")
            assert state and close(state[0].bytes, 2 * snap["phasemem"]["meta"]["param_bytes"])
        else:
            assert report.patterns_of("logits") and report.patterns_of("gradients")


def test_default_device_is_where_the_memory_is():
    """layoutedit_dump: one trace entry on each of two devices, every segment on cuda:1."""
    raw = pickle.loads(wild_path("layoutedit_dump").read_bytes())
    devices = {s["device"] for s in raw["segments"]}
    assert devices == {1}
    assert wild_report("layoutedit_dump").device == "cuda:1"
