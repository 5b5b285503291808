"""FSDP2 + per-block torch.compile + activation checkpointing, torchtitan's way, on one H200 (issue #31).

fixtures/fsdp2/ holds two recordings of the same job (fixtures/record_fsdp2.py, torch 2.11): three
steps through ``instrument()`` and three more under ``torch.cuda.memory._record_memory_history()`` with
torch's defaults, the phases marked by hand with ``gt::`` ranges. Every expected number comes from the
model's sizes (``meta``: the GPT's parameters per block and the root's) or from the raw trace read
naively (tests/reference.py, the frames of each allocation), never from phasemem's output.
"""
from __future__ import annotations

import lzma
import pickle
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reference  # noqa: E402

FOLDER = Path(__file__).resolve().parents[1] / "fixtures" / "fsdp2"
INSTRUMENT, PLAIN = FOLDER / "fsdp2_instrument.pkl.xz", FOLDER / "fsdp2_plain.pkl.xz"


def _raw(path: Path) -> dict:
    return pickle.loads(lzma.decompress(path.read_bytes()))


def _meta() -> dict:
    return _raw(INSTRUMENT)["phasemem"]["meta"]


def _spans(ann: list, name: str) -> list[tuple[int, int]]:
    opened, out = [], []
    for a in ann:
        if a["name"] == name:
            if a["stage"] == "START":
                opened.append(a["time_us"])
            elif opened:
                out.append((opened.pop(), a["time_us"]))
    return out


def _fsdp_blocks(snap: dict) -> list[tuple[str, int, int, int]]:
    """(FSDP2 function that made it, size, alloc event, free event) of every allocation made under
    ``torch/distributed/fsdp/_fully_shard/`` (its innermost such frame), paired by address."""
    events, live, out = snap["device_traces"][0], {}, []
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            fn = next((f["name"] for f in e["frames"] if "/_fully_shard/" in f["filename"]), None)
            live[e["addr"]] = (fn, e["size"], i)
        elif e["action"] == "free_completed" and e["addr"] in live:
            fn, size, i0 = live.pop(e["addr"])
            out.append((fn, size, i0, i))
    return out + [(fn, size, i0, len(events)) for fn, size, i0 in live.values()]


def _peak_event(snap: dict) -> int:
    _, after, deltas = reference.replay(snap["device_traces"][0], snap["segments"])
    level = [max(a, a - d) for a, d in zip(after, deltas)]
    return level.index(max(level))


# ---- the phases ----------------------------------------------------------------------------------

def test_instrument_recording_has_every_phase_and_lost_nothing():
    import phasemem

    snap = _raw(INSTRUMENT)
    # the hooks' counts against the ranges: 3 forwards, 3 backwards, 3 optimizer steps, all recorded
    assert snap["phasemem"]["calls"] == {"Optimizer.step#": 3, "phasemem::backward": 3, "phasemem::forward": 3}
    assert snap["phasemem"]["lost"] == []
    report = phasemem.analyze(str(INSTRUMENT))
    assert [s.number for s in report.steps] == [0, 1, 2] and all(s.complete for s in report.steps)
    for s in report.steps:  # torchtitan's order: zero_grad first, clipping between backward and the step
        marked = [p for p in s.phases if p != "other"]
        assert marked == ["zero_grad", "forward", "loss", "backward", "optimizer"]
    assert not any(n.startswith("INCOMPLETE") for n in report.notes)


@pytest.mark.parametrize("path,prefix", [(INSTRUMENT, "phasemem::"), (PLAIN, "gt::")], ids=["instrument", "plain"])
def test_phase_peaks_equal_naive_replay(path, prefix):
    import phasemem

    snap = _raw(path)
    events, ann = snap["device_traces"][0], snap["external_annotations"]
    ivs = reference.intervals(ann, prefix)
    for name, torch_prefix in (("optimizer", "Optimizer.step#"), ("zero_grad", "Optimizer.zero_grad#")):
        if name not in ivs:
            ivs[name] = [iv for v in reference.intervals(ann, torch_prefix).values() for iv in v]
    labels = reference.add_loss(events, reference.label_events(events, ivs), ivs)
    step_of = reference.steps_from_optimizer(events, ivs)
    _, after, deltas = reference.replay(events, snap["segments"])
    level = [max(a, a - d) for a, d in zip(after, deltas)]
    report = phasemem.analyze(str(path), marker_prefix=prefix)
    assert report.peak_bytes == max(level) and list(report.labels) == labels
    checked = 0
    for st in report.steps:
        for name in ("forward", "loss", "backward"):
            idx = [i for i in range(len(events)) if labels[i] == name and step_of[i] == st.index]
            if idx:
                assert st.phases[name].peak_bytes == max(level[i] for i in idx)
                checked += 1
    assert checked >= 3 * 2


