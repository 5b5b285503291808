"""Parameters: exactly the weights an optimizer trains (or a forward reads, in inference), while they
are on the device; never frozen copies, caches, pools, buffers or workspaces beside them.

Truth from the raw snapshot (its gt:: and Optimizer.step ranges, the stacks of its allocations) and
the recording's meta (the model's own byte counts), never from phasemem. The held-out recordings
(fixtures/heldoutN, fixtures/record_heldoutN.py) are analysed twice: with the gt:: ranges as markers,
and as a user would hand them over (helpers.analyses.marked_and_plain); the ../shared/wild ones as
published (helpers.wild).
"""
from __future__ import annotations

import numpy as np
import pytest

from helpers.analyses import analyzed, marked_and_plain, not_released
from helpers.raw import optimizer_ends, param_bytes
from helpers.snapshots import heldout
from helpers.wild import wild_report
from phasemem.vocab import C


def test_moved_layer_weights_are_parameters():
    """sqattn moves each decoder layer to the GPU (module.to) before running it twice."""
    r = wild_report("sqattn_cuda")
    assert r.by_category["input"] == 0 and r.by_category["parameter"] > 0


def test_a_workspace_from_before_recording_is_not_a_weight():
    """kkaitlyn_ctx256_forward_mixed: the 2.7B CS336 model (d 2560, d_ff 10240, 32 layers, vocab
    10000; cs336_systems/benchmark.py's get_model_config) kept in fp32 under autocast, and cuBLAS's
    32 MiB workspace, whose stack in segments names getNewWorkspace, beside it."""
    r = wild_report("kkaitlyn_ctx256_forward_mixed")
    d, ff, layers, vocab = 2560, 10240, 32, 10000
    # fp32, as requested (the segments' requested_size, not the 2 MiB-rounded block)
    weights = 4 * (layers * (4 * d * d + 3 * d * ff) + 2 * vocab * d)
    param = r.by_category["parameter"]
    assert weights <= param <= weights + (4 << 20)  # plus the norms' small blocks
    assert r.by_category["other"] >= 32 << 20


def test_a_bare_function_has_no_weights():
    """silmont_mem_snapshot: trace_peak_memory.py (133f064) makes Q, K, V (8×4096×16, requires_grad)
    and runs an attention function with no module: nothing there is a parameter."""
    r = wild_report("silmont_mem_snapshot")
    assert r.by_category["parameter"] == 0
    qkv = 3 * 8 * 4096 * 16 * 4
    assert r.by_category["other"] + r.by_category.get("input", 0) >= qkv


def test_weights_named_by_optimizer_state_when_the_gradient_is_sparse():
    """SparseAdam's dense state names the 488 MiB embedding as a parameter although its gradient
    (a sparse tensor, 32 MiB of values) has another size; all 129 M parameters are parameters."""
    snap = heldout("h6_sparse_two_opt")
    meta = snap["phasemem"]["meta"]
    rows_dim = 2_000_000 * 64 * 4  # EmbeddingBag(2_000_000, 64) in fp32, from the recording script
    blocks = [b for seg in snap["segments"] if seg["device"] == 0 for b in seg["blocks"]
              if b["state"] == "active_allocated" and b["size"] == rows_dim]
    assert blocks  # alive from before recording to the end
    for how, r in marked_and_plain("h6_sparse_two_opt"):
        life = r.analysis.timeline.lifetimes
        codes = np.asarray(r.analysis.categories.codes)
        big = life.preexisting & (life.size == rows_dim)
        assert big.any() and (codes[big] == C["parameter"]).all(), how
        assert r.by_category["parameter"] >= meta["param_bytes"], how


def test_alternating_optimizers_name_every_trained_weight():
    """SAC trains its critics and its actor in turns, with one Adam each; the actor's 4 MiB weight has
    the critics' size. Every trained weight is a parameter (the critics' and the actor's: all but
    the two target critics, frozen copies updated by Polyak averaging), and the steps are the
    gt::step ranges."""
    snap = heldout("h7_sac")
    total = param_bytes(snap)
    # actor + 2 critics trained; 2 target critics of the critics' size are not (record_heldout7.w_sac)
    obs, act, hidden = 64, 8, 1024
    critic = (obs + act) * hidden + hidden + hidden * hidden + hidden + hidden + 1
    actor = obs * hidden + hidden + hidden * hidden + hidden + hidden * 2 * act + 2 * act
    assert (actor + 4 * critic) * 4 == total
    for how, r in marked_and_plain("h7_sac"):
        # exact but for scalars: a 4-byte block from before recording has a 1-element bias's size
        assert abs(r.by_category["parameter"] - (actor + 2 * critic) * 4) <= 512, how
        assert len(r.steps) == 6, how
        # each Adam makes its state in its own first step: the critics' in step 0, the actor's in step 1
        state = {p.step: p.bytes for p in r.patterns_of("optimizer_state_init")}
        assert state == {0: 2 * 2 * critic * 4, 1: 2 * actor * 4}, how


