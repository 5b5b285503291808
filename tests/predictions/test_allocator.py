"""phasemem.predictions.allocator, PyTorch's caching allocator replayed over a trace, checked three ways:

- against the recorded traces themselves: with the trace's own segment addresses (the driver's choice,
  which decides ties between free blocks of one size) every allocation is served at its recorded
  address, and the segments made and given back, and the reserved bytes after every event, are the
  trace's (recomputed here from its raw segment events and the snapshot's segments);
- against rules computed by hand (pools, splitting, the 20 MiB buffer, the cap, streams);
- against real runs under a capped card (fixtures/capacity*, record_capacity.py on an H200): at each
  run's size the replay fits where the run did, with its peak reserved bytes, and runs out where it
  did, asking for the segment torch's error message names; and --fits' largest batch or sequence runs.
"""
import functools
import json
import math
import re

import numpy as np
import pytest

import phasemem
from helpers.paths import FIXTURES
from helpers.snapshots import load_snapshot
from phasemem.analysis.timeline import Timeline
from phasemem.predictions.allocator.layout import block_streams, empty_cache_events, layout_at
from phasemem.predictions.allocator.over_events import replay, replay_trace
from phasemem.predictions.allocator.pools import CachingAllocator
from phasemem.predictions.allocator.rules import Settings
from phasemem.predictions.blocks import Change, Facts
from phasemem.predictions.fits import fits
from phasemem.predictions.fits.bounds import _blocks
from phasemem.predictions.fits.capped import FACTOR_PRECISION, _Capped
from phasemem.predictions.scaling import CONSTANT
from phasemem.read.trace import A, Trace
from phasemem.units import format_bytes

MiB = 1 << 20
CAPACITY = ("capacity", "capacity2", "capacity3")
BASES = [f"{run}/{fam}__base" for run in CAPACITY for fam in ("gpt", "llama", "vit")
         if (FIXTURES / run / f"{fam}__base.pkl.xz").exists()]
SINGLE = [f"plans/{fam}__single_fp32__n1_r0__b{b}" for fam, b in (("gpt", 4), ("vit", 32), ("bert", 8), ("llama", 8))]
#: traces whose segments the replay reproduces: the capped bases, one-GPU plans runs, segments given
#: back by empty_cache or an out-of-memory retry (oom_fix_ckpt), several streams (odd_streams), a CNN
RECORDED = BASES + SINGLE + ["oom/oom_fix_ckpt", "odd_streams", "vit_adamw", "resnet_sgd", "llama_hf_ckpt_bf16"]
#: With its own addresses for new segments (each below the last) the replay's peak reserved bytes are
#: within this share of the trace's on these traces (worst: plans/llama__single_fp32__n1_r0__b4, +2.9 %,
#: two 20 MiB segments fewer and a 126 MiB one more after a tie went the other way).
OWN_ADDRESSES = 0.03


@functools.lru_cache(maxsize=None)
def _trace(name: str):
    snap = load_snapshot(FIXTURES / f"{name}.pkl.xz")
    t = Trace.from_snapshot(snap)
    return snap, t, Timeline.from_trace(t).lifetimes


@functools.lru_cache(maxsize=None)
def _report(name: str):
    return phasemem.analyze(str(FIXTURES / f"{name}.pkl.xz"))


def _recorded_reserved(snap: dict, t: Trace) -> np.ndarray:
    """Reserved bytes after every event, from the raw events: the snapshot's segments at the end, the
    trace's segment_alloc and segment_free walked back to its start and forward again."""
    sign = np.where(t.action == A["segment_alloc"], 1, np.where(t.action == A["segment_free"], -1, 0))
    change = np.cumsum(sign * t.size)
    end = sum(s["total_size"] for s in snap["segments"] if s.get("device", 0) == t.device)
    return end - change[-1] + change


