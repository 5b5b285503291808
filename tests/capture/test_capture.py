"""Capture: markers, the converted trace, and that instrument() leaves no trace of itself.

Most tests run on CPU (the profiler path). Those taking the ``device`` fixture run on CUDA too when
a GPU is there (skipped otherwise): losses unchanged, exception safety, nesting."""

from __future__ import annotations

import io
import lzma
import pickle
import warnings

import pytest

torch = pytest.importorskip("torch")  # what this file records runs on torch: without it, it skips
import torch.nn.functional as F  # noqa: E402

import phasemem  # noqa: E402
from helpers.paths import FIXTURES  # noqa: E402
from phasemem.capture import cpu as capture_cpu  # noqa: E402
from phasemem.capture import hooks  # noqa: E402
from phasemem.run import Run, instrument  # noqa: E402

VOCAB, DIM, BATCH, SEQ = 2000, 32, 4, 16
PHASES = ("forward", "zero_grad", "backward", "optimizer")

ORIGINALS = {
    "Tensor.backward": torch.Tensor.backward,
    "autograd.backward": torch.autograd.backward,
    "autograd.grad": torch.autograd.grad,
}


class TinyLM(torch.nn.Module):
    """Embedding -> Linear head; with a 2000-token vocabulary the logits dominate memory."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, DIM)
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, x):
        return self.head(self.emb(x))


@pytest.fixture(params=["cpu", "cuda"])
def device(request):
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return request.param


def make(seed: int = 0, device: str = "cpu"):
    torch.manual_seed(seed)
    model = TinyLM().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(seed + 1)
    batches = [
        (torch.randint(0, VOCAB, (BATCH, SEQ), generator=g).to(device),
         torch.randint(0, VOCAB, (BATCH, SEQ), generator=g).to(device))
        for _ in range(3)
    ]
    return model, opt, batches


def train(model, opt, batches, fail_at: int | None = None) -> list[float]:
    losses = []
    for i, (x, y) in enumerate(batches):
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        if i == fail_at:
            raise ValueError("boom")
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


TORCH_RANGES = {"Optimizer.step#": "optimizer", "Optimizer.zero_grad#": "zero_grad"}


def markers(snap: dict) -> list[tuple[str, str, int]]:
    """Phase ranges in the snapshot: ours, and torch.optim's own where we left a phase to them
    (instrument() does not mark a torch.optim optimizer's step and zero_grad a second time)."""
    prefix = snap.get("phasemem", {}).get("markers", "phasemem::")  # the plain_* fixtures use gt::
    ours = [
        (a["name"].removeprefix(prefix), a["stage"], a["time_us"])
        for a in snap["external_annotations"]
        if a["name"].startswith(prefix) and not a["name"].startswith(prefix + "step")
    ]
    have = {name for name, _, _ in ours}
    theirs = [(ph, a["stage"], a["time_us"]) for a in snap["external_annotations"]
              for start, ph in TORCH_RANGES.items() if a["name"].startswith(start) and ph not in have]
    return sorted(ours + theirs, key=lambda m: m[2]) if theirs else ours


def recording_on() -> bool:
    # Not before CUDA is initialised: the probe reads the allocator, which does not exist yet (segfault).
    probe = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    if probe is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return False
    return bool(probe())


def assert_clean(model: torch.nn.Module, opt=None) -> None:
    assert torch.Tensor.backward is ORIGINALS["Tensor.backward"]
    assert torch.autograd.backward is ORIGINALS["autograd.backward"]
    assert torch.autograd.grad is ORIGINALS["autograd.grad"]
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert not getattr(model, "_forward_hooks_always_called", {})
    assert "zero_grad" not in model.__dict__
    fwd = model.__dict__.get("forward")  # an OptimizedModule's own forward is back, ours is gone
    assert fwd is None or "_wrap_method" not in getattr(getattr(fwd, "__func__", fwd), "__qualname__", "")
    if opt is not None:
        assert "zero_grad" not in opt.__dict__ and "step" not in opt.__dict__
        assert opt.zero_grad.__func__ is type(opt).zero_grad
    assert not capture_cpu.profiler_enabled()
    assert not recording_on()
    assert not hooks._registry and hooks.MARKERS.open_count == 0


@pytest.fixture(scope="module")
def recorded():
    model, opt, batches = make()
    with instrument(model, opt, device="cpu") as run:
        losses = train(model, opt, batches)
    return run, model, opt, losses


def test_markers_pair_in_step_order(recorded):
    run, *_ = recorded
    seq = [(name, stage) for name, stage, _ in markers(run.snapshot)]
    one_step = [(p, s) for p in PHASES for s in ("START", "END")]
    assert seq == one_step * 3
    times = [t for *_, t in markers(run.snapshot)]
    assert times == sorted(times)
    # torch's own optimizer ranges come along under their own names
    names = {a["name"] for a in run.snapshot["external_annotations"]}
    assert "Optimizer.step#AdamW.step" in names and "Optimizer.zero_grad#AdamW.zero_grad" in names


def test_trace_events_fall_inside_marker_ranges(recorded):
    run, *_ = recorded
    snap = run.snapshot
    trace = snap["device_traces"][0]
    assert {e["action"] for e in trace} == {"alloc", "free_completed"}
    assert all(e["size"] > 0 and e["stream"] == 0 and e["frames"] == [] for e in trace)
    assert [e["time_us"] for e in trace] == sorted(e["time_us"] for e in trace)

    spans: dict[str, list[tuple[int, int]]] = {p: [] for p in PHASES}
    opened: dict[str, int] = {}
    for name, stage, t in markers(snap):
        if stage == "START":
            opened[name] = t
        else:
            spans[name].append((opened.pop(name), t))

    def inside(phase: str, action: str) -> list[dict]:
        return [e for e in trace if e["action"] == action and any(a <= e["time_us"] <= b for a, b in spans[phase])]

    logits = BATCH * SEQ * VOCAB * 4
    # the clocks agree: the logits are allocated inside forward, their grads inside backward
    assert any(e["size"] >= logits for e in inside("forward", "alloc"))
    assert any(e["size"] >= logits for e in inside("backward", "alloc"))
    assert inside("backward", "free_completed")
    # set_to_none frees last step's grads: nothing in step 0, the grads in steps 1 and 2
    assert len(inside("zero_grad", "free_completed")) >= 2
    # AdamW's state (exp_avg, exp_avg_sq) appears in the first optimizer step
    assert len(inside("optimizer", "alloc")) >= 4


def test_preexisting_storages_become_segments(recorded):
    run, model, opt, _ = recorded
    segs = run.snapshot["segments"]
    ptrs = {s["address"] for s in segs}
    for p in model.parameters():
        assert p.untyped_storage().data_ptr() in ptrs
        assert p.grad.untyped_storage().data_ptr() in ptrs
        for v in opt.state[p].values():
            assert v.untyped_storage().data_ptr() in ptrs
    seg = segs[0]
    assert seg["device"] == -1 and seg["segment_type"] == "cpu"
    assert seg["blocks"][0]["state"] == "active_allocated"
    assert seg["total_size"] == seg["blocks"][0]["size"] > 0
    # parameters pre-exist: the trace never allocates them
    allocated = {e["addr"] for e in run.snapshot["device_traces"][0] if e["action"] == "alloc"}
    assert model.head.weight.untyped_storage().data_ptr() not in allocated


def test_phasemem_key_and_plain_pickle(recorded, tmp_path):
    run, *_ = recorded
    meta = run.snapshot["phasemem"]
    assert meta["device"] == "cpu" and meta["source"] == "cpu-profiler"
    assert meta["markers"] == "phasemem::" and type(meta["torch"]) is str

    class NoGlobals(pickle.Unpickler):
        def find_class(self, module, name):
            raise AssertionError(f"snapshot pickles a {module}.{name}")

    for name in ("s.pkl", "s.pkl.xz"):
        path = tmp_path / name
        assert run.save(path) == str(path)
        raw = path.read_bytes()
        raw = lzma.decompress(raw) if name.endswith(".xz") else raw
        assert NoGlobals(io.BytesIO(raw)).load() == run.snapshot
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.pkl", "s.pkl.xz"]  # no temp files left


def test_everything_removed_after_exit(recorded):
    _, model, opt, _ = recorded
    assert_clean(model, opt)


def test_losses_unchanged(device):
    plain = train(*make(device=device))
    again = train(*make(device=device))
    model, opt, batches = make(device=device)
    with instrument(model, opt, device=device) as run:
        seen = train(model, opt, batches)
    assert run.snapshot["phasemem"]["device"].startswith(device)
    if plain == again:  # bit-for-bit reproducible here (always on CPU): then exactly the same with instrument()
        assert seen == plain
    else:  # a GPU kernel summing in a varying order: within the run-to-run spread
        spread = max(abs(a - b) for a, b in zip(plain, again))
        assert max(abs(a - b) for a, b in zip(seen, plain)) <= 4 * spread
    assert_clean(model, opt)


def test_raising_block_cleans_up_and_reraises(device):
    model, opt, batches = make(device=device)
    run = instrument(model, opt, device=device)
    with pytest.raises(ValueError, match="boom"):
        with run:
            train(model, opt, batches, fail_at=1)
    assert_clean(model, opt)
    seq = [(n, s) for n, s, _ in markers(run.snapshot)]
    # step 0 complete, step 1 stopped after zero_grad: every START has its END
    assert seq[-4:] == [("forward", "START"), ("forward", "END"), ("zero_grad", "START"), ("zero_grad", "END")]
    assert len(seq) == 8 + 4


def test_raise_inside_forward_and_backward_closes_markers(device):
    class Boom(torch.nn.Module):
        def forward(self, x):
            raise KeyboardInterrupt

    model = Boom()
    with pytest.raises(KeyboardInterrupt):
        with instrument(model, device=device) as run:
            model(torch.ones(1, device=device))
    assert markers(run.snapshot)[-1][:2] == ("forward", "END")
    assert_clean(model)

    model, opt, batches = make(device=device)
    x, _ = batches[0]
    with pytest.raises(RuntimeError):
        with instrument(model, opt, device=device) as run:
            out = model(x)
            out.sum().backward()
            out.sum().backward()  # graph already freed
    assert [(n, s) for n, s, _ in markers(run.snapshot)][-2:] == [("backward", "START"), ("backward", "END")]
    assert_clean(model, opt)



@pytest.mark.filterwarnings("ignore:FSDP2-wrapped module")  # TinyLM returns a view; nothing is done in place
def test_fsdp2_dtensor_parameters_are_recorded():
    """FSDP2 (``fully_shard``) turns parameters, gradients and AdamW's state into DTensors, which have
    no storage of their own: the pre-existing segments must come from their local shards, and
    leaving the block must not fail (it once raised "invalid python storage" on exit)."""
    dist = torch.distributed
    if not dist.is_available():
        pytest.skip("torch.distributed not built")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model, _, batches = make()
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        with instrument(model, opt, device="cpu") as run:
            train(model, opt, batches)
        local = [t.to_local() for p in model.parameters()
                 for t in (p, p.grad, *opt.state[p].values()) if t is not None and t.dim()]
        want = {t.untyped_storage().data_ptr() for t in local}
        got = {s["address"] for s in run.snapshot["segments"]}
        assert want <= got
        marks = markers(run.snapshot)
        assert [n for n, s, _ in marks].count("backward") == 2 * len(batches)
        # fully_shard's pre-forward hook all-gathers the parameters: the first allocation of the
        # block, which the forward range must hold (our hooks sit outside FSDP's)
        first_alloc = next(e["time_us"] for e in run.snapshot["device_traces"][0] if e["action"] == "alloc")
        assert first_alloc >= next(t for n, st, t in marks if n == "forward" and st == "START")
        report = run.report()
        assert report.phases["optimizer"].peak_bytes > 0
        # FSDP2 reduce-scatters each group's gradients into one flat buffer, the size of no single
        # parameter: still gradients, as many bytes as the local gradient shards
        shards = [p.grad.to_local().untyped_storage() for p in model.parameters()]
        grad_bytes = sum({s.data_ptr(): s.nbytes() for s in shards}.values())
        made = [q.bytes for q in report.patterns if q.kind == "gradients" and q.phase == "backward"]
        assert made == [grad_bytes] * len(batches)
    finally:
        if created:
            dist.destroy_process_group()
    assert "forward" not in model.__dict__  # our wrapper gone; FSDP's own hooks stay, as they should

def test_inference_without_optimizer():
    model, _, batches = make()
    with torch.no_grad(), instrument(model, device="cpu") as run:
        for x, _ in batches:
            model(x)
    seq = [(n, s) for n, s, _ in markers(run.snapshot)]
    assert seq == [("forward", "START"), ("forward", "END")] * 3
    assert any(e["action"] == "alloc" for e in run.snapshot["device_traces"][0])
    assert_clean(model)


def test_reentrant_forward_nests():
    class Recursive(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, depth=2):
            return self.lin(x) if depth == 0 else self(x, depth - 1)

    model = Recursive()
    with instrument(model, device="cpu") as run:
        model(torch.ones(2, 4))
    seq = [(n, s) for n, s, _ in markers(run.snapshot)]
    assert seq == [("forward", "START")] * 3 + [("forward", "END")] * 3
    assert_clean(model)


def test_several_optimizers_scheduler_and_closure():
    torch.manual_seed(0)
    model = TinyLM()
    opt_a = torch.optim.SGD(model.emb.parameters(), lr=0.1)
    opt_b = torch.optim.AdamW(model.head.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt_b, step_size=1)  # wraps opt_b.step before us
    sched_step = opt_b.__dict__["step"]
    x = torch.randint(0, VOCAB, (2, 8))

    def closure():
        for o in (opt_a, opt_b):
            o.zero_grad()
        loss = model(x).float().pow(2).mean()
        loss.backward()
        return loss

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. LRScheduler's "optimizer.step() has been overridden"
        with instrument(model, [opt_a, opt_b], device="cpu") as run:
            opt_a.step(closure)  # Lightning's pattern: the whole step runs inside optimizer.step
            opt_b.step()
            sched.step()
    seq = [(n, s) for n, s, _ in markers(run.snapshot)]
    assert seq == [
        ("optimizer", "START"),
        ("zero_grad", "START"), ("zero_grad", "END"),
        ("zero_grad", "START"), ("zero_grad", "END"),
        ("forward", "START"), ("forward", "END"),
        ("backward", "START"), ("backward", "END"),
        ("optimizer", "END"),
        ("optimizer", "START"), ("optimizer", "END"),
    ]
    assert opt_b.__dict__["step"] is sched_step  # the scheduler's wrapper is back
    assert "step" not in opt_a.__dict__


def test_compiled_module_wrapper_gets_markers():
    torch._dynamo.reset()
    model = torch.compile(TinyLM(), backend="eager")
    x = torch.randint(0, VOCAB, (2, 8))
    model(x)  # compile outside the recording
    with instrument(model, device="cpu") as run:
        model(x)
        model(x)
    seq = [(n, s) for n, s, _ in markers(run.snapshot)]
    assert seq == [("forward", "START"), ("forward", "END")] * 2
    assert_clean(model)


def test_module_compiled_in_place_gets_markers():
    """``model.compile()`` compiles ``_call_impl`` itself: the forward range comes from hooks kept out
    of dynamo, not from a wrapped ``forward`` (which would be traced)."""
    torch._dynamo.reset()
    model = TinyLM()
    model.compile(backend="eager")
    x = torch.randint(0, VOCAB, (2, 8))
    model(x)
    with instrument(model, device="cpu") as run:
        assert "forward" not in model.__dict__ and len(model._forward_pre_hooks) == 1
        model(x)
        model(x)
    seq = [(n, s) for n, s, _ in markers(run.snapshot)]
    assert seq == [("forward", "START"), ("forward", "END")] * 2
    assert_clean(model)



def test_failed_snapshot_warns_instead_of_killing_the_job(monkeypatch):
    """The block's training has finished when the snapshot is taken: a failure there is a warning
    (the job goes on to its next line), the hooks are still removed, and report() says why."""
    def broken(*args, **kwargs):
        raise RuntimeError("converter broke")

    monkeypatch.setattr(capture_cpu, "snapshot_from_profiler", broken)
    model, opt, batches = make()
    with pytest.warns(RuntimeWarning, match="could not be finished.*converter broke"):
        with instrument(model, opt, device="cpu") as run:
            train(model, opt, batches[:1])
    assert run.snapshot is None
    assert_clean(model, opt)
    with pytest.raises(phasemem.PhasememError, match="converter broke"):
        run.report()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(capture_cpu, "snapshot_from_profiler", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with instrument(model, opt, device="cpu"):
            train(model, opt, batches[:1])
    assert_clean(model, opt)

def test_report_needs_finished_run():
    run = instrument(TinyLM(), device="cpu")
    assert isinstance(run, Run)
    with pytest.raises(Exception, match="no snapshot"):
        run.save("/nonexistent/x.pkl")


RECORDED = sorted(FIXTURES.glob("*.pkl.xz"))
# The held-out recordings (fixtures/heldout*/, for evaluating marker-free inference) are checked here only.
RECORDED += sorted(FIXTURES.glob("heldout*/*.pkl.xz"))


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name.split(".")[0])
def test_recorded_fixture_markers_pair(path):
    """The GPU fixtures recorded with fixtures/record.py: one marker range per phase call, balanced."""
    snap = pickle.loads(lzma.decompress(path.read_bytes()))
    meta = snap["phasemem"]["meta"]
    assert snap["phasemem"].get("source", "cuda") == "cuda" and meta["workload"] == path.name.split(".")[0]
    if str(meta.get("recording", "")).startswith('enabled="state"'):  # h7_state_only: no history kept
        assert len(snap["device_traces"][0]) <= 1 and snap["segments"]
        return
    open_: list[str] = []
    count: dict[str, int] = {}
    for name, stage, _ in markers(snap):
        if stage == "START":
            open_.append(name)
            count[name] = count.get(name, 0) + 1
        else:
            assert open_.pop() == name
    assert not open_
    steps = meta["nsteps"] * meta.get("micro_batches", 1)
    # gpt_train_eval adds evaluation forwards; skipped updates (h9_scaler_skips_first) iterations with
    # no optimizer range; two backward passes a step (h9_multitask_retain_graph) more backward ranges
    assert count.get("forward", 0) == meta.get("forwards", steps)
    backwards = meta.get("backwards", steps)
    if "attempts" in meta:  # h13_oom_retry_halve: attempts that ran out of memory reached no backward
        backwards = sum(1 for _, how in meta["attempts"] if how == "ok")
        assert count.get("optimizer", 0) == count.get("zero_grad", 0) == backwards
        return
    if meta.get("optimizer_in_backward"):  # h6_optim_in_backward: torch's ranges, one per parameter a step
        assert count["backward"] == steps
        assert count["optimizer"] == count["zero_grad"] and count["optimizer"] % meta["nsteps"] == 0
        assert count["optimizer"] > meta["nsteps"]
    elif meta["optimizer"] is not None:
        assert count.get("backward", 0) == backwards
        assert count["optimizer"] == meta["nsteps"]
        assert count.get("zero_grad", 0) == meta.get("zero_grads", meta["nsteps"])  # the HF Trainer clears once more
    assert snap["device_traces"][0]


def test_deepcopy_inside_block_stays_independent():
    import copy

    model, opt, batches = make()
    x, _ = batches[0]
    with instrument(model, opt, device="cpu") as run:
        model(x).sum().backward()
        twin = copy.deepcopy(model)  # e.g. an EMA copy
        twin.zero_grad(set_to_none=True)
    assert all(p.grad is not None for p in model.parameters())  # the copy cleared its own grads
    assert all(p.grad is None for p in twin.parameters())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        twin(x)  # the hooks copied with the module are inert after exit
    assert not [e for e in prof.events() if e.name.startswith("phasemem::")]
    assert any(n == "zero_grad" for n, _, _ in markers(run.snapshot))
    assert_clean(model, opt)


def test_cpu_capture_prints_nothing_to_stderr(capfd):
    """torch's CPU profiler writes 'USDT: ... profiler_start/stop' lines from C++; the demo's output
    should be the report, not those."""
    model, opt, batches = make()
    x, _ = batches[0]
    with instrument(model, opt, device="cpu"):
        model(x).sum().backward()
    assert capfd.readouterr().err == ""


def test_oom_dump_writes_snapshot_report_and_picture_then_reraises(tmp_path):
    import json

    model, opt, batches = make()
    x, _ = batches[0]
    dump = tmp_path / "oom.pkl.xz"
    with pytest.raises(torch.OutOfMemoryError), pytest.warns(UserWarning, match="out of memory"):
        with instrument(model, opt, device="cpu", oom_dump=dump):
            model(x).sum().backward()
            opt.step()
            model(x)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    assert_clean(model, opt)
    report = phasemem.analyze(dump)
    assert report.n_events > 0 and "forward" in report.phases
    assert json.loads((tmp_path / "oom.json").read_text())["n_events"] == report.n_events
    assert (tmp_path / "oom.png").stat().st_size > 10_000


ONE_STEP = [(p, s) for p in PHASES for s in ("START", "END")]


def test_nesting(device):
    """CPU: the inner block is refused with a one-line error (the profiler cannot run twice) and the
    outer one goes on. CUDA: the inner block records inside the outer one's recording (left on, its
    history kept), shares its hooks (no range doubled), and the outer one ends as if alone."""
    model, opt, batches = make(device=device)
    with instrument(model, opt, device=device) as outer:
        train(model, opt, batches[:1])
        if device == "cpu":
            with pytest.raises(phasemem.PhasememError, match="do not nest"):
                with instrument(model, opt, device=device):
                    pass
            train(model, opt, batches[1:2])
        else:
            with instrument(model, opt, device=device) as inner:
                train(model, opt, batches[1:2])
            assert recording_on()  # the outer block still records
            train(model, opt, batches[2:])
    assert_clean(model, opt)
    seq = [(n, s) for n, s, _ in markers(outer.snapshot)]
    if device == "cpu":
        assert seq == ONE_STEP * 2
        return
    assert seq == ONE_STEP * 3
    meta = inner.snapshot["phasemem"]
    assert meta["nested"] and meta["recording_was_on"] and not outer.snapshot["phasemem"]["nested"]
    assert [(n, s) for n, s, _ in markers(inner.snapshot)] == ONE_STEP * 2  # outer's step 0 + its own
    lo, hi = meta["window_us"]
    assert [(n, s) for n, s, t in markers(inner.snapshot) if lo <= t <= hi] == ONE_STEP
    ow = outer.snapshot["phasemem"]["window_us"]
    assert ow[0] <= lo <= hi <= ow[1]


def test_nested_block_raising_keeps_outer_markers(device):
    """An exception that ends the inner block (CUDA), or a refused inner block (CPU), closes only what
    the inner block opened: the outer block's open forward range stays open until its forward ends."""

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            try:
                with instrument(self.lin, device=device):
                    self.lin(x)
                    raise ValueError("inner")
            except (ValueError, phasemem.PhasememError):
                pass
            return self.lin(x)

    model = Outer().to(device)
    with instrument(model, device=device) as run:
        model(torch.ones(2, 4, device=device))
    assert_clean(model)
    assert_clean(model.lin)
    seq = [(n, s) for n, s, _ in markers(run.snapshot)]
    if device == "cpu":
        assert seq == [("forward", "START"), ("forward", "END")]
    else:  # the inner block's range on lin nests inside the outer forward
        assert seq == [("forward", "START"), ("forward", "START"), ("forward", "END"), ("forward", "END")]


def test_recording_on_before_stays_on():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model, opt, batches = make(device="cuda")
    torch.cuda.memory._record_memory_history("all", max_entries=100_000)
    try:
        with instrument(model, opt, device="cuda") as run:
            train(model, opt, batches[:1])
        assert recording_on() and run.snapshot["phasemem"]["recording_was_on"] is True
        assert not run.snapshot["phasemem"]["nested"]
    finally:
        torch.cuda.memory._record_memory_history(None)
    assert_clean(model, opt)


def test_hooks_installed_twice_give_one_range_per_call():
    """A second install of any hook (a nested run's) takes a reference to the first instead of
    wrapping it again; releasing it leaves the first in place."""
    model, opt, batches = make()
    with instrument(model, opt, device="cpu") as run:
        installed = (model.forward, model.zero_grad, opt.zero_grad, opt.step, torch.autograd.backward)
        extra = [hooks.hook_forward(model), hooks.wrap_method(model, "zero_grad", "zero_grad"),
                 hooks.hook_optimizer(opt), hooks.patch_backward()]
        assert (model.forward, model.zero_grad, opt.zero_grad, opt.step, torch.autograd.backward) == installed
        train(model, opt, batches[:1])
        for release in reversed(extra):
            release()
            release()  # a second release does nothing
        train(model, opt, batches[1:2])
    assert [(n, s) for n, s, _ in markers(run.snapshot)] == ONE_STEP * 2
    assert_clean(model, opt)


def test_markers_close_since_a_mark():
    m = hooks.Markers()
    a = m.start("outer")
    mark = m.mark()
    m.start("inner")
    m.start("inner2")
    m.close_since(mark)
    assert m.open_count == 1
    m.end(a)
    m.end(a)  # closing twice is harmless
    assert m.open_count == 0


def test_cuda_recording_keeps_frees_without_stacks(monkeypatch):
    """instrument() records stacks on allocations only: with context="all" torch 2.11 crashes the
    backward of non-reentrant checkpointing around dropout (docs/trace.md; H200 matrix in
    benchmarks/results/ckpt_crash_h200.md)."""
    import importlib

    inst = importlib.import_module("phasemem.capture.instrument")
    calls = []
    monkeypatch.setattr(inst, "record_memory_history", lambda enabled, **kw: calls.append((enabled, kw)))
    monkeypatch.setattr(inst, "history_enabled", lambda: False)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    for stacks, context in (("python", "alloc"), ("all", "alloc"), (None, None)):
        run = inst.Recording(torch.nn.Linear(2, 2), None, device="cpu", stacks=stacks)
        run._start_cuda()
        inst._CUDA_RUNS.remove(run)
        assert calls[-1][0] == "all" and calls[-1][1]["context"] == context


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_checkpointed_dropout_backward_survives_recording():
    """The smallest reproduction of the crash, under instrument(): it must run."""
    from torch.utils.checkpoint import checkpoint

    x = torch.randn(1024, 1024, device="cuda", requires_grad=True)
    with instrument(None, None) as run:
        checkpoint(torch.nn.functional.dropout, x, 0.1, True, use_reentrant=False).sum().backward()
    assert run.report().n_events > 0
