"""Every step holds every phase any step ran, a phase it did not run empty; a loss made of frees alone
is no phase. On real traces: as recorded (their markers) and as handed over without marks, the
boundaries checked against the raw trace's own marks (phasemem:: or gt::)."""
from __future__ import annotations

import copy
import lzma
import pickle
from pathlib import Path

import pytest

import phasemem
from helpers.paths import FIXTURES
from phasemem.vocab import PHASES

HELD = ["heldout/heldout_bert_mlm", "heldout/heldout_t5_adafactor", "heldout2/heldout2_distilbert_cls",
        "heldout2/heldout2_mixtral_moe", "heldout3/heldout3_gpt2_hf", "heldout7/h7_peft_lora",
        "heldout8/h8_mid_step_start", "heldout9/h9_scaler_skips_first", "heldout5/h5_wgan_gp"]
PATHS = sorted(FIXTURES.glob("*.pkl.xz")) + [FIXTURES / f"{n}.pkl.xz" for n in HELD]


def _load(path: Path) -> tuple[dict, str]:
    snap = pickle.loads(lzma.decompress(path.read_bytes()))
    return snap, (snap.get("phasemem") or {}).get("markers", "phasemem::")


def _handed_over(snap: dict) -> dict:
    """Without the truth marks (phasemem:: or gt::) and our key; frames and torch's own ranges kept."""
    s = copy.deepcopy(snap)
    s.pop("phasemem", None)
    s["external_annotations"] = [a for a in s.get("external_annotations") or []
                                 if not a["name"].startswith(("phasemem::", "gt::"))]
    return s


def _ranges(snap: dict, name: str) -> list[tuple[int, int]]:
    """(START, END) times of one marker name, from the raw annotations."""
    out, opened = [], []
    for a in sorted(snap.get("external_annotations") or [], key=lambda a: a["time_us"]):
        if a["name"] == name:
            if a["stage"] == "START":
                opened.append(a["time_us"])
            elif opened:
                out.append((opened.pop(), a["time_us"]))
    return out


def _check_keys(report, events: list[dict]) -> None:
    ran = {n for s in report.steps for n, p in s.phases.items() if p.ran}
    for s in report.steps:
        assert set(s.phases) == ran, (s.number, sorted(set(s.phases) ^ ran))
        for name, p in s.phases.items():
            if p.ran:
                assert p.n_events or p.at_event is not None
                continue
            # kept for its key: no events, no bytes, no place
            assert (p.n_events, p.start_event, p.end_event, p.peak_event, p.at_event) == (0, None, None, None, None)
            assert (p.start_bytes, p.peak_bytes, p.end_bytes, p.top_allocations) == (0, 0, 0, [])
    # every step's keys in JSON too, an empty one marked so
    for s, d in zip(report.steps, report.to_dict()["steps"]):
        assert list(d["phases"]) == list(s.phases)
        assert all(d["phases"][n]["ran"] is p.ran and (p.ran or d["phases"][n]["n_events"] == 0)
                   for n, p in s.phases.items())
    # the phases over all steps are those that ran: their events and first start are theirs
    assert set(report.phases) == ran
    for name, ph in report.phases.items():
        occ = [s.phases[name] for s in report.steps if s.phases[name].ran]
        assert ph.n_events == sum(p.n_events for p in occ) and ph.start_bytes == occ[0].start_bytes
    # a loss computes: some event of each step's loss is an allocation
    codes = report.analysis.labels.tolist()
    for s in report.steps:
        if s.phases.get("loss") is None or not s.phases["loss"].n_events:
            continue
        mine = [i for i in range(s.start_event, s.end_event + 1)
                if PHASES[codes[i]] == "loss" and report.analysis.step_of[i] == s.index]
        assert any(events[i]["action"] == "alloc" for i in mine), (s.number, mine)


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name.split(".")[0])
def test_every_step_has_every_phase_key(path):
    if not path.exists():
        pytest.skip(f"{path} is missing")
    snap, prefix = _load(path)
    events = snap["device_traces"][0]
    for report in (phasemem.analyze(copy.deepcopy(snap), marker_prefix=prefix, what_ifs=False),
                   phasemem.analyze(_handed_over(snap), what_ifs=False)):
        _check_keys(report, events)
        name = next(iter(report.phases), None)
        if name is not None:
            assert report.steps[0].phases[name].name == name  # indexes, ran or not