@pytest.mark.parametrize("name", RECORDED)
def test_the_replay_serves_every_allocation_where_the_trace_did(name):
    snap, t, life = _trace(name)
    r = replay_trace(t, life, recorded_addresses=True, record_addresses=True)
    made = np.flatnonzero(t.action == A["alloc"])
    assert r.oom_event is None
    assert np.array_equal(r.alloc_event, made)
    assert np.array_equal(r.alloc_addr, t.addr[made])
    seg = np.flatnonzero(np.isin(t.action, [A["segment_alloc"], A["segment_free"]]))
    assert np.array_equal(r.segment_size, np.where(t.action[seg] == A["segment_alloc"], t.size[seg], -t.size[seg]))
    # after every allocation and free, the same bytes reserved
    mem = np.flatnonzero(np.isin(t.action, [A["alloc"], A["free_completed"], A["free"]]))
    assert np.array_equal(r.reserved_after(len(t))[mem], _recorded_reserved(snap, t)[mem])


@pytest.mark.parametrize("name", RECORDED)
def test_with_its_own_addresses_the_replay_reserves_what_the_trace_did(name):
    snap, t, life = _trace(name)
    r = replay_trace(t, life)
    want = int(_recorded_reserved(snap, t).max())
    assert abs(r.reserved_peak - want) <= OWN_ADDRESSES * want
    if name in BASES:  # these reproduce every segment, in order
        seg = np.flatnonzero(t.action == A["segment_alloc"])
        assert np.array_equal(r.segment_size, t.size[seg])


@pytest.mark.parametrize("name", BASES[:3] + SINGLE[:2])
def test_a_replay_from_any_step_starts_from_the_state_the_trace_was_in(name):
    """layout_at: the snapshot's segments walked back to a step's first event, the blocks alive then
    at their addresses; replayed from there, the trace's own segment events follow."""
    snap, t, life = _trace(name)
    steps = _report(name).analysis.segmentation.steps
    settings = Settings.of(t)
    for first, _, _ in steps[1:]:
        lay = layout_at(t, life, first)
        assert not len(lay.unplaced)
        r = replay(life.alloc_event, life.free_event, life.size, block_streams(t, life), lay, None, settings,
                   first, len(t), empty_cache_at=empty_cache_events(t))
        seg = np.flatnonzero(t.action[first:] == A["segment_alloc"]) + first
        assert np.array_equal(r.segment_size, t.size[seg])
        assert r.reserved_start == _recorded_reserved(snap, t)[first - 1]


def test_the_rules_by_hand():
    a = CachingAllocator()
    assert a.malloc(0, 3 * MiB, 0) and a.reserved == 20 * MiB  # under 10 MiB: a 20 MiB buffer, 17 MiB split off
    assert a.malloc(1, 16 * MiB, 0) and a.reserved == 20 * MiB  # served by those 17 MiB; 1 MiB left, not split
    assert a.malloc(2, 2 * MiB, 0) and a.reserved == 40 * MiB  # nothing free: a second buffer, 18 MiB left
    assert a.malloc(3, 12 * MiB + 1, 0) and a.reserved == 40 * MiB  # from the 18 MiB; 6 MiB - 512 B split off
    assert a.malloc(4, 11 * MiB, 0) and a.reserved == 52 * MiB  # 10 MiB or more: its size rounded up to 2 MiB
    for i in range(4):  # the small pool: 600 KiB each, three to a 2 MiB segment
        assert a.malloc(10 + i, 600 << 10, 0)
    assert a.reserved == 56 * MiB
    assert a.malloc(20, 600 << 10, stream=7) and a.reserved == 58 * MiB  # another stream: a segment of its own
    a.free(1)  # the 17 MiB block is cached
    assert a.malloc(21, 16 * MiB, 0) and a.reserved == 58 * MiB  # and serves the same request again
    a.free(21)
    assert a.malloc(22, 17 * MiB + 1, 0) and a.reserved == 76 * MiB  # 512 B too many: a new 18 MiB segment
    a.free(0)  # merged with the cached 17 MiB: the first buffer holds nothing in use
    a.release_cached()  # torch.cuda.empty_cache(): only that buffer goes back
    assert a.reserved == 56 * MiB and a.log[-1] == -20 * MiB

    capped = CachingAllocator(cap=60 * MiB)
    assert capped.malloc(0, 30 * MiB, 0)
    capped.free(0)  # cached: 30 MiB reserved, none in use
    assert capped.malloc(1, 40 * MiB, 0) and capped.reserved == 40 * MiB  # 70 > 60: the cached one went back
    assert capped.log == [30 * MiB, -30 * MiB, 40 * MiB]
    assert not capped.malloc(2, 21 * MiB, 0) and capped.oom_size == 22 * MiB  # 40 + 22 > 60, nothing to give back
    assert capped.malloc(3, 20 * MiB, 0) and capped.reserved == 60 * MiB  # exactly the cap fits


