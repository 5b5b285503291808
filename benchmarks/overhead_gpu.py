"""What recording costs a training step: nothing vs bare ``_record_memory_history`` vs ``phasemem.instrument``.

Two workloads:

- ``gpt``: GPU-bound. GPT (8 layers, d=1024, vocab 50304), batch 8x1024, bf16 autocast, AdamW(fused=True).
- ``mlp``: launch-bound. 8 x Linear(256) with ReLU between, batch 64, AdamW(foreach=True).

Modes (each starts a fresh recording, so the 1M-entry ring buffer never fills):

- ``none``: no recording.
- ``record``: ``_record_memory_history("all", context="all", stacks="python", max_entries=1_000_000)``,
  the bare call a user makes (python stacks, as ``instrument()`` uses).
- ``record+annotations``: the same with ``global_record_annotations=True`` (what ``instrument()`` adds
  on the recorder's side, before its own hooks).
- ``instrument``: inside ``phasemem.instrument(model, opt)`` (hooks + markers + the recording above).
- ``instrument(stacks=None)``: ``instrument(..., stacks=None)``: no frames (``context=None``).
- ``record(stacks=all)``: torch's default ``stacks="all"`` (C++ frames too); no snapshot is taken,
  so symbolisation is not paid.

Per mode: ``--warmup`` steps with the mode on, then ``--steps`` timed steps, each timed on its own
(``torch.cuda.synchronize()`` + ``time.perf_counter``; every step ends with a sync, as a loop that
logs ``loss.item()`` does). Modes run round-robin ``--rounds`` times; the median over all timed steps
of a mode is reported. Writes ``overhead.md`` and ``overhead.json`` to ``--out``.

    PYTHONPATH=. python3 benchmarks/overhead_gpu.py --out $OUT
    PYTHONPATH=. python3 benchmarks/overhead_gpu.py --device cpu --tiny --out /tmp/o   # smoke test
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from phasemem.capture import instrument


# The GPT the fixtures were recorded with, so the numbers describe the same model.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from record import GPT  # noqa: E402


def build(name: str, dev: str, tiny: bool):
    """(description, model, optimizer, step function)."""
    cuda = dev.startswith("cuda")
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    if name == "gpt":
        L, d, V, B, T = (2, 64, 1024, 2, 32) if tiny else (8, 1024, 50304, 8, 1024)
        model = GPT(V, d, L, T).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
        xs = [torch.randint(0, V, (B, T), generator=g).to(dev) for _ in range(4)]
        amp = torch.autocast(dev.split(":")[0], dtype=torch.bfloat16)
        desc = (f"GPT {L} layers d={d} vocab {V}, batch {B}x{T}, bf16 autocast, AdamW(fused={cuda})")

        def step(i):
            x = xs[i % len(xs)]
            with amp:
                logits = model(x)
            loss = F.cross_entropy(logits.float().flatten(0, 1), x.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    else:
        W, B, L = (256, 64, 8)
        mods: list[nn.Module] = []
        for i in range(L):
            mods += [nn.Linear(W, W)] + ([nn.ReLU()] if i < L - 1 else [])
        model = nn.Sequential(*mods).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        xs = [(torch.randn(B, W, generator=g).to(dev), torch.randint(0, W, (B,), generator=g).to(dev)) for _ in range(4)]
        desc = f"MLP {L} x Linear({W}) + ReLU, batch {B}, fp32, AdamW(foreach=True)"

        def step(i):
            x, y = xs[i % len(xs)]
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    return desc, model, opt, step


def sync(dev: str) -> None:
    if dev.startswith("cuda"):
        torch.cuda.synchronize(dev)


@contextmanager
def recording(dev: str, **kw):
    torch.cuda.memory._record_memory_history("all", max_entries=1_000_000, clear_history=True, **kw)
    try:
        yield None
    finally:
        sync(dev)
        torch.cuda.memory._record_memory_history(None)


def mode_ctx(mode: str, model, opt, dev: str):
    if mode == "none":
        return nullcontext()
    if mode == "record":
        return recording(dev, context="all", stacks="python")
    if mode == "record+annotations":
        return recording(dev, context="all", stacks="python", global_record_annotations=True)
    if mode == "record(stacks=all)":
        return recording(dev, context="all", stacks="all")
    if mode == "instrument":
        return instrument(model, opt, device=dev)
    if mode == "instrument(stacks=None)":
        return instrument(model, opt, device=dev, stacks=None)
    if mode == "instrument(thread annotations)":
        run = instrument(model, opt, device=dev)
        run.global_annotations = False
        return run
    raise ValueError(mode)


def run_mode(mode, model, opt, step, dev, warmup, steps, counter):
    times = []
    t_exit = None
    ctx = mode_ctx(mode, model, opt, dev)
    ctx.__enter__()
    try:
        for _ in range(warmup):
            step(counter[0]); counter[0] += 1
        sync(dev)
        for _ in range(steps):
            t0 = time.perf_counter()
            step(counter[0]); counter[0] += 1
            sync(dev)
            times.append((time.perf_counter() - t0) * 1e3)
    finally:
        t1 = time.perf_counter()
        ctx.__exit__(None, None, None)
        t_exit = time.perf_counter() - t1
    events = None
    snap = getattr(ctx, "snapshot", None)
    if isinstance(snap, dict):
        tr = snap.get("device_traces") or []
        events = max((len(t) for t in tr), default=0)
        # do the markers land? (thread-local annotations only see the recording thread's ranges)
        names = [a["name"] for a in snap.get("external_annotations") or [] if a.get("stage") == "START"]
        print(f"    {mode}: marker STARTs " + ", ".join(
            f"{p}={sum(n == 'phasemem::' + p for n in names)}" for p in ("forward", "zero_grad", "backward", "optimizer")),
            flush=True)
    return times, t_exit, events


def pct(a, b):
    return 100.0 * (a - b) / b


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--workloads", default="gpt,mlp")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--modes", default="", help="comma-separated subset of the modes")
    a = ap.parse_args(argv)
    dev = a.device
    if dev == "cuda":
        dev = f"cuda:{torch.cuda.current_device()}"
    cuda = dev.startswith("cuda")
    modes = ["none", "record", "record+annotations", "instrument", "instrument(stacks=None)", "record(stacks=all)",
             "instrument(thread annotations)"]
    if a.modes:
        modes = [m for m in a.modes.split(",") if m in modes]
    if not cuda:  # the allocator recorder is CUDA-only; instrument() uses the CPU profiler here
        modes = ["none", "instrument"]
    os.makedirs(a.out, exist_ok=True)
    env = {"torch": torch.__version__, "device": torch.cuda.get_device_name(dev) if cuda else platform.processor() or "cpu",
           "python": sys.version.split()[0], "warmup": a.warmup, "steps": a.steps, "rounds": a.rounds}
    print("env", env, flush=True)
    results = {"env": env, "workloads": {}}
    md = [f"# Recording overhead per training step ({env['device']}, torch {env['torch']})", "",
          f"Median over {a.rounds} rounds x {a.steps} timed steps per mode (after {a.warmup} warm-up steps "
          "with the mode on, per round); modes round-robin; every step ends with a device sync.", ""]
    for wname in [w for w in a.workloads.split(",") if w]:
        desc, model, opt, step = build(wname, dev, a.tiny)
        counter = [0]
        for _ in range(3):  # first-use costs (cuBLAS handles, AdamW state) outside every mode
            step(counter[0]); counter[0] += 1
        sync(dev)
        samples = {m: [] for m in modes}
        exits = {m: [] for m in modes}
        events = {m: [] for m in modes}
        for r in range(a.rounds):
            for m in modes:
                try:
                    t, te, ev = run_mode(m, model, opt, step, dev, a.warmup, a.steps, counter)
                except Exception as e:  # one mode failing must not lose the others
                    print(f"FAIL {wname} {m}: {type(e).__name__}: {e}", flush=True)
                    continue
                samples[m] += t
                exits[m].append(te)
                events[m].append(ev)
                print(f"{wname:4s} round {r} {m:24s} median {statistics.median(t):8.3f} ms  "
                      f"min {min(t):8.3f}  exit {te:6.2f} s  events {ev}", flush=True)
                gc.collect()
        med = {m: statistics.median(s) for m, s in samples.items() if s}
        rows = []
        for m in modes:
            if m not in med:
                rows.append(dict(mode=m, failed=True))
                continue
            s = samples[m]
            q = statistics.quantiles(s, n=10) if len(s) >= 10 else [min(s)] * 9
            rows.append(dict(mode=m, ms_median=med[m], ms_p10=q[0], ms_p90=q[-1], steps_per_s=1e3 / med[m],
                             vs_none_pct=pct(med[m], med["none"]) if "none" in med else None,
                             vs_record_pct=pct(med[m], med["record"]) if "record" in med else None,
                             exit_s=max(exits[m]) if exits[m] else None,
                             snapshot_events=max((e for e in events[m] if e is not None), default=None)))
        results["workloads"][wname] = {"description": desc, "rows": rows,
                                       "params": sum(p.numel() for p in model.parameters())}
        md += [f"## {wname}: {desc}", "",
               "| mode | ms/step (median) | p10–p90 | steps/s | vs none | vs record | exit (s) | events in snapshot |",
               "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if r.get("failed"):
                md.append(f"| {r['mode']} | failed | | | | | | |")
                continue
            vn = "—" if r["vs_none_pct"] is None or r["mode"] == "none" else f"{r['vs_none_pct']:+.1f} %"
            vr = "—" if r["vs_record_pct"] is None or r["mode"] in ("none", "record") else f"{r['vs_record_pct']:+.1f} %"
            md.append(f"| {r['mode']} | {r['ms_median']:.3f} | {r['ms_p10']:.3f}–{r['ms_p90']:.3f} | "
                      f"{r['steps_per_s']:.1f} | {vn} | {vr} | {r['exit_s']:.2f} | {r['snapshot_events'] or '—'} |")
        md.append("")
        del model, opt, step
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        # write as we go: a run cut short keeps the finished workloads
        with open(os.path.join(a.out, "overhead.md"), "w") as f:
            f.write("\n".join(md) + "\n")
        with open(os.path.join(a.out, "overhead.json"), "w") as f:
            json.dump(results, f, indent=1)
    print("\n".join(md), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
