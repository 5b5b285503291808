"""The detectors' passes over whole columns (every step at once) against their rules applied one step
and one run at a time, on real traces: marked and with every annotation removed (the inferred path),
steps with micro-batches, an optimizer inside backward, inference, a compiled update. The references
below are the per-step rules as the docstrings state them, read from the trace's phase runs."""
from __future__ import annotations

import copy

import numpy as np
import pytest

import phasemem
from helpers.paths import ROOT
from helpers.snapshots import load_snapshot
from phasemem.vocab import P

TRACES = ["gpt_forloop_accum.pkl.xz", "gpt_inference.pkl.xz", "heldout6/h6_optim_in_backward.pkl.xz",
          "heldout16/h16_accum_grad_buffers.pkl.xz", "heldout5/h5_two_losses.pkl.xz",
          "heldout16/h16_compiled_fused.pkl.xz", "heldout/heldout_bert_mlm.pkl.xz", "gpt_ckpt_fused.pkl.xz"]


def _contexts():
    for name in TRACES:
        path = ROOT / "fixtures" / name
        if not path.exists():
            continue
        snap = load_snapshot(path)
        yield name, phasemem.analyze(copy.deepcopy(snap), trusted=True).analysis.facts
        snap["external_annotations"] = []
        snap.pop("phasemem", None)
        yield name + "-nomarks", phasemem.analyze(snap, trusted=True).analysis.facts


@pytest.fixture(scope="module")
def contexts():
    out = list(_contexts())
    if not out:
        pytest.skip("no fixtures")
    return out


def _runs(ctx, step, phase):
    sel = (ctx.run_step == step) & (ctx.run_phase == P[phase])
    return list(zip(ctx.run_first[sel].tolist(), ctx.run_last[sel].tolist()))


def _allocs(ctx, first, last):
    return np.flatnonzero((ctx.alloc >= first) & (ctx.alloc <= last))


def test_update_gradients_of_every_step_are_each_steps_rule(contexts):
    from phasemem.analysis.facts import gradient_allocs

    for name, ctx in contexts:
        idx, bounds = ctx.update_gradients_by_step
        assert len(bounds) == len(ctx.seg.steps) + 1, name
        for step in range(len(ctx.seg.steps)):
            grads = gradient_allocs(ctx, step)
            later = sorted(b for b, _ in _runs(ctx, step, "backward") + _runs(ctx, step, "optimizer"))
            # kept unless freed, by no zero_grad or optimizer, before the step's next backward or update run
            want = [int(g) for g in grads
                    if not any(b > ctx.alloc[g] for b in later)
                    or ctx.free[g] >= min(b for b in later if b > ctx.alloc[g])
                    or ctx.seg.labels[min(int(ctx.free[g]), ctx.n - 1)] in (P["zero_grad"], P["optimizer"])]
            assert idx[bounds[step]:bounds[step + 1]].tolist() == want, (name, step)


def test_microbatches_of_every_step_are_each_steps_regions(contexts):
    from phasemem.analysis.patterns.logits import all_microbatches

    for name, ctx in contexts:
        first, last, bwd, step = all_microbatches(ctx)
        got = [(int(s), int(f), int(end), tuple(b.tolist()) if b[0] >= 0 else None)
               for f, end, b, s in zip(first, last, bwd, step)]
        want = []
        for s in range(len(ctx.seg.steps)):
            fwd, back = _runs(ctx, s, "forward"), _runs(ctx, s, "backward")
            for k, (f0, f1) in enumerate(fwd):
                nxt = fwd[k + 1][0] if k + 1 < len(fwd) else None
                b = next((r for r in back if r[0] > f1 and (nxt is None or r[0] < nxt)), None)
                if b is not None:
                    want.append((s, f0, b[0] - 1, b))
                elif nxt is None or nxt > f1 + 1:
                    want.append((s, f0, nxt - 1 if nxt is not None else f1, None))
        assert got == want, name
        assert any(b is not None for *_, b in got) or "inference" in name, name


