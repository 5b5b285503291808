"""Live memory of snapshots without allocation history (phasemem.read.live, phasemem.reporters.picture.live).

The wild files lie in ../shared/wild (never committed); those tests skip where it is absent. Every
number they check is recomputed here from the raw pickle with plain loops, and checked against the
aggregates torch itself wrote into each segment, never taken from phasemem.
"""
from __future__ import annotations

import os
import pickle
import re
from collections import Counter

import pytest
from matplotlib import image as mpimg

import phasemem
from helpers.paths import WILD
from helpers.snapshots import heldout
from helpers.wild import wild_path, wild_report
from phasemem.errors import PhasememError
from phasemem.read.live import LiveMemory, category_of, live_memory, site_of
from phasemem.reporters.picture.live import TITLE, draw_live, plot_live

WITH_SEGMENTS = ["yiyi_oom", "yiyi_opt1.3b", "yiyi_opt1.3b_log1", "diffusion_mysnap", "sketchkv_mysnap",
                 "layoutedit_dump", "layoutedit_memsnap"]
HELD = ("active_allocated", "active_pending_free")
LIB = "/env/lib/python3.11/site-packages/torch/"


def _raw(name: str):
    path = WILD / f"{name}.pickle"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    with open(path, "rb") as f:
        return pickle.load(f)


def _segments(raw):
    return raw if isinstance(raw, list) else raw["segments"]


def _frames(block):
    if "history" in block:  # torch 2.0: the first history entry is the current allocation
        return block["history"][0]["frames"] if block["history"] else []
    return block.get("frames") or []


def _expected(raw, device):
    alloc = reserved = free = n = 0
    for seg in _segments(raw):
        if seg["device"] != device:
            continue
        reserved += seg["total_size"]
        for b in seg["blocks"]:
            if b["state"] in HELD:
                alloc += b.get("requested_size", b["size"])
                n += 1
            else:
                free += b["size"]
    return alloc, reserved, free, n


@pytest.mark.parametrize("name", WITH_SEGMENTS)
def test_wild_totals_match_a_plain_loop_and_torchs_own_aggregates(name):
    raw = _raw(name)
    live = live_memory(raw)
    assert (live.allocated_bytes, live.reserved_bytes, live.cached_free_bytes, live.n_blocks) == \
        _expected(raw, live.device)
    segs = [s for s in _segments(raw) if s["device"] == live.device]
    # torch writes each segment's requested_size (allocated blocks) and total_size itself
    assert live.allocated_bytes == sum(s["requested_size"] for s in segs)
    assert live.reserved_bytes == live.allocated_bytes + live.cached_free_bytes + sum(
        b["size"] - b["requested_size"] for s in segs for b in s["blocks"] if b["state"] in HELD)
    assert [b.requested_size for b in live.blocks] == sorted((b.requested_size for b in live.blocks), reverse=True)
    assert sum(n for _, n, _ in live.by_site) == live.allocated_bytes
    assert sum(c for _, _, c in live.by_site) == live.n_blocks
    assert sum(live.by_category.values()) == live.allocated_bytes


@pytest.mark.parametrize("name", WITH_SEGMENTS)
def test_wild_device_is_the_one_holding_the_memory(name):
    raw = _raw(name)
    live = live_memory(raw)
    held = {}
    for seg in _segments(raw):
        held[seg["device"]] = held.get(seg["device"], 0) + sum(
            b.get("requested_size", b["size"]) for b in seg["blocks"] if b["state"] in HELD)
    assert live.device == max(held, key=held.get)
    assert set(live.devices) == set(held)
    assert {d: a for d, (a, _) in live.devices.items()} == held


def test_layoutedit_dump_is_read_on_cuda1_where_every_segment_is():
    raw = _raw("layoutedit_dump")
    assert len(raw["device_traces"]) == 2  # a trace entry on cuda:0 too, but no memory there
    live = live_memory(raw)
    assert live.device == 1 and list(live.devices) == [1]
    assert live.allocated_bytes == _expected(raw, 1)[0] > 0
    empty = live_memory(raw, device=0)
    assert (empty.device, empty.allocated_bytes, empty.reserved_bytes, empty.blocks) == (0, 0, 0, [])


def test_bare_segment_list_is_read():
    raw = _raw("layoutedit_memsnap")
    assert isinstance(raw, list) and len(raw) == 255
    live = live_memory(raw)
    assert live.device == 1
    assert live.allocated_bytes == _expected(raw, 1)[0]
    assert live.n_blocks == sum(b["state"] in HELD for s in raw for b in s["blocks"])