def test_torch_defaults_recording_phases_inferred_against_truth():
    """The plain recording with its gt:: marks removed: forward and backward are inferred from the trace
    (zero_grad and the optimizer from torch's own ranges, kept on the main thread); no event is put in
    another phase than the truth's, and forward+loss and the start of backward are exact."""
    import numpy as np

    import phasemem

    snap = _raw(PLAIN)
    truth = phasemem.analyze(snap, marker_prefix="gt::")
    bare = dict(snap, external_annotations=[a for a in snap["external_annotations"] if not a["name"].startswith("gt::")])
    inferred = phasemem.analyze(bare)
    assert inferred.sources["forward"] == inferred.sources["backward"] == "inferred"
    a = np.where(np.array(truth.labels) == "loss", "forward", np.array(truth.labels))
    b = np.where(np.array(inferred.labels) == "loss", "forward", np.array(inferred.labels))
    wrong = a != b
    assert set(b[wrong]) <= {"other"} and wrong.mean() < 0.01
    for t, i in zip(truth.steps, inferred.steps):
        assert (t.phases["forward"].start_event, t.phases["forward"].end_event) == (
            i.phases["forward"].start_event, i.phases["loss"].end_event)
        assert t.phases["backward"].start_event == i.phases["backward"].start_event


# ---- what FSDP2 holds, from the model's sizes and the raw trace -----------------------------------

@pytest.fixture(scope="module")
def rank(tmp_path_factory):
    import phasemem

    folder = tmp_path_factory.mktemp("fsdp2")
    shutil.copy(INSTRUMENT, folder / "rank0.pickle.xz")
    (s,) = phasemem.analyze_ranks(folder).ranks
    return s


def test_the_run_report_names_the_shards(tmp_path):
    """The text: the gradients are 0 at the peak (zero_grad runs first) and says the most they held."""
    import phasemem
    from phasemem.units import format_bytes

    shutil.copy(INSTRUMENT, tmp_path / "rank0.pickle.xz")
    text = str(phasemem.analyze_ranks(tmp_path))
    assert f"sharded gradients 0 B (at most {format_bytes(_meta()['param_bytes_fp32'])})" in text
    m = _meta()
    assert f"unsharded parameters {format_bytes(m['root_bytes_bf16'] + m['block_bytes_bf16'][-1])}," in text


def test_sharded_gradients_are_the_fp32_model(rank):
    """One rank holds every shard; reduce_dtype=fp32 leaves fp32 gradients: the most alive at once is
    the whole model in fp32, and the raw trace's reduce outputs (FSDP2's ``allocate``) kept past each
    backward add up to it per step."""
    m = _meta()
    assert rank.wrapper == "fsdp2" and rank.evidence == "stack frames and FSDP2's ranges"
    assert rank.parallel_max["sharded_gradients"] == m["param_bytes_fp32"] == 4 * m["params"]
    snap = _raw(INSTRUMENT)
    bwd = _spans(snap["external_annotations"], "phasemem::backward")
    times = [e["time_us"] for e in snap["device_traces"][0]]
    for t0, t1 in bwd:
        kept = sum(size for fn, size, i0, i1 in _fsdp_blocks(snap)
                   if fn == "allocate" and t0 <= times[i0] <= t1 and (i1 >= len(times) or times[i1] > t1))
        assert kept == m["param_bytes_fp32"]


def test_unsharded_parameters_are_the_root_and_the_last_block(rank):
    """At the peak (backward's start): the root's parameters in bf16 (FSDP2 keeps the root unsharded
    after forward) and the last block's (reshard_after_forward=False), nothing else: from the model's
    sizes, and from the raw trace's ``alloc_storage`` allocations alive at the naive replay's peak."""
    m = _meta()
    expected = m["root_bytes_bf16"] + m["block_bytes_bf16"][-1]
    snap = _raw(INSTRUMENT)
    peak = _peak_event(snap)
    alive = sum(size for fn, size, i0, i1 in _fsdp_blocks(snap) if fn == "alloc_storage" and i0 <= peak <= i1)
    assert rank.parallel["unsharded_parameters"] == alive == expected
    assert rank.parallel_max["unsharded_parameters"] == expected