def test_optimizer_temporaries_of_every_run_are_each_runs_curve(contexts):
    from phasemem.analysis.infer.frames import inside_file
    from phasemem.analysis.patterns.optimizer import COMPILING_FILES, temporaries_by_run

    seen = 0
    for name, ctx in contexts:
        compiling = inside_file(ctx.trace, COMPILING_FILES)
        got = temporaries_by_run(ctx, compiling)
        for step in range(len(ctx.seg.steps)):
            want = []
            for o0, o1 in _runs(ctx, step, "optimizer"):
                idx = _allocs(ctx, o0, o1)
                temp = idx[(ctx.phase_at_alloc[idx] == P["optimizer"]) & (ctx.free[idx] <= o1)]
                temp = temp[~compiling[ctx.alloc[temp]]]
                if len(temp) < 2:
                    continue
                # the live bytes of the temporaries at every event of the run, by adding them up
                events = np.arange(o0, o1 + 1)
                live = [int(ctx.size[temp][(ctx.alloc[temp] <= e) & (ctx.free[temp] > e)].sum()) for e in events]
                p = int(events[int(np.argmax(live))])
                up = temp[(ctx.alloc[temp] <= p) & (ctx.free[temp] > p)]
                up = up[ctx.size[up] >= 0.1 * ctx.size[up].max()]
                want.append((temp.tolist(), (max(live), p, int(up[-1]), int(ctx.alloc[temp].min()),
                                             int(ctx.free[temp].max()))))
            mine = [(t.tolist(), numbers) for t, numbers in got.get(step, [])]
            assert mine == want, (name, step)
            seen += len(want)
    assert seen, "no optimizer temporaries in these traces"


def test_gradient_stripes_of_every_step_are_each_steps_sums(contexts):
    from phasemem.analysis.facts import update_gradients
    from phasemem.analysis.patterns.gradients import stripes_by_step

    for name, ctx in contexts:
        rows = stripes_by_step(ctx).tolist()
        for step in range(len(ctx.seg.steps)):
            sizes = [int(ctx.size[g]) for g in update_gradients(ctx, step)]
            want = [sum(sizes), sizes[-1], int(sizes[-1] == max(sizes) and sizes.count(sizes[-1]) == 1)] if sizes else [0, 0, 0]
            assert rows[step] == want, (name, step)


def test_backward_runs_echoing_their_forward_are_found_at_once(contexts):
    from phasemem.analysis.patterns.recompute import K, echoing_runs, own_forward

    def grams(sizes):
        return {tuple(sizes[i:i + K]) for i in range(len(sizes) - K + 1)}

    found = 0
    for name, ctx in contexts:
        got = echoing_runs(ctx)
        for step in range(len(ctx.seg.steps)):
            fwd_runs, bwd_runs = _runs(ctx, step, "forward"), _runs(ctx, step, "backward")
            for b0, b1 in bwd_runs:
                fwd = [int(ctx.size[i]) for a, b in own_forward(fwd_runs, bwd_runs, b0) for i in _allocs(ctx, a, b)]
                echo = bool(grams(fwd) & grams([int(ctx.size[i]) for i in _allocs(ctx, b0, b1)]))
                # every run that echoes is named (a run named besides would only be read in full)
                assert echo <= (b0 in got), (name, step, b0)
                found += echo
    assert found, "no backward run echoes its forward in these traces (gpt_ckpt_fused should)"


def test_losses_consuming_are_each_backward_runs_opening(contexts):
    from phasemem.analysis.patterns.logits import LOSS_GRAD_FIRST, LOSS_GRAD_WITHIN, TINY, losses_consuming

    seen = 0
    for name, ctx in contexts:
        rows = [(f, end) for s in range(len(ctx.seg.steps)) for f, end in _runs(ctx, s, "backward")]
        if not rows:
            continue
        # the largest block made before each run: a vocabulary-sized output's threshold to test against
        vocab = np.array([0.45 * int(ctx.size[ctx.alloc < f].max(initial=0)) for f, _ in rows])
        sizes, bounds, consumed = losses_consuming(ctx, np.array(rows, np.int64), vocab)
        for k, ((b0, b1), vb) in enumerate(zip(rows, vocab)):
            opening = [int(x) for x in ctx.size[_allocs(ctx, b0, b1)] if x > TINY][:LOSS_GRAD_WITHIN]
            assert sizes[bounds[k]:bounds[k + 1]].tolist() == opening, (name, b0)
            hit = next((i for i, x in enumerate(opening) if x >= vb), None)
            want = hit is not None and all(x < LOSS_GRAD_FIRST * opening[hit] for x in opening[:hit])
            assert bool(consumed[k]) == want, (name, b0)
            seen += want
    assert seen, "no loss consumed a large output in these traces"