def _capacity_runs():
    out = []
    for run in CAPACITY:
        path = FIXTURES / run / "capacity.json"
        if not path.exists():
            continue
        for fam, res in json.loads(path.read_text())["results"].items():
            for axis in ("batch", "sequence"):
                for one in res["under_cap"].get(axis, {}).get("runs", []):
                    out.append((run, fam, axis, one["batch"] if axis == "batch" else one["seq"]))
    return out


@functools.lru_cache(maxsize=None)
def _capped(run: str, fam: str):
    r = _report(f"{run}/{fam}__base")
    f = Facts(r.analysis, r.patterns)
    return _Capped.of(f, []), _blocks(f, []), json.loads((FIXTURES / run / "capacity.json").read_text())["results"][fam]


#: The one run the replay gets wrong: capacity3's ViT at batch 19 ran out asking for 58 MiB; the replay
#: fits, 12 MiB under the cap (at batch 18 the run allocated 920.7 MiB at its peak, the replay 896: a
#: 25 MiB block growing with the batch that the base trace at batch 4 does not show).
REPLAY_MISSES = {("capacity3", "vit", "batch", 19)}


@pytest.mark.parametrize("run,fam,axis,size", _capacity_runs())
def test_at_each_capped_runs_size_the_replay_does_what_the_run_did(run, fam, axis, size):
    capped, blocks, res = _capped(run, fam)
    cfg = res["base"]["config"]
    one = next(o for o in res["under_cap"][axis]["runs"] if (o["batch"] if axis == "batch" else o["seq"]) == size)
    factor = size / (cfg["batch"] if axis == "batch" else cfg["seq"])
    r = capped.run(*blocks, res["cap_bytes"], factor, axis)
    if (run, fam, axis, size) in REPLAY_MISSES:
        assert one["oom"] and r.oom_event is None
        return
    if one["oom"]:
        tried = re.search(r"Tried to allocate ([\d.]+) ([GM]iB)", one["message"])
        assert r.oom_event is not None
        assert format_bytes(r.oom_size).replace(".0 ", ".00 ") == f"{tried.group(1)} {tried.group(2)}"
    else:
        assert r.oom_event is None
        assert abs(r.reserved_peak - one["peak_reserved"]) <= 16 * MiB  # measured: at most 10 MiB apart


@functools.lru_cache(maxsize=None)
def _fits(run: str, fam: str, cap: int):
    return _report(f"{run}/{fam}__base").fits(cap)


def _limits():
    out = []
    for run in CAPACITY:
        path = FIXTURES / run / "capacity.json"
        if not path.exists():
            continue
        for fam, res in json.loads(path.read_text())["results"].items():
            for axis in ("batch", "sequence"):
                if "runs" in res["under_cap"].get(axis, {}):
                    out.append((run, fam, axis))
    return out


@pytest.mark.parametrize("run,fam,axis", _limits())
def test_fits_names_a_size_that_ran_within_5_percent_of_the_largest(run, fam, axis):
    """The largest batch (or sequence, in steps of 64 as the runs tried it) --fits names ran under the
    cap, and is within 5 % of the largest that did; where it is further, the replay saw a gap (a size
    between that runs out) and says that larger sizes fit again up to the real limit."""
    _, _, res = _capped(run, fam)
    cfg = res["base"]["config"]
    fit = getattr(_fits(run, fam, res["cap_bytes"]), axis)
    field, unit, now = ("batch", 1, cfg["batch"]) if axis == "batch" else ("seq", 64, cfg["seq"])
    runs = sorted(res["under_cap"][axis]["runs"], key=lambda o: o[field])
    first_oom = min(o[field] for o in runs if o["oom"])
    ran = [o[field] for o in runs if not o["oom"] and o[field] < first_oom]
    predicted = math.floor(now * fit.largest_factor / unit + 1e-9) * unit
    assert predicted < first_oom
    assert all(not o["oom"] for o in runs if o[field] <= predicted)
    if ran:
        real = max(ran)
        assert predicted <= real
        if predicted < 0.95 * real:
            assert fit.fits_again and fit.fits_again[0] * now <= real <= fit.fits_again[1] * now + unit