def test_gan_parameters_are_both_networks():
    """WGAN-GP (heldout5): the critic's and the generator's weights share sizes and take turns; all
    of both are parameters, as many bytes as the model has (was 11.1 MB of 13.8 MB)."""
    snap = heldout("h5_wgan_gp")
    for how, r in marked_and_plain("h5_wgan_gp"):
        assert r.by_category["parameter"] == param_bytes(snap), how


def test_ema_copy_is_neither_parameter_nor_state():
    """AveragedModel's copy of the weights (made before recording, updated after each step) is not
    optimizer state and not the model's parameters: those are exactly the trained weights."""
    snap = heldout("h7_swa_ema_bf16")
    for how, r in marked_and_plain("h7_swa_ema_bf16"):
        life = r.analysis.timeline.lifetimes
        codes = np.asarray(r.analysis.categories.codes)
        kept = life.free_event >= r.n_events
        assert int(life.size[kept & (codes == C["parameter"])].sum()) == param_bytes(snap), how
        assert not r.patterns_of("leak"), how


def test_lora_parameters_are_the_adapters_and_the_frozen_base_is_said():
    snap = heldout("h7_peft_lora")
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain("h7_peft_lora"):
        assert r.by_category["parameter"] == meta["trainable_bytes"], how
        assert any("pair with no gradient" in n for n in r.notes), how


def test_cuda_graph_training_claims_no_weights_gradients_or_state():
    """reduce-overhead CUDA graphs make gradients in the graph's pool: the trace shows none (the loss's
    4-byte seed gradients were "gradients, 12 B"), so weights (384 MiB) and AdamW's state (768 MiB),
    all from before recording, cannot be told apart and neither is claimed; steps are torch's."""
    snap = heldout("h8_compile_reduce_overhead")
    want = optimizer_ends(snap)
    assert len(want) == 3
    for how, r in marked_and_plain("h8_compile_reduce_overhead"):
        assert [s.end_event + 1 for s in r.steps] == want, how
        assert not r.patterns_of("gradients"), how
        assert r.by_category["parameter"] == r.by_category["optimizer_state"] == r.by_category["gradient"] == 0, how


def test_fp32_master_copy_is_not_the_parameters():
    snap = heldout("h8_master_weights")
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain("h8_master_weights"):
        assert r.by_category["parameter"] == meta["param_bytes"], how  # the bf16 weights, not the master copy
        assert any("fp32 master copy" in n for n in r.notes), how


def test_weight_norm_and_python_stacks_name_the_weights():
    for name, per_param in (("h8_weight_norm", 1), ("h8_python_stacks_alloc", 2)):  # SGD momentum 1, AdamW 2
        snap = heldout(name)
        meta = snap["phasemem"]["meta"]
        for how, r in marked_and_plain(name):
            assert [s.end_event + 1 for s in r.steps] == optimizer_ends(snap), (name, how)
            assert r.by_category["parameter"] == meta["param_bytes"], (name, how)
            state = r.patterns_of("optimizer_state_init")
            assert state and state[0].bytes == per_param * meta["param_bytes"], (name, how)


def test_a_preallocated_kv_pool_is_not_parameters():
    """A 2 GiB pool allocated before recording, written in place by decode steps. Before: "parameters
    2.31 GiB" (257 MiB of weights)."""
    snap = heldout("h9_paged_kv_inference")
    meta = snap["phasemem"]["meta"]
    pool = [b["size"] for seg in snap["segments"] for b in seg["blocks"] if b["size"] == meta["pool_bytes"]]
    assert pool, "the pool is in the snapshot's segments"
    for how, r in marked_and_plain("h9_paged_kv_inference"):
        assert r.by_category["parameter"] < meta["pool_bytes"], how
        assert r.by_category["other"] >= meta["pool_bytes"], how
        assert r.by_category["parameter"] >= meta["param_bytes"], how


def _preexisting_to_end(snap: dict) -> int:
    """Bytes of the blocks in the snapshot's segments that no event of the trace allocated."""
    made = {e["addr"] for e in snap["device_traces"][0] if e["action"] == "alloc"}
    return sum(b["size"] for seg in snap["segments"] for b in seg["blocks"]
               if b["state"] == "active_allocated" and b["address"] not in made)