def test_sharded_parameters_from_the_program_never_from_the_category(rank):
    """instrument() counted the program's own parameters (``tensor_bytes``): the fp32 shards, the whole
    model on one rank. Without that count (a plain recording, an older one) the trace cannot tell the
    shards from fused AdamW's two moments, made in the warm-up step and never allocated again: the
    category holds all three, so the report says unknown rather than 3x."""
    import phasemem
    from phasemem.distributed.run_report import summarize

    m = _meta()
    snap = _raw(INSTRUMENT)
    assert snap["phasemem"]["tensor_bytes"] == {"parameters": m["param_bytes_fp32"], "gradients": m["param_bytes_fp32"],
                                                "optimizer_state": snap["phasemem"]["tensor_bytes"]["optimizer_state"]}
    assert rank.parallel["sharded_parameters"] == m["param_bytes_fp32"]
    # two fp32 moments per parameter and a step scalar per parameter tensor
    assert snap["phasemem"]["tensor_bytes"]["optimizer_state"] - 2 * m["param_bytes_fp32"] < 1024
    del snap["phasemem"]["tensor_bytes"]
    report = phasemem.analyze(snap)
    assert summarize(report).parallel["sharded_parameters"] is None
    assert report.by_category["parameter"] >= 3 * m["param_bytes_fp32"]  # shards + exp_avg + exp_avg_sq


# ---- the recompute inside the compiled backward -----------------------------------------------------

def _attention_allocs(snap: dict, phase_spans) -> list[list[int]]:
    """Per span, the sizes of the allocations made by torch's rng wrapper (``rng_prims.py``), which the
    compiled block runs its attention through (forward: run_and_save_rng_state; the recompute in backward:
    run_with_rng_state)."""
    out = []
    for t0, t1 in phase_spans:
        out.append(sorted(e["size"] for e in snap["device_traces"][0] if e["action"] == "alloc" and t0 <= e["time_us"] <= t1
                          and any(f["filename"].endswith("rng_prims.py") for f in e["frames"])))
    return out


def test_raw_trace_shows_the_attention_recomputed_in_each_backward():
    """The truth the report must name: each step's compiled backward runs every block's attention forward
    again, allocating its output (batch x heads x seq x head_dim, bf16) and its logsumexp (fp32), once per
    block, exactly as the forward did: checkpointing's recompute, inside the compiled graph."""
    m = _meta()
    snap = _raw(INSTRUMENT)
    out = m["batch"] * m["seq"] * m["d_model"] * 2
    lse = m["batch"] * m["heads"] * m["seq"] * 4
    ann = snap["external_annotations"]
    fwd = _attention_allocs(snap, _spans(ann, "phasemem::forward"))
    bwd = _attention_allocs(snap, _spans(ann, "phasemem::backward"))
    assert len(fwd) == len(bwd) == 3
    for f, b in zip(fwd, bwd):
        assert b == f
        assert b.count(out) == b.count(lse) == m["layers"]


def test_report_names_the_recompute_in_the_compiled_backward():
    import phasemem

    m = _meta()
    for path in (INSTRUMENT, PLAIN):
        report = phasemem.analyze(str(path))
        found = [p for p in report.patterns if p.kind == "checkpoint_recompute"]
        assert [p.step for p in found] == [0, 1, 2], path.name
        # one region per checkpointed block, told by the replayed random ops (patterns.recompute)
        assert all(p.details["count"] == m["layers"] and p.details["evidence"] == "rng_replay" for p in found)
        # the blocks told apart are the attention's output and logsumexp of each block, as the raw trace shows
        out, lse = m["batch"] * m["seq"] * m["d_model"] * 2, m["batch"] * m["heads"] * m["seq"] * 4
        assert all(out + lse <= p.bytes < out + lse + 1024 for p in found)


def test_the_report_says_its_parameters_hold_more_than_the_programs():
    """The categories cannot tell fused AdamW's moments (made before recording, the shards' sizes) from
    the shards; where instrument() counted the program's parameters, the single report says the
    parameter category holds more than them, by how much (from the raw meta), and a plain recording
    (no count) says nothing it cannot know."""
    import phasemem
    from phasemem.units import format_bytes

    m = _meta()
    report = phasemem.analyze(str(INSTRUMENT))
    said = [n for n in report.notes if n.startswith("the parameters at the peak")]
    assert len(said) == 1
    excess = report.by_category["parameter"] - m["param_bytes_fp32"]
    assert excess > 0.05 * m["param_bytes_fp32"]
    assert format_bytes(m["param_bytes_fp32"]) in said[0] and format_bytes(excess) in said[0]
    assert not [n for n in phasemem.analyze(str(PLAIN)).notes if n.startswith("the parameters at the peak")]
