"""Batch and sequence scaling, and what fits (issue 30), on traces built by hand where the right
answer is computed here: every block is written with how it grows (constant, linear in the tokens,
quadratic in the sequence), the expected peak is a naive replay of the scaled blocks, and the
largest factor under a budget is found by bisection on that replay. Nothing is read from phasemem.
"""
import pytest

import phasemem
from phasemem.predictions.fits import predict
from phasemem.predictions.fits.answer import FACTOR_GRID
from phasemem.predictions.fits.bounds import RESERVE_MARGIN

MiB = 1 << 20
PARAMS = (3 * MiB + 3584, 5 * MiB + 1536)  # pre-existing weights (no per-token block has their size)
SOFTMAX = [{"filename": "/usr/lib/python3/site-packages/torch/nn/functional.py", "line": 2140, "name": "softmax"},
           {"filename": "/usr/lib/python3/site-packages/transformers/models/llama/modeling_llama.py", "line": 190,
            "name": "eager_attention_forward"},
           {"filename": "/home/me/train.py", "line": 40, "name": "step"}]
USER = [{"filename": "/home/me/model.py", "line": 12, "name": "forward"},
        {"filename": "/home/me/train.py", "line": 40, "name": "step"}]
CONST, LIN, QUAD = 0, 1, 2


class Loop:
    """A training loop's trace written block by block: each block's size, the phase that makes and
    frees it, its frames, and how it grows (CONST, LIN, QUAD)."""

    def __init__(self, frames=True):
        self.events, self.anns, self.t, self.addr = [], [], 0, 1 << 30
        self.kinds, self.frames = {}, frames  # addr -> (size, kind)

    def tick(self):
        self.t += 10
        return self.t

    def alloc(self, size, kind, frames=USER):
        self.addr += 1 << 26
        self.kinds[self.addr] = (size, kind)
        self.events.append({"action": "alloc", "addr": self.addr, "size": size, "stream": 0, "time_us": self.tick(),
                            "frames": frames if self.frames else []})
        return self.addr

    def free(self, addr):
        size, _ = self.kinds[addr]
        self.events.append({"action": "free_completed", "addr": addr, "size": size, "stream": 0,
                            "time_us": self.tick(), "frames": []})

    def phase(self, name, stage):
        self.anns.append({"name": f"phasemem::{name}", "stage": stage, "device": 0, "time_us": self.tick()})

    def snapshot(self):
        addr, blocks = 1 << 20, []
        for p in PARAMS:
            blocks.append({"address": addr, "size": p, "requested_size": p, "state": "active_allocated"})
            addr += p
        seg = {"device": 0, "address": 1 << 20, "total_size": addr - (1 << 20), "stream": 0, "segment_type": "large",
               "allocated_size": addr - (1 << 20), "active_size": addr - (1 << 20), "blocks": blocks}
        return {"segments": [seg], "device_traces": [self.events], "external_annotations": self.anns}


