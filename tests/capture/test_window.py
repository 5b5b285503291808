"""Step windows on a plain loop: ``instrument(model, opt, steps="3-4")`` records those steps alone.

Checked from the raw snapshot against the loop's own clock: every event and every optimizer range
falls inside the named steps, and outside the window nothing of the recording is installed."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")  # what this file records runs on torch: without it, it skips
import torch.nn.functional as F  # noqa: E402

import phasemem  # noqa: E402
from phasemem.capture import cpu as capture_cpu  # noqa: E402
from phasemem.capture import hooks  # noqa: E402
from phasemem.run import instrument  # noqa: E402

VOCAB, DIM = 2000, 32
NSTEPS = 6


def recording_on() -> bool:
    # Not before CUDA is initialised: the probe reads an allocator that does not exist yet.
    probe = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    if probe is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return False
    return bool(probe())


@pytest.fixture(params=["cpu", "cuda"])
def device(request):
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return request.param


def make(device: str = "cpu", opt_cls=torch.optim.AdamW):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, DIM), torch.nn.Linear(DIM, VOCAB)).to(device)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, VOCAB, (4, 16), generator=g).to(device),
                torch.randint(0, VOCAB, (4, 16), generator=g).to(device)) for _ in range(NSTEPS)]
    return model, opt_cls(model.parameters(), lr=1e-2), batches


def loop(model, opt, batches, during=None):
    """Train; (before forward, after step) wall-clock µs per step, and ``during(k)`` before step k."""
    clock = []
    for k, (x, y) in enumerate(batches):
        if during is not None:
            during(k)
        t0 = time.time_ns() // 1000
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if x.is_cuda:
            torch.cuda.synchronize()
        clock.append((t0, time.time_ns() // 1000))
    return clock


def steps_holding(clock, t: int) -> list[int]:
    return [k for k, (t0, t1) in enumerate(clock) if t0 <= t <= t1]


def optimizer_starts(snap) -> list[int]:
    return [a["time_us"] for a in snap["external_annotations"]
            if a["stage"] == "START" and a["name"].startswith("Optimizer.step#")]


def test_window_records_only_its_steps(device):
    model, opt, batches = make(device)
    with instrument(model, opt, steps="3-4") as run:
        clock = loop(model, opt, batches)
    snap = run.snapshot
    events = [e for trace in snap["device_traces"] for e in trace]
    assert events
    # Nothing allocated before step 3's forward or after step 4's optimizer step returned.
    assert min(e["time_us"] for e in events) >= clock[3][0]
    assert max(e["time_us"] for e in events) <= clock[4][1]
    assert [steps_holding(clock, t) for t in optimizer_starts(snap)] == [[3], [4]]
    forwards = [a["time_us"] for a in snap["external_annotations"]
                if a["name"] == "phasemem::forward" and a["stage"] == "START"]
    assert [steps_holding(clock, t) for t in forwards] == [[3], [4]]
    assert snap["phasemem"]["steps"] == [3, 4] and snap["phasemem"]["steps_requested"] == [3, 4]
    report = run.report()
    assert len(report.steps) == 2 and all(s.complete for s in report.steps)
    # numbered as the loop numbered them, so that --steps 4 means the loop's step 4
    assert [s.number for s in report.steps] == [3, 4]
    assert [s.number for s in phasemem.analyze(snap, steps="4").steps] == [4]
    for step in report.steps:
        assert {"forward", "backward", "optimizer"} <= {n for n, p in step.phases.items() if p.n_events}


def test_nothing_installed_outside_the_window(device):
    model, opt, batches = make(device)
    seen = {}

    def during(k):
        seen[k] = (capture_cpu.profiler_enabled() or recording_on(), "forward" in model.__dict__,
                   torch.autograd.backward is not ORIGINAL_BACKWARD, "step" in opt.__dict__)

    with instrument(model, opt, steps="2-3"):
        loop(model, opt, batches, during)
    # before: only the step counter (on opt.step); inside: recording and markers; after: nothing
    assert seen[0] == seen[1] == (False, False, False, True)
    assert seen[3] == (True, True, True, True)
    assert seen[4] == seen[5] == (False, False, False, False)
    assert not hooks._registry and hooks.MARKERS.open_count == 0


ORIGINAL_BACKWARD = torch.autograd.backward


def test_window_from_step_zero_and_open_ended():
    model, opt, batches = make()
    with instrument(model, opt, steps="-1") as first:
        clock = loop(model, opt, batches)
    assert [steps_holding(clock, t) for t in optimizer_starts(first.snapshot)] == [[0], [1]]
    model, opt, batches = make()
    with instrument(model, opt, steps="4-") as last:
        clock = loop(model, opt, batches)
    assert [steps_holding(clock, t) for t in optimizer_starts(last.snapshot)] == [[4], [5]]
    assert last.snapshot["phasemem"]["steps"] == [4, 5]
    assert last.snapshot["phasemem"]["steps_requested"] == [4, None]


def test_window_never_reached_warns_and_says_why():
    model, opt, batches = make()
    with pytest.warns(RuntimeWarning, match=r"ended after 6 step\(s\), before steps=10-12"):
        with instrument(model, opt, steps="10-12") as run:
            loop(model, opt, batches)
    assert run.snapshot is None and "step" not in opt.__dict__
    with pytest.raises(phasemem.PhasememError, match="before steps=10-12"):
        run.report()


class PlainSGD:
    """An optimizer that is no torch.optim.Optimizer: instrument() marks its step itself, on top of the
    window's counter, and both must come off in the right order."""

    def __init__(self, params, lr):
        self.param_groups = [{"params": list(params), "lr": lr}]
        self.state = {}

    def zero_grad(self, set_to_none=True):
        for p in self.param_groups[0]["params"]:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p in self.param_groups[0]["params"]:
            p.add_(p.grad, alpha=-self.param_groups[0]["lr"])


def test_window_with_an_optimizer_phasemem_marks_itself():
    model, opt, batches = make(opt_cls=PlainSGD)
    with instrument(model, opt, steps="1-2") as run:
        clock = loop(model, opt, batches)
    marks = [a for a in run.snapshot["external_annotations"] if a["name"] == "phasemem::optimizer"]
    starts = [a["time_us"] for a in marks if a["stage"] == "START"]
    assert [steps_holding(clock, t) for t in starts] == [[1], [2]]
    assert sum(a["stage"] == "END" for a in marks) == 2
    assert "step" not in opt.__dict__ and "zero_grad" not in opt.__dict__
    assert len(run.report().steps) == 2


@pytest.mark.parametrize("spec", ["5-2", "abc", "", "3-x"])
def test_bad_steps_is_one_line_error(spec):
    model, opt, _ = make()
    with pytest.raises(phasemem.PhasememError) as err:
        instrument(model, opt, steps=spec)
    assert "\n" not in str(err.value) and "steps=" in str(err.value)


def test_steps_need_something_to_count():
    with pytest.raises(phasemem.PhasememError, match="counts optimizer steps"):
        with instrument(None, None, steps="2-3"):
            pass
