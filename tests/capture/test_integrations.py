"""The trainer callbacks on CPU: a real Hugging Face ``Trainer`` (a tiny Llama, 2 accumulated
micro-batches) and a real Lightning ``Trainer`` run 8 steps and record steps 3-5 through the callback
alone. What was recorded is checked from the written snapshot against a clock callback placed before
ours: the optimizer ranges are those of steps 3, 4 and 5, and no event comes from outside them."""

from __future__ import annotations

import importlib
import json
import lzma
import pickle
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # what this file records runs on torch: without it, it skips
import torch.nn.functional as F  # noqa: E402

import phasemem  # noqa: E402
from phasemem.capture import cpu as capture_cpu  # noqa: E402
from phasemem.capture import hooks  # noqa: E402

NSTEPS, STEPS, FIRST, LAST = 8, "3-5", 3, 5
MIB = 2 ** 20
ORIGINAL_BACKWARD = torch.autograd.backward


def load(path):
    with open(path, "rb") as f:
        return pickle.loads(lzma.decompress(f.read()))


def starts(snap, prefix):
    return [a["time_us"] for a in snap["external_annotations"]
            if a["stage"] == "START" and a["name"].startswith(prefix)]


def step_of(clock, t):
    return [k for k, (t0, t1) in clock.items() if t0 <= t <= t1]


def raw_peak_rise(snap) -> int:
    """The highest the trace's own allocations rise above where it starts: allocs minus the frees of
    blocks the trace allocated, summed in event order (what the report's peak is above pre-existing)."""
    sizes, live = [], {}
    for e in snap["device_traces"][0]:
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            sizes.append(e["size"])
        elif e["action"] == "free_completed" and e["addr"] in live:
            sizes.append(-live.pop(e["addr"]))
    return int(np.max(np.cumsum(sizes)))