def test_a_replay_buffer_and_a_frozen_backbone_are_not_parameters():
    """DQN: 205 MB of replay buffer and a target network from before recording, 12 updates; a linear
    probe: 537 MB of frozen weights under no_grad and a trained head."""
    for name, kept in (("h10_dqn_replay", "buffer_bytes"), ("h10_linear_probe", "frozen_bytes")):
        snap = heldout(name)
        meta = snap["phasemem"]["meta"]
        assert _preexisting_to_end(snap) >= meta[kept] + meta["param_bytes"]
        for how, r in marked_and_plain(name):
            assert [s.end_event + 1 for s in r.steps] == optimizer_ends(snap), (name, how)
            assert len(r.steps) == meta["nsteps"], (name, how)
            assert r.by_category["parameter"] == meta["param_bytes"], (name, how)
            assert r.by_category["other"] >= meta[kept], (name, how)
            assert any("pair with no gradient" in n for n in r.notes), (name, how)


def _made_before_steps_and_kept(snap: dict, where: str) -> int:
    """Bytes of the blocks allocated before the first gt::step range, alive at the end, whose stack
    runs through a file containing ``where``."""
    start = min(a["time_us"] for a in snap["external_annotations"]
                if a["name"].startswith("gt::step") and a["stage"] == "START")
    alive = {}
    for e in snap["device_traces"][0]:
        if e["action"] == "alloc":
            alive[e["addr"]] = e
        elif e["action"] == "free_completed":
            alive.pop(e["addr"], None)
    return sum(e["size"] for e in alive.values() if e["time_us"] < start
               and any(where in f["filename"] for f in e.get("frames") or []))


def test_a_static_kv_cache_made_in_the_trace_is_not_parameters():
    """gpt-fast's setup_caches: torch.zeros in the script before the first forward, kept to the end.
    Before: "parameters 336.5 MiB" (256.5 MiB of weights and the 80 MiB cache)."""
    snap = heldout("h12_static_kv_decode")
    meta = snap["phasemem"]["meta"]
    cache = _made_before_steps_and_kept(snap, "record_heldout12.py")
    assert cache >= meta["cache_bytes"]
    for how, r in marked_and_plain("h12_static_kv_decode"):
        assert r.by_category["parameter"] == meta["param_bytes"], how
        assert r.by_category["other"] >= meta["cache_bytes"], how


@pytest.mark.parametrize("name,where", [("h12_build_in_trace_infer", "torch/nn/modules/module.py"),
                                        ("h12_from_pretrained_in_trace", "transformers/")])
