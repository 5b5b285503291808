"""Work that is not a training step, read from lifetimes alone (phasemem/analysis/infer/other_work.py;
docs/accuracy.md, "Third round: work that is not a training step"): attacks, rollouts, serving, an
out-of-memory forward. Each trace is stripped of annotations and frames (tests/heldout_sets.bare) and
read against its own marks, as docs/eval_frameless.py scores it; every test fails with its rule out.
"""
import numpy as np

from phasemem.read.trace import A
from phasemem.vocab import P

from test_frameless import _read, _share


def _named_right(truth, got, phase: str) -> float:
    """Of the events the inference calls ``phase``, the share the marks call so too."""
    m = got == P[phase]
    return float((truth[m] == P[phase]).mean()) if m.any() else 1.0


def test_attack_passes_are_no_steps():
    """A PGD attack's forward and backward for the image's gradient keep no parameter's gradient and
    make a third of a training backward's parameter-sized blocks (InputGradients): they were read as
    three more forward/backward/optimizer rounds, 0.45 of the events right."""
    truth, steps, _, seg = _read("heldout11/h11_pgd_adversarial")
    assert len(seg.steps) == steps == 3
    # every inferred backward and optimizer is the training step's, and the attack is left unnamed
    assert _named_right(truth, seg.labels, "backward") > 0.95
    assert _named_right(truth, seg.labels, "optimizer") > 0.8
    other = truth == P["other"]
    assert float((seg.labels[other] == P["other"]).mean()) > 0.95
    assert _share(truth, seg.labels, "forward") > 0.8


def test_rollouts_are_no_forward_nor_update():
    """GRPO generates completions (a rollout of decoding steps, 15,000 events) before each four updates.
    The update ends at its last burst before a long stretch of mostly non-parameter sizes
    (other_work.update_bursts), and what runs far longer than a backward after it, or after a decoding
    step, is no forward (other_work.rollout): the rollouts were read as forward and optimizer, 0.19 of
    the events right."""
    truth, steps, _, seg = _read("heldout16/h16_grpo")
    assert len(seg.steps) == steps == 8
    other = truth == P["other"]
    assert float((seg.labels[other] == P["other"]).mean()) > 0.95
    assert _named_right(truth, seg.labels, "optimizer") > 0.8


def test_a_forward_stopped_by_out_of_memory_is_a_forward():
    """oom_base's forward runs out of memory: no backward, no pass the mountains find (every block is
    freed in the exception's bursts). Its blocks, made one after another and freed last made first
    in bursts, are an unfinished forward (other_work.unfinished_forward); it was left unnamed."""
    truth, steps, _, seg = _read("oom/oom_base")
    assert len(seg.steps) == steps == 1
    assert _share(truth, seg.labels, "forward") > 0.95
    assert _named_right(truth, seg.labels, "forward") > 0.95


def test_a_serving_engine_does_not_train():
    """A paged-KV serving engine frees its cache's pages in bursts after its passes, in 2 of its 8
    parameter sizes: no backward keeps a gradient, and that is too few sizes for an update's
    temporaries (other_work.covers_an_update). It was read as training: 37 steps of forward, backward
    and optimizer, 0.74 of its events right."""
    truth, _, _, seg = _read("heldout16/h16_serve_paged")
    assert not (truth == P["backward"]).any()
    assert len(seg.steps) == 1
    assert not np.isin(seg.labels, [P["backward"], P["optimizer"]]).any()
    assert _share(truth, seg.labels, "forward") > 0.95


def test_forwards_that_ran_out_of_memory_are_no_update():
    """h13_oom_retry_halve runs out of memory three times, halving its batch, before its first step:
    each failed forward's blocks are freed in bursts as the exception unwinds, 0.16 of them
    parameter-sized. They were taken for the previous step's optimizer cut by the ring buffer
    (pass_labels.wrapped_start): one step too many, 1,000 events of optimizer (other_work.unwound).
    Each is a forward an error stopped (other_work.unfinished_forwards)."""
    truth, steps, _, seg = _read("heldout13/h13_oom_retry_halve")
    assert len(seg.steps) == steps == 3
    assert _named_right(truth, seg.labels, "optimizer") > 0.9
    assert _share(truth, seg.labels, "forward") > 0.9
    assert _named_right(truth, seg.labels, "forward") > 0.95


def test_an_anchored_update_ends_at_its_last_burst():
    """DQN runs its target network's no-grad forward between an update and the next training forward;
    PPO rolls its policy out for 3,000 events after the last epoch's update. Both make
    parameter-sized blocks there, and the update the gradients' sets anchor ran to the last of them.
    It ends at its last burst of frees (other_work.label_update): what follows is a forward, or a
    rollout left 'other'. h10_dqn_replay had 0.52 of its events right, h6_ppo 0.56."""
    truth, steps, _, seg = _read("heldout10/h10_dqn_replay")
    assert len(seg.steps) == steps == 12
    assert _named_right(truth, seg.labels, "optimizer") > 0.7  # 0.37 before
    assert _named_right(truth, seg.labels, "forward") > 0.7  # 0.58 before
    truth, steps, _, seg = _read("heldout6/h6_ppo")
    assert len(seg.steps) == steps == 16
    other = truth == P["other"]
    assert float((seg.labels[other] == P["other"]).mean()) > 0.8  # 0.43 before
    # what runs between backward and the update (45 events a step, unmarked) is still read as the update
    assert _named_right(truth, seg.labels, "optimizer") > 0.25  # 0.09 before


def test_an_out_of_memory_error_after_an_update_stops_the_next_step():
    """hf_oom's second step runs out of memory in its forward, 6 allocations after the first step's
    zero_grad: the trace's out-of-memory event after an update ends a step of its own, whose forward
    it stopped (other_work.stopped_step). One step was read of two."""
    truth, steps, trace, seg = _read("integrations/hf_oom")
    assert len(seg.steps) == steps == 2
    oom = int(np.flatnonzero(trace.action == A["oom"])[-1])
    assert seg.labels[oom] == truth[oom] == P["forward"]


def test_scalars_before_an_anchored_update_are_not_it():
    """h7_capturable_adam has a parameter of a scalar's size, so every scalar looks parameter-sized:
    the scalars made between backward and the update (40 events a step, unmarked) began the update
    the gradients' sets anchor (other_work.label_update starts it at its first larger block)."""
    truth, steps, _, seg = _read("heldout7/h7_capturable_adam")
    assert len(seg.steps) == steps == 3
    assert _named_right(truth, seg.labels, "optimizer") > 0.9