def test_loss_inside_the_model_leaves_no_loss_phase_under_markers():
    """llama_hf computes its loss inside the model: between phasemem::forward's END and zero_grad's START
    only the output's and the previous loss' frees (2 events in step 0, 4 in steps 1-2). They were a
    'loss' phase in steps 0-2; they are 'other', every step keeps an empty 'loss' out of its keys
    (no step ran one), and forward's boundaries are its marker's exactly."""
    snap, prefix = _load(FIXTURES / "llama_hf.pkl.xz")
    events = snap["device_traces"][0]
    t = [e["time_us"] for e in events]
    report = phasemem.analyze(copy.deepcopy(snap), marker_prefix=prefix)
    fwd, zg = _ranges(snap, "phasemem::forward"), _ranges(snap, "phasemem::zero_grad")
    assert len(fwd) == len(zg) == len(report.steps) == 3
    assert "loss" not in report.phases and all("loss" not in s.phases for s in report.steps)
    for s, (f0, f1), (z0, _) in zip(report.steps, fwd, zg):
        inside = [i for i in range(len(t)) if f0 <= t[i] <= f1]
        gap = [i for i in range(len(t)) if f1 < t[i] < z0]
        assert (s.phases["forward"].start_event, s.phases["forward"].end_event) == (inside[0], inside[-1])
        assert len(gap) == (2 if s.index == 0 else 4)
        assert all(events[i]["action"] in ("free_requested", "free_completed") for i in gap)
        assert all(report.labels[i] == "other" for i in gap)


def test_loss_inside_the_model_inferred_against_gt_marks():
    """h7_peft_lora (gt:: marks, the model's own loss, frames): handed over without its marks, no step
    gets a loss phase; each step's inferred forward lies inside its gt::forward range, and the only
    events of that range it leaves out are frees: the output dropped as the call returns."""
    path = FIXTURES / "heldout7" / "h7_peft_lora.pkl.xz"
    if not path.exists():
        pytest.skip(f"{path} is missing")
    snap, _ = _load(path)
    events = snap["device_traces"][0]
    t = [e["time_us"] for e in events]
    report = phasemem.analyze(_handed_over(snap))
    fwd = _ranges(snap, "gt::forward")
    assert len(fwd) == len(report.steps) == 3
    assert "loss" not in report.phases
    for s, (f0, f1) in zip(report.steps, fwd):
        inside = [i for i in range(len(t)) if f0 <= t[i] <= f1]
        ph = s.phases["forward"]
        assert inside[0] <= ph.start_event and ph.end_event <= inside[-1]
        left = [i for i in inside if report.labels[i] != "forward"]
        assert left and all(events[i]["action"] in ("free_requested", "free_completed") for i in left)
        assert all(report.labels[i] == "other" for i in left)


def test_the_readme_loop_on_cpu_has_no_one_event_loss():
    """The issue's case, recorded: README's loop (``loss = model(x).loss``) on CPU under instrument(), the
    model keeping nothing of its output but the loss. Step 0 had no 'loss', steps 1 and 2 a one-event
    'loss': the free of the previous step's loss value as ``loss`` is bound again, after forward's
    END. Now no step has a loss phase; that free is 'other' in steps 1-2, every step has the same keys."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    import torch.nn.functional as F

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = torch.nn.Embedding(1000, 64), torch.nn.Linear(64, 1000)

        def forward(self, x):
            return SimpleNamespace(loss=F.cross_entropy(self.head(self.emb(x)).flatten(0, 1), x.flatten()))

    torch.manual_seed(0)
    model = LM()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randint(0, 1000, (8, 64))
    with phasemem.instrument(model, opt, device="cpu") as run:
        for _ in range(3):
            loss = model(x).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    report = run.report()
    events = run.snapshot["device_traces"][0]
    _check_keys(report, events)
    assert len(report.steps) == 3 and "loss" not in report.phases
    fwd = _ranges(run.snapshot, "phasemem::forward")
    life = report.analysis.timeline.lifetimes
    for s, (_, f1) in zip(report.steps, fwd):
        gap = [i for i in range(s.start_event, s.end_event + 1)
               if f1 < events[i]["time_us"] and report.labels[i] not in ("zero_grad", "backward", "optimizer")]
        gap = [i for i in gap if i < (s.phases["zero_grad"].start_event or s.phases["backward"].start_event)]
        assert len(gap) == (0 if s.index == 0 else 1)
        for i in gap:  # the previous step's loss value, made in its forward
            made = int(life.alloc_event[(life.free_event == i) & (life.alloc_event >= 0)][0])
            assert events[i]["action"] == "free_completed" and report.labels[i] == "other"
            assert report.analysis.step_of[made] == s.index - 1 and report.labels[made] == "forward"