def gpt_like(attention: str, steps=3, layers=3, frames=True, collide=False):
    """``attention``: "none" (a fused kernel: nothing quadratic), "frames" (scores made under
    transformers' eager attention softmax), "upcast" (an fp32 softmax of half-precision scores, no
    attention frames), "residual" (a half-precision branch added to an fp32 stream, then a
    LayerNorm's fp32 output and its half-precision cast: linear, the same sizes as "upcast")."""
    L = Loop(frames)
    X = 1 * MiB  # a half-precision per-token block
    S = 3 * MiB  # half-precision attention scores (batch x heads x T x T)
    grads = []
    for _ in range(steps):
        L.phase("zero_grad", "START")
        for g in grads:
            L.free(g)
        grads = []
        L.phase("zero_grad", "END")
        L.phase("forward", "START")
        saved = [L.alloc(X // 2, LIN)]  # the input ids
        for _ in range(layers):
            saved.append(L.alloc(4 * X, LIN))  # the residual stream, fp32
            tmp = L.alloc(2 * X, LIN)
            L.free(tmp)
            if attention == "frames":
                s1 = L.alloc(S, QUAD, SOFTMAX[1:])  # scores
                s2 = L.alloc(2 * S, QUAD, SOFTMAX)  # softmax(dtype=float32)
                L.free(s1)
                saved += [s2, L.alloc(S, QUAD, SOFTMAX[1:])]  # its cast back, kept for the matmul
                if collide:
                    L.free(L.alloc(2 * S, LIN))  # a per-token temporary of the probabilities' size
            elif attention in ("upcast", "residual"):
                big = S if attention == "upcast" else 4 * X
                t = L.alloc(big, QUAD if attention == "upcast" else LIN)  # scaled scores / the branch
                if attention == "upcast":
                    p = L.alloc(2 * big, QUAD)  # fp32 probabilities, kept
                    L.free(t)
                    saved += [p, L.alloc(big, QUAD)]  # half-precision copy, kept
                    if collide:
                        L.free(L.alloc(2 * S, LIN))
                else:
                    p = L.alloc(2 * big, LIN)  # the fp32 stream after the add, kept
                    L.free(t)
                    ln = L.alloc(2 * big, LIN)  # LayerNorm's fp32 output, freed in forward
                    saved += [p, L.alloc(big, LIN)]  # its cast, kept
                    L.free(ln)
            saved.append(L.alloc(5 * X, LIN))  # MLP activation
        L.phase("forward", "END")
        L.phase("backward", "START")
        for a in reversed(saved):
            g = L.alloc(L.kinds[a][0], L.kinds[a][1])  # the gradient of a saved tensor, then both go
            L.free(g)
            L.free(a)
        grads = [L.alloc(p, CONST) for p in PARAMS]
        L.phase("backward", "END")
        L.phase("optimizer", "START")
        tmp = [L.alloc(p, CONST) for p in PARAMS]
        for a in tmp:
            L.free(a)
        L.phase("optimizer", "END")
    for g in grads:
        L.free(g)
    return L


def naive_peak(L: Loop, batch=1.0, seq=1.0, phase=None) -> int:
    """The highest level (``phase``: within that marked phase only) with every block scaled as built."""
    level, best = sum(PARAMS), 0 if phase else sum(PARAMS)
    marks = sorted((a["time_us"], a["name"].split("::")[1], a["stage"]) for a in L.anns)
    for e in L.events:
        size, kind = L.kinds[e["addr"]]
        grow = {CONST: 1, LIN: batch * seq, QUAD: batch * seq * seq}[kind]
        level += round(size * grow) * (1 if e["action"] == "alloc" else -1)
        inside = phase is None or [m for m in marks if m[0] < e["time_us"]][-1][1:] == (phase, "START")
        if inside:
            best = max(best, level)
    return best


def largest(L: Loop, budget: int, axis: str) -> float:
    lo, hi = 0.0, 1024.0
    for _ in range(60):
        mid = (lo + hi) / 2
        peak = naive_peak(L, batch=mid) if axis == "batch" else naive_peak(L, seq=mid)
        lo, hi = (mid, hi) if peak <= budget else (lo, mid)
    return lo


@pytest.mark.parametrize("attention", ["none", "frames", "upcast", "residual", "frames/no frames"])
@pytest.mark.parametrize("batch,seq", [(0.5, 1), (2, 1), (4, 1), (1, 2), (1, 4)])
def test_scaled_peak_is_the_scaled_blocks_replayed(attention, batch, seq):
    # without frames, transformers' eager attention under autocast still shows the softmax's upcast
    L = gpt_like(attention.split("/")[0], frames="/" not in attention)
    r = phasemem.analyze(L.snapshot())
    assert r.peak_bytes == naive_peak(L)
    name = f"batch_x{batch:g}" if batch != 1 else f"seq_x{seq:g}"
    w = {x.remedy: x for x in r.what_if}[name]
    assert w.applies, w.explanation
    assert w.predicted_peak_bytes == naive_peak(L, batch, seq)
    assert w.saves_bytes == r.peak_bytes - w.predicted_peak_bytes


def test_quadratic_blocks_make_the_sequence_cost_more_than_the_batch():
    r = phasemem.analyze(gpt_like("frames").snapshot())
    w = {x.remedy: x for x in r.what_if}
    assert w["seq_x2"].predicted_peak_bytes > w["batch_x2"].predicted_peak_bytes
    assert "frames" in " ".join(w["seq_x2"].assumptions)


def test_without_frames_or_upcast_the_sequence_cannot_be_told_and_says_so():
    r = phasemem.analyze(gpt_like("none", frames=False).snapshot())
    w = {x.remedy: x for x in r.what_if}
    assert w["batch_x2"].applies  # the batch needs no frames: every per-token block is linear in it
    for name in ("seq_x2", "seq_x4"):
        assert not w[name].applies and w[name].predicted_peak_bytes is None
        assert "cannot be told" in w[name].explanation
    assert not r.fits(1 << 30).sequence.applies


@pytest.mark.parametrize("attention", ["none", "frames"])
@pytest.mark.parametrize("axis", ["batch", "sequence"])
def test_fits_is_the_largest_factor_under_the_budget(attention, axis):
    L = gpt_like(attention)
    r = phasemem.analyze(L.snapshot())
    budget = 3 * r.peak_bytes
    fit = getattr(r.fits(budget), axis)
    # the hand-built blocks lie in no segment of the snapshot: the allocator is not replayed (it could not
    # start from the state the trace was in) and, no reserve seen, the answer keeps RESERVE_MARGIN more room
    want = largest(L, budget / (1 + RESERVE_MARGIN), axis)
    assert fit.applies and any("not replayed" in w for w in fit.why)
    assert fit.largest_factor == pytest.approx(want, abs=2e-3)
    assert fit.largest_factor_allocated == pytest.approx(largest(L, budget, axis), abs=2e-3)
    assert fit.largest_listed == max(x for x in FACTOR_GRID if x <= want)
    assert fit.next_factor == min(x for x in FACTOR_GRID if x > want)
    peak_next = naive_peak(L, batch=fit.next_factor) if axis == "batch" else naive_peak(L, seq=fit.next_factor)
    assert fit.predicted_peak_bytes_next == peak_next > budget


def test_fits_names_a_remedy_that_really_lets_the_next_factor_fit():
    L = gpt_like("none", layers=8)  # a stack deep enough to checkpoint
    r = phasemem.analyze(L.snapshot())
    fit = r.fits(3 * r.peak_bytes).batch
    assert fit.next_fits_with, fit
    remedies = {n: {} for n in fit.next_fits_with}
    assert predict(r.analysis, r.patterns, remedies, batch=fit.next_factor) <= 3 * r.peak_bytes


def test_fits_cli_prints_the_answer(tmp_path, capsys):
    import pickle

    from phasemem.commands.cli import main

    path = tmp_path / "loop.pickle"
    path.write_bytes(pickle.dumps(gpt_like("frames").snapshot()))
    assert main(["analyze", str(path), "--fits", "64MiB", "-o", str(tmp_path / "m.png")]) == 0
    out = capsys.readouterr().out
    assert "what fits in 64.00 MiB" in out and "batch: up to x" in out and "sequence: up to x" in out
    assert main(["analyze", str(path), "--fits", "lots", "-o", str(tmp_path / "m.png")]) == 2
    assert main(["analyze", str(path), "--fits", "0GiB", "-o", str(tmp_path / "m.png")]) == 2
    assert "80GiB" in capsys.readouterr().err


def test_a_linear_block_of_the_scores_size_next_to_them_stays_linear():
    """A ViT's MLP is as wide as its heads x patches: a per-token block of the probabilities' size made
    right after the scores' copy is no attention (told by the frames, and by the softmax's shape)."""
    for frames in (True, False):
        L = gpt_like("upcast" if not frames else "frames", frames=frames, collide=True)
        r = phasemem.analyze(L.snapshot())
        w = {x.remedy: x for x in r.what_if}["seq_x2"]
        assert w.applies
        # forward holds no backward block: its peak is exact whatever backward's sizes say
        forward_peak = naive_peak(L, seq=2, phase="forward")
        assert w.predicted_phase_peaks["forward"] == forward_peak


def test_a_compiled_forward_gives_no_sequence_prediction():
    """fixtures/gpt_compiled: torch.compile(gpt); its frames are inductor's, which may fuse an attention."""
    from helpers.paths import FIXTURES

    r = phasemem.analyze(str(FIXTURES / "gpt_compiled.pkl.xz"))
    w = {x.remedy: x for x in r.what_if}
    assert w["batch_x2"].applies
    assert not w["seq_x2"].applies and "compiled graph" in w["seq_x2"].explanation
    fx = r.fits(4 * r.peak_bytes)
    assert fx.batch.applies and not fx.sequence.applies and "compiled graph" in fx.sequence.why[0]
    # an eager model whose frames pass through torch._dynamo.disable wrappers (transformers, checkpoint)
    eager = phasemem.analyze(str(FIXTURES / "llama_hf_ckpt_bf16.pkl.xz"))
    assert {x.remedy: x for x in eager.what_if}["seq_x2"].applies


def test_fragmentation_counts_free_space_only_in_segments_holding_live_blocks():
    """Two 20 MiB segments at the peak: one holds a live 6 MiB block (14 MiB it cannot give back), the
    other only freed blocks (a capped allocator releases it). Ratio = (allocated + 14 MiB) / allocated."""
    from phasemem.predictions.fits.bounds import fragmentation

    L = gpt_like("none", steps=1)
    seg_a, seg_b = 1 << 40, (1 << 40) + (64 << 20)
    ev = [{"action": "segment_alloc", "addr": seg_a, "size": 20 * MiB, "stream": 0, "time_us": 1, "frames": []},
          {"action": "segment_alloc", "addr": seg_b, "size": 20 * MiB, "stream": 0, "time_us": 2, "frames": []},
          {"action": "alloc", "addr": seg_a, "size": 6 * MiB, "stream": 0, "time_us": 3, "frames": []},
          {"action": "alloc", "addr": seg_b, "size": 9 * MiB, "stream": 0, "time_us": 4, "frames": []},
          {"action": "free_completed", "addr": seg_b, "size": 9 * MiB, "stream": 0, "time_us": 5, "frames": []}]
    snap = L.snapshot()
    end = dict(ev[2], action="free_completed", time_us=10 ** 9)
    snap["device_traces"][0] = ev + snap["device_traces"][0] + [end]  # the 6 MiB block lives through the peak
    r = phasemem.analyze(snap)
    assert r.peak_bytes == naive_peak(L) + 6 * MiB
    assert fragmentation(r.analysis) == pytest.approx((r.peak_bytes + 14 * MiB) / r.peak_bytes)
    # the budget is read against reserved over allocated, the larger: the fragmentation bound lies between
    fit = r.fits(3 * r.peak_bytes).batch
    assert fit.largest_factor <= fit.largest_factor_fragmented <= fit.largest_factor_allocated


def test_a_hand_written_attention_is_told_by_its_frames_shared():
    """../shared/wild/magma27_cs336 (CS336's LM: its own scaled_dot_product_attention and softmax, fp32,
    no upcast): the scores are quadratic; its rotary halves (2X beside X) and its MLP, as large as the
    scores, are not."""
    from helpers.paths import FIXTURES

    path = FIXTURES.parent.parent / "shared" / "wild" / "magma27_cs336.pickle"
    if not path.exists():
        pytest.skip("no ../shared/wild")
    r = phasemem.analyze(str(path))
    w = {x.remedy: x for x in r.what_if}
    assert "told by the frames" in " ".join(w["seq_x2"].assumptions)
    assert w["seq_x2"].predicted_peak_bytes > w["batch_x2"].predicted_peak_bytes


@pytest.mark.parametrize("name", ["heldout11/h11_pgd_adversarial", "heldout/heldout_embbag_adagrad",
                                  "heldout3/heldout3_clip_infonce", "pairs/base", "llama_hf", "vit_adamw"])
def test_no_attention_scores_where_there_are_none(name):
    """A ReLU after a BatchNorm, an MLP's halving Linear, CLIP's one batch x batch softmax per step, and
    SDPA models read like a softmax's upcast by their sizes alone: none is attention."""
    from helpers.paths import FIXTURES

    r = phasemem.analyze(str(FIXTURES / f"{name}.pkl.xz"))
    w = {x.remedy: x for x in r.what_if}
    assert w["seq_x2"].applies and w["seq_x2"].predicted_peak_bytes == w["batch_x2"].predicted_peak_bytes


def test_json_carries_what_fits_on_a_real_trace(tmp_path):
    """``--json`` with ``--fits`` holds the same answer as the printed one (``report.fits``), on a real
    H200 trace; without ``--fits`` the JSON has no ``fits`` key."""
    import json

    from helpers.paths import FIXTURES
    from phasemem.commands.cli import main

    src = str(FIXTURES / "gpt_foreach.pkl.xz")
    r = phasemem.analyze(src)
    budget = 2 * r.peak_bytes
    assert main(["analyze", src, "--fits", str(budget), "-o", str(tmp_path / "m.png"),
                 "--json", str(tmp_path / "m.json")]) == 0
    got = json.loads((tmp_path / "m.json").read_text())["fits"]
    want = r.fits(budget)
    assert got["budget_bytes"] == budget and got["peak_bytes"] == r.peak_bytes
    assert got["batch"]["largest_factor"] == want.batch.largest_factor
    assert got["sequence"]["applies"] == want.sequence.applies
    assert main(["analyze", src, "-o", str(tmp_path / "n.png"), "--json", str(tmp_path / "n.json")]) == 0
    assert "fits" not in json.loads((tmp_path / "n.json").read_text())


def test_sizes_no_run_has_make_no_scaling_and_no_wrapped_cast():
    """A block of 4 EiB (a corrupt trace: test_robust's mutations write 2**62) scaled by the batch passes
    64 bits: the scaling says it does not apply, where the int64 cast used to wrap to a negative size
    (numpy's RuntimeWarning "invalid value encountered in cast")."""
    import warnings

    from helpers.paths import FIXTURES
    from helpers.snapshots import load_snapshot

    snap = load_snapshot(FIXTURES / "gpt_foreach.pkl.xz")
    ev = snap["device_traces"][0]
    # the largest block made in a forward and freed: the logits, which scale with the tokens
    marks = sorted((a["time_us"], a["stage"]) for a in snap["external_annotations"] if a["name"] == "phasemem::forward")
    t0, t1 = marks[0][0], marks[1][0]
    i = max((k for k, e in enumerate(ev) if e["action"] == "alloc" and t0 <= e["time_us"] <= t1),
            key=lambda k: ev[k]["size"])
    for e in ev:
        if e["addr"] == ev[i]["addr"] and e["size"] == ev[i]["size"]:
            e["size"] = 1 << 62
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        report = phasemem.analyze(snap)
    w = {x.remedy: x for x in report.what_if}
    assert not w["batch_x2"].applies and "passes 64 bits" in w["batch_x2"].explanation
    assert all(x.predicted_peak_bytes is None or x.predicted_peak_bytes > 0 for x in report.what_if)