def check_recording(snap, clock, files, forwards_per_step):
    """What every callback run must show: the files, exactly steps 3-5 in them, three full steps."""
    assert set(files) == {"snapshot", "json", "png"}
    assert snap["phasemem"]["steps"] == [FIRST, LAST]
    # The clock callback stamps (begin, end) per step before ours runs: our recording starts after the
    # end stamp of step 2 and stops before step 6 begins.
    events = snap["device_traces"][0]
    assert events and min(e["time_us"] for e in events) >= clock[FIRST - 1][1]
    assert max(e["time_us"] for e in events) <= clock[LAST + 1][0]
    assert [step_of(clock, t) for t in starts(snap, "Optimizer.step#")] == [[3], [4], [5]]
    per_step = [step_of(clock, t)[0] for t in starts(snap, "phasemem::forward")]
    assert per_step == sorted(per_step) and {k: per_step.count(k) for k in set(per_step)} == \
        {k: forwards_per_step for k in (3, 4, 5)}
    with open(files["png"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with open(files["json"]) as f:
        assert len(json.load(f)["steps"]) == 3
    report = phasemem.analyze(files["snapshot"])
    assert len(report.steps) == 3 and all(s.complete for s in report.steps)
    for step in report.steps:
        assert {"forward", "backward", "optimizer"} <= {n for n, p in step.phases.items() if p.n_events}
    return report


def check_headline(metrics, snap):
    rise = (metrics["phasemem/peak_allocated_mib"] - metrics["phasemem/preexisting_mib"]) * MIB
    assert abs(rise - raw_peak_rise(snap)) <= 0.002 * MIB  # rounded to 1/1000 MiB
    assert FIRST <= metrics["phasemem/peak_step"] <= LAST


def assert_clean():
    assert torch.autograd.backward is ORIGINAL_BACKWARD
    assert not capture_cpu.profiler_enabled()
    assert not hooks._registry and hooks.MARKERS.open_count == 0


def by_format(paths):
    kinds = {".pickle.xz": "snapshot", ".json": "json", ".png": "png", ".txt": "txt"}
    return {kind: p for p in paths for suffix, kind in kinds.items() if p.endswith(suffix)}


# -- Hugging Face -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from phasemem.integrations.huggingface import PhasememCallback

    class Clock(transformers.TrainerCallback):
        def __init__(self):
            self.steps = {}

        def on_step_begin(self, args, state, control, **kw):
            self.steps[state.global_step] = (time.time_ns() // 1000, None)

        def on_step_end(self, args, state, control, **kw):
            k = state.global_step - 1
            self.steps[k] = (self.steps[k][0], time.time_ns() // 1000)

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    model = transformers.LlamaForCausalLM(cfg)
    rows = torch.randint(0, 256, (64, 16), generator=torch.Generator().manual_seed(1))

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return len(rows)

        def __getitem__(self, i):
            return {"input_ids": rows[i], "labels": rows[i]}

    out = tmp_path_factory.mktemp("hf")
    args = transformers.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=NSTEPS,
        learning_rate=1e-3, logging_steps=1000, save_strategy="no", report_to=[], use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True, seed=0)
    clock, cb = Clock(), PhasememCallback(steps=STEPS)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Rows(), callbacks=[clock, cb])
    trainer.train()
    return trainer, clock.steps, cb, out


def test_hf_trainer_records_steps_3_to_5(hf_run):
    trainer, clock, cb, out = hf_run
    files = by_format(cb.files)
    assert files["snapshot"] == str(out / "phasemem" / "rank0.pickle.xz")
    check_recording(load(files["snapshot"]), clock, files, forwards_per_step=2)  # 2 micro-batches a step


def test_hf_trainer_logs_the_headline(hf_run):
    trainer, clock, cb, out = hf_run
    logged = [h for h in trainer.state.log_history if "phasemem/peak_allocated_mib" in h]
    assert len(logged) == 1 and logged[0]["step"] == LAST + 1  # logged when step 5 ended
    check_headline(logged[0], load(by_format(cb.files)["snapshot"]))


def test_hf_trainer_leaves_nothing_behind(hf_run):
    trainer, *_ = hf_run
    assert_clean()
    assert "forward" not in trainer.model.__dict__ and "zero_grad" not in trainer.model.__dict__


def test_missing_framework_says_which_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers now raises ImportError
    monkeypatch.delitem(sys.modules, "phasemem.integrations.huggingface", raising=False)
    with pytest.raises(phasemem.PhasememError, match=r"needs transformers.*pip install 'phasemem\[hf\]'") as err:
        importlib.import_module("phasemem.integrations.huggingface")
    assert isinstance(err.value, ImportError) and "\n" not in str(err.value)


def test_import_phasemem_loads_no_framework():
    import subprocess

    code = ("import sys, phasemem, phasemem.integrations; "
            "print(sorted(m for m in ('transformers', 'lightning', 'pytorch_lightning', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# -- Lightning ----------------------------------------------------------------------------------
VOCAB = 2000


def lightning_fit(tmp_path, steps=STEPS, fail_at=None, **cb_kwargs):
    L = pytest.importorskip("lightning.pytorch")
    from phasemem.integrations.lightning import PhasememCallback

    class Lit(L.LightningModule):
        """training_step calls the children, not self(x): their forward must still be marked."""

        def __init__(self):
            super().__init__()
            self.emb, self.head = torch.nn.Embedding(VOCAB, 32), torch.nn.Linear(32, VOCAB)

        def training_step(self, batch, i):
            if self.trainer.global_step == fail_at:
                raise torch.OutOfMemoryError("simulated: CUDA out of memory")
            x, y = batch
            return F.cross_entropy(self.head(self.emb(x)).flatten(0, 1), y.flatten())

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    class Clock(L.Callback):
        def __init__(self):
            self.steps = {}

        def on_train_batch_start(self, trainer, module, batch, i):
            self.steps.setdefault(trainer.global_step, (time.time_ns() // 1000, None))

        def on_train_batch_end(self, trainer, module, outputs, batch, i):
            k = trainer.global_step - 1
            if k in self.steps and self.steps[k][1] is None:
                self.steps[k] = (self.steps[k][0], time.time_ns() // 1000)

    class Memo(L.loggers.Logger):
        name, version = "memo", 0

        def __init__(self):
            super().__init__()
            self.logged = []

        def log_hyperparams(self, *args, **kwargs):
            pass

        def log_metrics(self, metrics, step=None):
            self.logged.append((step, dict(metrics)))

    g = torch.Generator().manual_seed(0)
    data = [(torch.randint(0, VOCAB, (16,), generator=g), torch.randint(0, VOCAB, (16,), generator=g))
            for _ in range(2 * 4 * NSTEPS)]
    clock, cb = Clock(), PhasememCallback(steps=steps, **cb_kwargs)
    trainer = L.Trainer(max_steps=NSTEPS, accelerator="cpu", devices=1, logger=Memo(), enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[clock, cb],
                        default_root_dir=str(tmp_path), accumulate_grad_batches=2)
    trainer.fit(Lit(), torch.utils.data.DataLoader(data, batch_size=4))
    return trainer, clock.steps, cb


@pytest.fixture(scope="module")
def lightning_run(tmp_path_factory):
    return lightning_fit(tmp_path_factory.mktemp("pl"))


def test_lightning_records_steps_3_to_5(lightning_run, tmp_path_factory):
    trainer, clock, cb = lightning_run
    files = by_format(cb.files)
    assert files["snapshot"].endswith("/phasemem/rank0.pickle.xz")
    check_recording(load(files["snapshot"]), clock, files, forwards_per_step=2 * 2)  # emb + head, 2 micro-batches


def test_lightning_logs_the_headline(lightning_run):
    trainer, clock, cb = lightning_run
    ours = [(step, m) for step, m in trainer.logger.logged if "phasemem/peak_allocated_mib" in m]
    assert len(ours) == 1 and ours[0][0] == LAST + 1  # sent to the logger when step 5 ended
    metrics = ours[0][1]
    assert metrics == cb.recorder.metrics
    assert metrics == {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("phasemem/")}
    check_headline(metrics, load(by_format(cb.files)["snapshot"]))
    assert_clean()


def test_lightning_oom_inside_the_window_is_dumped(tmp_path):
    with pytest.raises(torch.OutOfMemoryError):
        lightning_fit(tmp_path, fail_at=4)
    folder = tmp_path / "phasemem"
    assert sorted(p.name for p in folder.iterdir()) == ["oom_rank0.json", "oom_rank0.pickle.xz", "oom_rank0.png"]
    snap = load(folder / "oom_rank0.pickle.xz")
    assert len(starts(snap, "Optimizer.step#")) == 1  # step 3 ran whole; step 4 raised before its update
    assert_clean()


def test_bad_arguments_fail_where_the_callback_is_made():
    pytest.importorskip("lightning.pytorch")
    from phasemem.integrations.lightning import PhasememCallback

    for kwargs, words in (({"steps": "12-10"}, "runs backwards"), ({"formats": ("gif",)}, "formats=")):
        with pytest.raises(phasemem.PhasememError, match=words) as err:
            PhasememCallback(**kwargs)
        assert "\n" not in str(err.value)
