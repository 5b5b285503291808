"""Optimizer state: what the optimizer keeps, even one written by hand; never an average of the
weights, nor state an optimizer on the host keeps there.

Truth from the raw snapshot (its gt:: and Optimizer.step ranges, the stacks of its allocations) and
the recording's meta (the model's own byte counts), never from phasemem. The held-out recordings
(fixtures/heldoutN, fixtures/record_heldoutN.py) are analysed twice: with the gt:: ranges as markers,
and as a user would hand them over (helpers.analyses.marked_and_plain); the ../shared/wild ones as
published (helpers.wild).
"""
from __future__ import annotations

from helpers.analyses import category_events, marked_and_plain
from helpers.paths import FIXTURES
from helpers.raw import line_of, made_at, optimizer_ends, param_bytes
from helpers.snapshots import heldout

SCRIPT5 = FIXTURES / "record_heldout5.py"  # the heldout5 programs' source: its lines are the truth


def test_a_hand_written_optimizers_state_is_not_called_an_input_or_a_weight():
    """HandAdam (fixtures/record_heldout5.py) makes m and v with zeros_like on its first step: no
    torch.optim frame, and phasemem finds no optimizer phase without markers; then it must not call
    the state what it is not."""
    snap = heldout("h5_vae_handadam")
    state = made_at(snap, SCRIPT5, "step", line_of(SCRIPT5, "step", "self.state[i] = (torch.zeros_like(p), torch.zeros_like(p))"))
    assert len(state) == 2 * 18  # two per parameter tensor (18 of them)
    for how, r in marked_and_plain("h5_vae_handadam"):
        for cat in ("input", "parameter", "gradient", "activation", "temporary"):
            assert not (state & category_events(r, cat)), (how, cat)
    marked = dict(marked_and_plain("h5_vae_handadam"))["marked"]
    assert state <= category_events(marked, "optimizer_state")


def test_an_ema_of_the_weights_is_not_optimizer_state():
    """The EMA copy was made before recording (gradient-sized blocks from before the trace) while
    AdamW made its state during it: optimizer state at the peak is AdamW's m and v only, the blocks
    made under torch/optim/ and never freed."""
    snap = heldout("h5_gpt_varlen_ema")
    ev = snap["device_traces"][0]
    state = 0
    for i, e in enumerate(ev):
        if e["action"] == "alloc" and any("torch/optim/" in f["filename"] for f in e.get("frames") or []):
            if not any(x["addr"] == e["addr"] and x["action"] == "free_completed" for x in ev[i + 1:]):
                state += e["size"]
    param_bytes = snap["phasemem"]["meta"]["param_bytes"]
    assert 1.99 * param_bytes <= state <= 2.01 * param_bytes  # m and v: two numbers per parameter
    for how, r in marked_and_plain("h5_gpt_varlen_ema"):
        assert r.peak.by_category["optimizer_state"] == state, how


def test_a_host_side_optimizer_keeps_no_state_on_the_device():
    snap = heldout("h9_cpu_offload_optimizer")
    for how, r in marked_and_plain("h9_cpu_offload_optimizer"):
        assert [s.end_event + 1 for s in r.steps] == optimizer_ends(snap), how
        assert r.by_category["optimizer_state"] == 0 and not r.patterns_of("optimizer_state_init"), how
        assert r.by_category["parameter"] == r.by_category["gradient"] == param_bytes(snap), how
