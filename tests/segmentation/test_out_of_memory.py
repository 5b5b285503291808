"""Out-of-memory errors: each at the allocation the raw trace's oom entry names, in its step and
phase, said first, and said to have been caught where the program went on.

Truth from the raw snapshot (its gt:: and Optimizer.step ranges, the stacks of its allocations) and
the recording's meta (the model's own byte counts), never from phasemem. The held-out recordings
(fixtures/heldoutN, fixtures/record_heldoutN.py) are analysed twice: with the gt:: ranges as markers,
and as a user would hand them over (helpers.analyses.marked_and_plain); the ../shared/wild ones as
published (helpers.wild).
"""
from __future__ import annotations

import pickle

import phasemem
from helpers.analyses import marked_and_plain
from helpers.paths import FIXTURES
from helpers.raw import in_gt_range
from helpers.snapshots import heldout
from helpers.wild import wild_path, wild_report


def test_out_of_memory_on_another_device_is_the_first_line():
    r = wild_report("constructorsun_codeloc")
    raw = pickle.loads(wild_path("constructorsun_codeloc").read_bytes())
    ooms = [(d, i, e) for d, t in enumerate(raw["device_traces"]) for i, e in enumerate(t) if e["action"] == "oom"]
    assert len(ooms) == 1
    d, i, e = ooms[0]
    assert r.device != f"cuda:{d}"  # the busiest device is another one...
    (o,) = r.ooms  # ... and the OOM is still reported, first
    assert (o.device, o.event, o.requested_bytes, o.device_free_bytes) == (f"cuda:{d}", i, e["size"], e["device_free"])
    assert str(r).splitlines()[0].startswith(f"OUT OF MEMORY on cuda:{d} at event {i}")
    assert {s.device for s in r.other_devices} == {f"cuda:{k}" for k in range(len(raw["device_traces"]))
                                                    if raw["device_traces"][k]} - {r.device}


def test_out_of_memory_retries_are_reported_where_they_happened():
    """Three attempts ran out (batch 64, 32, 16), each at the allocation the raw trace's oom entry
    names; the three steps after them are the three updates."""
    snap = heldout("h13_oom_retry_halve")
    ev = snap["device_traces"][0]
    ooms = [i for i, e in enumerate(ev) if e["action"] == "oom"]
    assert len(ooms) == 3 == sum(1 for _, s in snap["phasemem"]["meta"]["attempts"] if s == "oom")
    fwd = in_gt_range(snap, "forward")
    for how, r in marked_and_plain("h13_oom_retry_halve"):
        assert [o.event for o in r.ooms] == ooms, how
        assert [o.requested_bytes for o in r.ooms] == [ev[i]["size"] for i in ooms], how
        assert len(r.steps) == 3, how
        for o in r.ooms:
            assert fwd[o.event]
            assert o.phase in ("forward", "other"), how  # the third is in cross_entropy, outside the model


def test_caught_out_of_memory_errors_are_said_and_fatal_ones_are_not():
    """The retry loop went on after each error (allocations follow them in the raw trace); the
    fixtures/oom recordings ended at theirs, and get no such note."""
    snap = heldout("h13_oom_retry_halve")
    ev = snap["device_traces"][0]
    ooms = [i for i, e in enumerate(ev) if e["action"] == "oom"]
    assert all(sum(1 for e in ev[i + 1:] if e["action"] == "alloc") > 100 for i in ooms)
    for how, r in marked_and_plain("h13_oom_retry_halve"):
        said = [n for n in r.notes if "did not end the program" in n]
        assert len(said) == 1 and said[0].startswith(f"{len(ooms)} out-of-memory"), how
    fatal = FIXTURES / "oom" / "oom_base.pkl.xz"
    if fatal.exists():
        r = phasemem.analyze(str(fatal))
        assert r.ooms and not any("did not end the program" in n for n in r.notes)