def test_weights_made_in_the_trace_stay_parameters(name, where):
    """A model moved with .to() or loaded by from_pretrained inside the recording: its weights."""
    snap = heldout(name)
    meta = snap["phasemem"]["meta"]
    made = _made_before_steps_and_kept(snap, where)
    assert made >= meta["param_bytes"]
    # blocks from before recording (what earlier workloads of the process left, 16 B and 1 MiB) are
    # parameters by inference's rule; cuBLAS's 32 MiB workspaces are not among them
    allocated = {e["addr"] for e in snap["device_traces"][0] if e["action"] == "alloc"}
    left = sum(b["size"] for seg in snap["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"
               and b["address"] not in allocated and b["size"] != 32 << 20)
    for how, r in marked_and_plain(name):
        assert made <= r.by_category["parameter"] <= made + left, how


def _workspace_bytes(snap: dict) -> int:
    """Blocks from before the trace, alive at the end, whose stack names a cuBLAS workspace getter."""
    made = {e["addr"] for e in snap["device_traces"][0] if e["action"] == "alloc"}
    return sum(b["size"] for seg in snap["segments"] for b in seg["blocks"]
               if b["state"] == "active_allocated" and b["address"] not in made
               and any("Workspace" in f["name"] for f in b.get("frames") or []))


@pytest.mark.parametrize("name", ["h13_ddim_cfg_infer", "h13_embeddings_cat_growth"])
def test_workspaces_left_by_an_earlier_recording_are_not_parameters(name):
    """Inference whose weights came before recording: the cuBLAS/cuBLASLt workspaces beside them
    (made under an earlier recording of the process, so their stacks say what they are) were
    parameters too: 105 MiB of "parameters" for a 40 MiB MLP."""
    snap = heldout(name)
    meta = snap["phasemem"]["meta"]
    assert _workspace_bytes(snap) >= 64 << 20
    for how, r in marked_and_plain(name):
        assert r.by_category["parameter"] == meta["param_bytes"], how


def test_offloaded_blocks_weights_count_as_parameters_while_on_the_device():
    """Only the embeddings and the head stay resident; each block's weights come and go."""
    snap = heldout("h13_layer_offload_infer")
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain("h13_layer_offload_infer"):
        # at the peak one block is on the device; at the end none is
        assert r.by_category["parameter"] == meta["resident_param_bytes"] + meta["block_param_bytes"], how
        end = r.analysis.categories_at_level([len(r.analysis.trace) - 1])[0]
        assert end[list(r.by_category).index("parameter")] == meta["resident_param_bytes"], how


def _workspace_allocs(snap: dict) -> int:
    """Bytes the trace allocates through a cuBLAS/cuBLASLt workspace getter and never frees."""
    ev = snap["device_traces"][0]
    freed = {}
    for i, e in enumerate(ev):
        if e["action"] == "free_completed":
            freed.setdefault(e["addr"], []).append(i)
    return sum(e["size"] for i, e in enumerate(ev) if e["action"] == "alloc"
               and any("Workspace" in f["name"] for f in e.get("frames") or [])
               and not any(j > i for j in freed.get(e["addr"], [])))


def test_workspaces_the_first_matmul_makes_before_forward_are_not_parameters():
    """The PINN's first matmul made cuBLAS's and cuBLASLt's workspaces (33 MiB) before the forward
    phase began, kept to the end: "parameters 41.02 MiB" for an 8.02 MiB MLP."""
    snap = heldout("h14_pinn_second_order")
    meta = snap["phasemem"]["meta"]
    assert _workspace_allocs(snap) >= 33 << 20
    for how, r in marked_and_plain("h14_pinn_second_order"):
        assert r.by_category["parameter"] == meta["param_bytes"], how
        assert len(r.steps) == 3, how


def test_a_frozen_encoder_is_not_trained():
    """Only the denoiser's weights get gradients and state; the frozen encoder's are 'other'."""
    snap = heldout("h14_frozen_encoder_latent")
    meta = snap["phasemem"]["meta"]
    trained = meta["trained_param_bytes"]
    for how, r in marked_and_plain("h14_frozen_encoder_latent"):
        assert r.by_category["parameter"] == trained, how
        grads = [p for p in r.patterns if p.kind == "gradients"]
        assert grads and all(p.bytes == trained for p in grads), how
        (state,) = [p for p in r.patterns if p.kind == "optimizer_state_init"]
        assert state.bytes == 2 * trained, how


def test_int8_base_is_no_parameter():
    """Only the LoRA factors train: they are the parameters (6 MiB), their gradients and 2x state; the
    frozen base (int8 weights, fp32 embeddings and head) is other, as a note says."""
    snap = heldout("h16_int8_lora")
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain("h16_int8_lora"):
        assert r.by_category["parameter"] == meta["lora_bytes"], how
        (grads,) = [p for p in not_released(r, "gradients") if p.step == 0]
        assert grads.bytes == meta["lora_bytes"], how
        (state,) = not_released(r, "optimizer_state_init")
        assert state.bytes == 2 * meta["lora_bytes"], how


@pytest.mark.parametrize("name,key", [("h16_grpo", "policy_bytes"), ("h16_dino_multicrop", "student_bytes"),
                                      ("h16_moe_capacity", "param_bytes"), ("h16_compiled_fused", "param_bytes"),
                                      ("h16_siglip", "param_bytes")])
def test_trained_weights_gradients_and_state(name, key):
    """Only what the optimizer trains is parameters, gradients and 2x AdamW state: GRPO's policy (not
    its reference or reward model), DINO's student (not its EMA teacher), every weight elsewhere."""
    snap = heldout(name)
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain(name):
        assert r.by_category["parameter"] == meta[key], how
        grads = not_released(r, "gradients")
        assert len(grads) == meta["nsteps"] and all(p.bytes == meta[key] for p in grads), how
        (state,) = not_released(r, "optimizer_state_init")
        # a compiled AdamW keeps each parameter's step count on the device too: 4 bytes each
        assert 0 <= state.bytes - 2 * meta[key] <= 4 * grads[0].details["count"], how
    if name == "h16_grpo":
        marked, _ = (r for _, r in marked_and_plain(name))
        assert len(marked.steps) == meta["nsteps"]


# GRPO's frozen copies, DINO's teacher and the compiled backward's blocks are no longer taken for trained
# weights since the third frameless round (backward placed at its seed: infer/seed.py; rollouts left
# 'other': infer/other_work.py; the optimizer read where it runs: gradients.LATE_SHARE, passes.RECOMPUTE_SPAN)
@pytest.mark.parametrize("name,key", [("h16_grpo", "policy_bytes"),
                                      ("h16_dino_multicrop", "student_bytes"),
                                      ("h16_compiled_fused", "param_bytes")])
def test_trained_weights_without_frames(name, key):
    snap = heldout(name)
    r = analyzed(name, "bare")
    meta = snap["phasemem"]["meta"]
    assert r.by_category["parameter"] <= meta[key]
    assert all(p.bytes <= meta[key] for p in not_released(r, "gradients"))