def test_empty_snapshot_gives_an_empty_live_memory_and_a_picture(tmp_path):
    raw = _raw("hitsbe_mysnap")
    assert raw["segments"] == []
    live = live_memory(raw)
    assert (live.allocated_bytes, live.reserved_bytes, live.cached_free_bytes, live.n_blocks) == (0, 0, 0, 0)
    assert (live.blocks, live.by_site, live.by_category, live.devices, live.has_frames) == ([], [], {}, {}, False)
    out = tmp_path / "empty.png"
    draw_live(live, out, size=(640, 360))
    assert mpimg.imread(out).shape[:2] == (360, 640)


@pytest.mark.parametrize("name", WITH_SEGMENTS)
def test_wild_sites_are_the_innermost_user_frame(name):
    raw = _raw(name)
    live = live_memory(raw)
    by_addr = {b.address: b for b in live.blocks}
    checked = 0
    for seg in _segments(raw):
        if seg["device"] != live.device:
            continue
        addr = seg["address"]
        for b in seg["blocks"]:
            start, addr = b.get("address", addr), b.get("address", addr) + b["size"]
            if b["state"] not in HELD:
                continue
            frames = _frames(b)
            got = by_addr[start]
            if not frames:
                assert got.site is None
                continue
            user = [f for f in frames if "site-packages" not in f["filename"]
                    and "/torch/" not in f["filename"].replace("\\", "/")]
            assert user, "every stack of these files reaches the user's code"
            f = user[0]
            base = f["filename"].replace("\\", "/").rsplit("/", 1)[-1]
            assert got.site == f"{f['name']} ({base}:{f['line']})"
            checked += 1
    assert checked > 0
    assert live.has_frames and live.by_site[0][1] > 0


TOP_SITE = {  # the largest site of each file, read off the raw frames by the loop above
    "yiyi_oom": "allocate (pytorch_backend.py:190)",
    "yiyi_opt1.3b": "allocate (pytorch_backend.py:195)",
    "layoutedit_dump": "lcm_diffusion_step (ptp_utils.py:258)",
}


@pytest.mark.parametrize("name", sorted(TOP_SITE))
def test_wild_top_site(name):
    assert live_memory(_raw(name)).by_site[0][0] == TOP_SITE[name]


def _rule(frames):
    for f in frames:
        fn = f["filename"].replace("\\", "/")
        if "/torch/optim/" in fn:
            return "optimizer_state"
        if fn.endswith("torch/nn/modules/module.py") and f["name"] in ("_apply", "load_state_dict",
                                                                      "_load_from_state_dict"):
            return "parameter"
    return "unknown"


@pytest.mark.parametrize("name", WITH_SEGMENTS)
def test_wild_categories_only_where_the_stack_says(name):
    raw = _raw(name)
    live = live_memory(raw)
    want = {}
    for seg in _segments(raw):
        if seg["device"] == live.device:
            for b in seg["blocks"]:
                if b["state"] in HELD:
                    cat = _rule(_frames(b))
                    want[cat] = want.get(cat, 0) + b.get("requested_size", b["size"])
    assert live.by_category == want
    if name != "diffusion_mysnap":  # no stack of the others passes model.to() or torch.optim
        assert set(live.by_category) == {"unknown"}


def test_diffusion_parameters_are_the_blocks_made_by_module_apply():
    raw = _raw("diffusion_mysnap")
    moved = sum(b["requested_size"] for s in raw["segments"] for b in s["blocks"] if b["state"] in HELD
                and any(f["name"] == "_apply" and f["filename"].endswith("module.py") for f in b["frames"]))
    assert moved > 0
    assert live_memory(raw).by_category["parameter"] == moved


@pytest.mark.parametrize("name", WITH_SEGMENTS)
def test_wild_picture_is_the_size_asked(name, tmp_path):
    live = live_memory(_raw(name))
    for size in ((1600, 900), (481, 271)):
        out = tmp_path / f"{name}-{size[0]}.png"
        draw_live(live, out, size=size)
        assert mpimg.imread(out).shape[:2] == (size[1], size[0])
    assert sorted(os.listdir(tmp_path)) == sorted(f"{name}-{w}.png" for w in (1600, 481))  # no temp file left


# -- hand-built: no shared files needed -------------------------------------------------------------

def _frame(filename, line, name):
    return {"filename": filename, "line": line, "name": name}


USER = _frame("/home/me/train.py", 40, "main")
TO = [_frame(LIB + "nn/modules/module.py", 1326, "convert"), _frame(LIB + "nn/modules/module.py", 900, "_apply"),
      _frame("/home/me/train.py", 12, "build")]
ADAM = [_frame(LIB + "optim/adam.py", 160, "_init_group"), _frame(LIB + "optim/optimizer.py", 480, "wrapper"),
        _frame("/home/me/train.py", 30, "step")]