def test_a_plans_added_buffer_is_replayed_with_the_rest():
    """fits(changes=...): a block of 1 GiB held from the start (a parallel plan's buffer, say) pins a
    segment of its own; the replay then is the one without it under a budget 1 GiB smaller."""
    r = _report("capacity3/gpt__base")
    f = Facts(r.analysis, r.patterns)
    extra = Change(f.size.copy(), f.free.copy(), "a buffer held throughout",
                   added=(np.array([-1]), np.array([f.n]), np.array([1 << 30])), added_kind=np.array([CONSTANT], np.int8))
    cap = 8 << 30
    capped, blocks = _Capped.of(f, []), _blocks(f, [])
    with_it = _blocks(f, [extra])
    for x in (2.0, 3.0, 3.2, 3.4):
        a, b = capped.run(*with_it, cap, x, "batch"), capped.run(*blocks, cap - (1 << 30), x, "batch")
        assert (a.oom_event, a.oom_size, a.reserved_peak) == (b.oom_event, b.oom_size, b.reserved_peak + (1 << 30))
    got = fits(r.analysis, r.patterns, cap, changes=[extra]).batch
    want = fits(r.analysis, r.patterns, cap - (1 << 30)).batch
    assert got.largest_factor == pytest.approx(want.largest_factor, rel=2 * FACTOR_PRECISION)
    assert got.fails_at["event"] == want.fails_at["event"] and got.fails_at["request_bytes"] == want.fails_at["request_bytes"]
    assert got.largest_factor_allocated == pytest.approx(want.largest_factor_allocated, abs=1e-3)


@pytest.mark.parametrize("name,why", [("odd_expandable", "expandable segments"),
                                      ("heldout12/h12_hf_static_generate", "private memory pools")])
def test_what_the_replay_does_not_follow_is_not_replayed_and_fits_says_so(name, why):
    """Expandable segments (pages mapped into one segment per stream), and allocations inside a CUDA
    graph's private pool: the budget is read against the trace's reserve instead, and said to be."""
    r = phasemem.analyze(str(FIXTURES / f"{name}.pkl.xz"))
    assert why in Settings.of(r.analysis.trace)
    fx = r.fits(2 * r.peak_bytes)
    assert why in fx.allocator
    for fit in (fx.batch, fx.sequence):
        if fit.applies:
            assert any("not replayed" in w and why in w for w in fit.why) and fit.fails_at is None


def test_a_graphs_private_pool_is_kept_reserved_and_unused():
    """odd_cudagraph: segments of a captured graph's pool that the trace does not allocate in count as
    reserved and serve nothing; its allocations are served where it served them."""
    snap, t, life = _trace("odd_cudagraph")
    assert t.segments[:, 3].any()
    r = replay_trace(t, life, recorded_addresses=True, record_addresses=True)
    made = np.flatnonzero(t.action == A["alloc"])
    assert np.array_equal(r.alloc_addr, t.addr[made])
    private = t.segments[t.segments[:, 3] != 0]
    inside = (t.addr[made][:, None] >= private[:, 0]) & (t.addr[made][:, None] < private[:, 0] + private[:, 1])
    assert not inside.any()
    sign = np.where(t.action == A["segment_alloc"], 1, np.where(t.action == A["segment_free"], -1, 0))
    at_start = sum(s["total_size"] for s in snap["segments"]) - int((sign * t.size).sum())
    assert r.reserved_start == at_start  # the pool's segments among them