ACT = [_frame(LIB + "nn/functional.py", 2561, "linear"), USER]


def _handbuilt():
    seg0 = {"device": 0, "address": 1000, "total_size": 1000, "blocks": [
        {"address": 1000, "size": 512, "requested_size": 500, "state": "active_allocated", "frames": TO},
        {"address": 1512, "size": 256, "requested_size": 256, "state": "active_pending_free", "frames": ADAM},
        {"address": 1768, "size": 232, "requested_size": 0, "state": "inactive", "frames": []},
    ]}
    # torch 2.0 layout: no block address, the stack under history; one block without requested_size
    seg1 = {"device": 0, "address": 5000, "total_size": 300, "blocks": [
        {"size": 100, "state": "inactive", "history": [{"addr": 4000, "real_size": 90, "frames": TO}]},
        {"size": 200, "requested_size": 150, "state": "active_allocated",
         "history": [{"addr": 5100, "real_size": 150, "frames": ACT}]},
    ]}
    seg2 = {"device": 1, "address": 9000, "total_size": 4096, "blocks": [
        {"address": 9000, "size": 4096, "state": "active_allocated", "frames": []}]}
    return {"segments": [seg0, seg1, seg2], "device_traces": [[{"action": "snapshot"}], []]}


def test_handbuilt_snapshot():
    snap = _handbuilt()
    live = live_memory(snap)
    # cuda:1 holds 4,096 bytes in one block, cuda:0 holds 500 + 256 + 150: the default is cuda:1
    assert live.devices == {0: (906, 1300), 1: (4096, 4096)}
    assert live.device == 1 and live.allocated_bytes == 4096 and not live.has_frames
    assert live.blocks[0].requested_size == 4096  # no requested_size: size is counted
    assert live.by_site == [(None, 4096, 1)] and live.by_category == {"unknown": 4096}

    live = live_memory(snap, device=0)
    assert isinstance(live, LiveMemory) and live.has_frames
    assert (live.allocated_bytes, live.reserved_bytes, live.cached_free_bytes, live.n_blocks) == (906, 1300, 332, 3)
    assert [(b.address, b.size, b.requested_size, b.state) for b in live.blocks] == [
        (1000, 512, 500, "active_allocated"), (1512, 256, 256, "active_pending_free"),
        (5100, 200, 150, "active_allocated")]  # 5100: laid out after the 100-byte inactive block
    assert [b.category for b in live.blocks] == ["parameter", "optimizer_state", "unknown"]
    assert [b.site for b in live.blocks] == ["build (train.py:12)", "step (train.py:30)",
                                             "main (train.py:40)"]
    assert live.blocks[0].stack[0] == (LIB + "nn/modules/module.py", 1326, "convert")
    assert live.by_category == {"parameter": 500, "optimizer_state": 256, "unknown": 150}
    assert [s for s, _, _ in live.by_site] == ["build (train.py:12)", "step (train.py:30)",
                                               "main (train.py:40)"]
    assert live_memory(snap["segments"], device=0) == live  # the bare list reads the same
    assert live_memory({"snapshot": snap, "meta": {}}, device=0) == live


def test_handbuilt_sites_and_categories():
    win = ("C:\\env\\Lib\\site-packages\\torch\\nn\\functional.py", 9, "linear")
    assert site_of((win, ("D:\\work\\unet.py", 134, "forward"))) == "forward (D:/work/unet.py:134)"
    assert site_of(((LIB + "nn/functional.py", 9, "linear"),)) == "linear (torch/nn/functional.py:9)"
    lib_only = ((LIB + "nn/functional.py", 9, "linear"), ("/env/site-packages/diffusers/lora.py", 430, "forward"))
    assert site_of(lib_only) == "forward (diffusers/lora.py:430)"  # no user frame: the first outside torch
    assert site_of(()) is None
    # the innermost rule decides; a user's own function called load_state_dict says nothing
    assert category_of((("/home/me/ckpt.py", 3, "load_state_dict"),)) == "unknown"
    assert category_of(((LIB + "optim/optimizer.py", 800, "load_state_dict"),
                        (LIB + "nn/modules/module.py", 2100, "load_state_dict"))) == "optimizer_state"
    assert category_of(((LIB + "nn/modules/module.py", 2050, "_load_from_state_dict"),)) == "parameter"
    assert category_of(((LIB + "nn/modules/module.py", 1520, "_call_impl"),)) == "unknown"  # a forward


def test_handbuilt_bad_input():
    for bad in (None, 3, "snapshot.pickle", {"device_traces": []}, {"segments": {}}, [{"device": 0}],
                [{"device": 0, "address": 0, "total_size": 8, "blocks": [{"state": "inactive"}]}]):
        with pytest.raises(PhasememError):
            live_memory(bad)
    for dev in (-1, 1.0, True, "0"):
        with pytest.raises(ValueError):
            live_memory(_handbuilt(), device=dev)


def test_handbuilt_picture(tmp_path):
    live = live_memory(_handbuilt(), device=0)
    fig = plot_live(live, size=(800, 450))
    texts = " ".join(t.get_text() for t in fig.texts)
    assert TITLE in texts and "cuda:0" in texts and "906 B allocated" in texts and "1.27 KiB reserved" in texts
    assert [r[:3] for r in fig.phasemem_rows] == [("build (train.py:12)", 500, 1),
                                                  ("step (train.py:30)", 256, 1),
                                                  ("main (train.py:40)", 150, 1)]
    for size in ((800, 450), (480, 270), (1333, 777)):
        out = tmp_path / f"live-{size[0]}.png"
        draw_live(live, out, size=size, dpi=72)
        assert mpimg.imread(out).shape[:2] == (size[1], size[0])
    draw_live(live, tmp_path / "live.svg")
    assert (tmp_path / "live.svg").read_text().lstrip().startswith("<?xml")
    with pytest.raises(PhasememError):
        draw_live(live, tmp_path / "live.txt")
    with pytest.raises(ValueError):
        draw_live(live, tmp_path / "tiny.png", size=(100, 100))


def test_handbuilt_rest_is_summed_as_other_sites():
    blocks = [{"address": 100 * i, "size": 100, "requested_size": 100 - i, "state": "active_allocated",
               "frames": [_frame("/home/me/model.py", i, f"f{i}")]} for i in range(30)]
    live = live_memory([{"device": 0, "address": 0, "total_size": 3000, "blocks": blocks}])
    rows = plot_live(live, size=(1600, 900)).phasemem_rows
    assert len(rows) == 16 and rows[-1][0] == "other sites (15)"
    assert rows[-1][1:3] == (sum(100 - i for i in range(15, 30)), 15)
    assert sum(r[1] for r in rows) == live.allocated_bytes
    # a short picture holds fewer rows: the rest is still summed, nothing drawn over anything
    small = plot_live(live, size=(480, 270)).phasemem_rows
    assert 1 < len(small) < 16 and sum(r[1] for r in small) == live.allocated_bytes


def test_state_only_snapshot_names_its_sites_from_the_frames():
    """enabled="state" keeps no history: the report says how it was taken (not the legacy call, which
    records a trace), and a block made by backward on the autograd thread (C++ frames only) is
    listed under the autograd node its frames name, as many bytes as the raw blocks hold."""
    snap = heldout("h7_state_only")
    node = re.compile(r"^torch::autograd::generated::(\w+)::apply\(")
    want: Counter = Counter()
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            fr = b.get("frames") or []
            if b["state"] == "active_allocated" and fr and not any(f["filename"].endswith(".py") for f in fr):
                names = [m.group(1) for f in fr if (m := node.match(f["name"]))]
                if names:
                    want[f"{names[0]} (backward, autograd thread)"] += b["requested_size"]
    assert len(want) >= 3
    r = phasemem.analyze(snap)
    assert r.live is not None
    text = str(r)
    assert 'enabled="state"' in text and "legacy" not in text
    got = {site: n for site, n, _ in r.live.by_site}
    for site, n in want.items():
        assert got.get(site) == n, site


LEGACY = ["yiyi_oom", "yiyi_opt1.3b", "yiyi_opt1.3b_log1", "diffusion_mysnap", "sketchkv_mysnap", "layoutedit_dump",
          "layoutedit_memsnap"]


@pytest.mark.parametrize("name", LEGACY)
def test_legacy_snapshots_say_they_hold_no_history(name):
    """Legacy recordings (one trace entry) and a bare segment list: the report says there is no history
    and gives the live memory, the active blocks' bytes counted here from the raw pickle."""
    raw = pickle.loads(wild_path(name).read_bytes())
    segments = raw if isinstance(raw, list) else raw["segments"]
    r = wild_report(name)
    assert r.live is not None and not r.steps and not r.patterns
    dev = r.live.device
    want = sum(b.get("requested_size", b["size"]) for s in segments if s["device"] == dev for b in s["blocks"]
               if b["state"] in ("active_allocated", "active_pending_free"))
    assert r.live.allocated_bytes == want == r.peak_bytes
    assert str(r).splitlines()[0].endswith("this snapshot holds no allocation history")
    # nothing is called a parameter that no stack says is one (diffusion_mysnap's module.to() blocks are)
    said = r.live.by_category.get("parameter", 0)
    assert ("made of (where the allocating stack says) parameter" in str(r)) == bool(said)
