"""What recording costs a training step: nothing vs bare ``_record_memory_history`` vs ``phasemem.instrument``.

Two workloads:

- ``gpt``: GPU-bound. GPT (8 layers, d=1024, vocab 50304), batch 8x1024, bf16 autocast, AdamW(fused=True).
- ``mlp``: launch-bound. 8 x Linear(256) with ReLU between, batch 64, AdamW(foreach=True).

Modes (each block starts a fresh recording, so the ring buffer never fills):

- ``none``: no recording.
- ``record``: ``_record_memory_history("all", context="all", stacks="python", max_entries=1_000_000)``,
  the bare call a user makes (python stacks, as ``instrument()`` uses).
- ``instrument``: inside ``phasemem.instrument(model, opt)`` (hooks + markers + the recording above,
  with global annotations).
- ``instrument(before)``: ``instrument()`` as it was before the per-step cost was cut (forward hooks,
  ``record_function`` markers, a locked marker list, ``Tensor.backward`` patched too), imported from a
  copy of that code's ``phasemem/capture`` given as ``--before DIR`` (``DIR/phasemem_before_capture``),
  e.g. made with ``git show 396197e:phasemem/capture/<file>``.
- ``instrument(no markers)``: ``instrument()`` with its hooks and wrappers in place but every range
  a no-op: what the Python side costs without the ranges.
- ``instrument(record_function)``: ``instrument()`` with each marker opened by
  ``torch.profiler.record_function`` (``hooks._range_enter``/``_range_exit`` swapped for the block).
- ``record(A/A)``: ``record`` again, under another name: an A/A comparison shows what the method
  reports when there is no difference.
- optional: ``record+annotations`` (bare recording with ``global_record_annotations=True``),
  ``instrument(stacks=None)``.

Design, to resolve differences of 1-3 % under ~10 % block-to-block noise:

- many short blocks: ``--rounds`` rounds, each running every mode once for ``--warmup`` untimed and
  ``--steps`` timed steps; the order of the modes rotates every round and is reversed every other
  cycle, so slow drift (clocks, temperature, other tenants) falls on every mode alike;
- paired comparison: per round, the ratio of a mode's median step time to ``record``'s median in the
  same round; the table gives the geometric mean of those ratios with a 95 % bootstrap interval over
  rounds (10,000 resamples) and a two-sided sign test (how many rounds the mode was slower);
- host-side cost, measured directly: per step the wall time and the thread CPU time of the Python
  launch path (``step()`` returning, before the sync), which the GPU's timing jitter does not reach;
- ``gc.collect(); gc.freeze()`` once per workload, ``gc.collect()`` (of what is not frozen) before each block; the process can be pinned (``--cpus``) and
  limited to one intra-op thread (``--threads``).

A verdict compares the interval with the target: "met" when its upper end is at or under the
target, "missed" when its lower end is over, otherwise "not resolved". Writes ``overhead.md`` and
``overhead.json`` (every step's times) to ``--out``.

    PYTHONPATH=. python3 benchmarks/overhead_gpu.py --out $OUT --cpus 2-5
    PYTHONPATH=. python3 benchmarks/overhead_gpu.py --device cpu --tiny --out /tmp/o   # smoke test
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from phasemem.capture import hooks
from phasemem.run import instrument

# The GPT the fixtures were recorded with, so the numbers describe the same model.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from record import GPT  # noqa: E402

TARGETS = {"gpt": 1.0, "mlp": 3.0}  # % over bare recording (issue 7)


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
        desc = f"GPT {L} layers d={d} vocab {V}, batch {B}x{T}, bf16 autocast, AdamW(fused={cuda})"

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


@contextmanager
def record_function_markers():
    """phasemem's markers opened the way they were before: ``torch.profiler.record_function``."""
    saved = hooks._range_enter, hooks._range_exit
    hooks._range_enter, hooks._range_exit = hooks._record_function_enter, hooks._record_function_exit
    try:
        yield
    finally:
        hooks._range_enter, hooks._range_exit = saved


class Both:
    """Enter ``outer`` then ``inner``; exit in reverse. ``snapshot`` is the inner's."""

    def __init__(self, outer, inner):
        self.outer, self.inner = outer, inner

    def __enter__(self):
        self.outer.__enter__()
        self.inner.__enter__()
        return self

    def __exit__(self, *exc):
        try:
            self.inner.__exit__(*exc)
        finally:
            self.outer.__exit__(*exc)

    @property
    def snapshot(self):
        return getattr(self.inner, "snapshot", None)


ALL_MODES = ["none", "record", "record+annotations", "instrument(before)", "instrument(no markers)", "instrument",
             "record(A/A)", "instrument(record_function)", "instrument(stacks=None)"]
DEFAULT_MODES = ["none", "record", "instrument", "record(A/A)"]
BEFORE = None  # the package given by --before


@contextmanager
def no_markers():
    saved = hooks._range_enter, hooks._range_exit
    hooks._range_enter, hooks._range_exit = (lambda name: None), (lambda handle: None)
    try:
        yield
    finally:
        hooks._range_enter, hooks._range_exit = saved


def mode_ctx(mode: str, model, opt, dev: str):
    cuda = dev.startswith("cuda")
    if mode == "none":
        return nullcontext()
    if mode in ("record", "record(A/A)"):  # A/A: the same mode twice, to see what "no difference" looks like
        return recording(dev, context="all", stacks="python")
    if mode == "record+annotations":
        return recording(dev, context="all", stacks="python", global_record_annotations=True)
    if mode == "instrument":
        return instrument(model, opt, device=dev)
    if mode == "instrument(record_function)":
        return Both(record_function_markers(), instrument(model, opt, device=dev))
    if mode == "instrument(no markers)":
        return Both(no_markers(), instrument(model, opt, device=dev))
    if mode == "instrument(before)":
        return BEFORE.instrument(model, opt, device=dev)
    if mode == "instrument(stacks=None)":
        return instrument(model, opt, device=dev, stacks=None if cuda else "python")
    raise ValueError(mode)


def run_block(mode, model, opt, step, dev, warmup, steps, counter):
    """One block: enter the mode, ``warmup`` untimed steps, ``steps`` timed steps, exit.
    Per timed step: (wall us, host-path wall us, host-path thread CPU us)."""
    # The workload froze everything older (main); collecting what is left takes microseconds
    # instead of a full ~40 ms pass per block, so more rounds fit into the same device time.
    gc.collect()
    wall, host, host_cpu = [], [], []
    ctx = mode_ctx(mode, model, opt, dev)
    perf, cpu_ns = time.perf_counter_ns, time.thread_time_ns
    ctx.__enter__()
    try:
        for _ in range(warmup):
            step(counter[0])
            counter[0] += 1
        sync(dev)
        for _ in range(steps):
            t0, c0 = perf(), cpu_ns()
            step(counter[0])
            t1, c1 = perf(), cpu_ns()
            sync(dev)
            t2 = perf()
            counter[0] += 1
            wall.append((t2 - t0) / 1e3)
            host.append((t1 - t0) / 1e3)
            host_cpu.append((c1 - c0) / 1e3)
    finally:
        te = perf()
        ctx.__exit__(None, None, None)
        t_exit = (perf() - te) / 1e9
    info = {"exit_s": t_exit}
    snap = getattr(ctx, "snapshot", None)
    if isinstance(snap, dict):
        info["events"] = max((len(t) for t in snap.get("device_traces") or []), default=0)
        names = [a["name"] for a in snap.get("external_annotations") or [] if a.get("stage") == "START"]
        # instrument() leaves a torch.optim optimizer's step and zero_grad to torch's own ranges
        torch_name = {"optimizer": "Optimizer.step#", "zero_grad": "Optimizer.zero_grad#"}
        info["marker_starts"] = {p: sum(n == "phasemem::" + p or n.startswith(torch_name.get(p, "\0")) for n in names)
                                 for p in ("forward", "zero_grad", "backward", "optimizer")}
    del ctx, snap
    return wall, host, host_cpu, info


def order_for(modes: list[str], r: int) -> list[str]:
    k = len(modes)
    rot = modes[r % k:] + modes[:r % k]
    return rot[::-1] if (r // k) % 2 else rot


def geo_mean(xs):
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def bootstrap_ci(ratios, n=10_000, seed=0):
    rng = random.Random(seed)
    logs = [math.log(x) for x in ratios]
    k = len(logs)
    means = sorted(statistics.fmean(rng.choices(logs, k=k)) for _ in range(n))
    return math.exp(means[int(0.025 * n)]), math.exp(means[int(0.975 * n) - 1])


def bootstrap_mean_ci(values, n=10_000, seed=0):
    rng = random.Random(seed)
    k = len(values)
    means = sorted(statistics.fmean(rng.choices(values, k=k)) for _ in range(n))
    return means[int(0.025 * n)], means[int(0.975 * n) - 1]


def sign_test(diffs):
    """Two-sided binomial sign test on the non-zero differences: (above, below, p)."""
    up = sum(d > 0 for d in diffs)
    down = sum(d < 0 for d in diffs)
    n = up + down
    if n == 0:
        return up, down, 1.0
    k = min(up, down)
    p = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return up, down, min(1.0, 2 * p)


def verdict(lo_pct, hi_pct, target):
    if target is None:
        return ""
    if hi_pct <= target:
        return f"≤ {target:g} %: met"
    if lo_pct > target:
        return f"≤ {target:g} %: missed"
    return f"≤ {target:g} %: not resolved"


def compare(blocks, mode, base, key):
    """Per round: median of ``mode`` / median of ``base`` (for ``key``), and the difference in us."""
    ratios, diffs = [], []
    for r in sorted(set(blocks[mode]) & set(blocks[base])):
        a, b = statistics.median(blocks[mode][r][key]), statistics.median(blocks[base][r][key])
        ratios.append(a / b)
        diffs.append(a - b)
    return ratios, diffs


def component_costs(dev: str, n: int = 20000) -> dict:
    """us per marker range (start + end) with each implementation, with the allocator recording
    (global annotations, as instrument() records) and without."""
    out = {}
    impls = {"fast binding": (hooks._fast_enter, hooks._fast_exit),
             "record_function": (hooks._record_function_enter, hooks._record_function_exit)}
    for recording_on in ([False, True] if dev.startswith("cuda") else [False]):
        ctx = (recording(dev, context="all", stacks="python", global_record_annotations=True)
               if recording_on else nullcontext())
        with ctx:
            for label, (enter, exit_) in impls.items():
                if enter is None:
                    continue
                best = float("inf")
                for _ in range(3):
                    t = time.perf_counter_ns()
                    for _ in range(n):
                        exit_(enter("phasemem::probe"))
                    best = min(best, (time.perf_counter_ns() - t) / n / 1e3)
                out[f"{label}, recording {'on' if recording_on else 'off'}"] = best
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--workloads", default="mlp,gpt")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per block")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per block")
    ap.add_argument("--rounds", default="40", help="rounds, one number or per workload: mlp=60,gpt=30")
    ap.add_argument("--seconds", default="", help="stop a workload's rounds before this many seconds: mlp=480,gpt=520 "
                    "(a whole round is never cut; the table counts the rounds run)")
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated, from {ALL_MODES}")
    ap.add_argument("--gpt-modes", default="", help="modes for the gpt workload, if other than --modes")
    ap.add_argument("--cpus", default="", help="pin the process to these cores, e.g. 2-5")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (0: leave)")
    ap.add_argument("--before", default="", help="folder holding phasemem_before_capture/ (mode instrument(before))")
    a = ap.parse_args(argv)
    global BEFORE
    if a.before:
        import importlib

        sys.path.insert(0, os.path.abspath(a.before))
        BEFORE = importlib.import_module("phasemem_before_capture")
    if a.cpus:
        lo, _, hi = a.cpus.partition("-")
        os.sched_setaffinity(0, set(range(int(lo), int(hi or lo) + 1)))
    if a.threads:
        torch.set_num_threads(a.threads)
    dev = a.device
    if dev == "cuda":
        dev = f"cuda:{torch.cuda.current_device()}"
    cuda = dev.startswith("cuda")

    def parse_modes(text: str) -> list[str]:
        modes = [m for m in text.split(",") if m]
        bad = set(modes) - set(ALL_MODES)
        if bad:
            ap.error(f"unknown modes {sorted(bad)}")
        if "instrument(before)" in modes and BEFORE is None:
            ap.error("mode instrument(before) needs --before DIR")
        if not cuda:  # the allocator recorder is CUDA-only; instrument() uses the CPU profiler here
            modes = [m for m in modes if not m.startswith("record")]
        return modes

    wmodes = parse_modes(a.modes)
    gmodes = parse_modes(a.gpt_modes) if a.gpt_modes else wmodes
    rounds = {}
    for part in a.rounds.split(","):
        name, _, val = part.rpartition("=")
        rounds[name or "*"] = int(val)
    budget = {}
    for part in filter(None, a.seconds.split(",")):
        name, _, val = part.rpartition("=")
        budget[name or "*"] = float(val)
    os.makedirs(a.out, exist_ok=True)
    env = {"torch": torch.__version__, "device": torch.cuda.get_device_name(dev) if cuda else platform.processor() or "cpu",
           "python": sys.version.split()[0], "warmup": a.warmup, "steps": a.steps, "rounds": rounds,
           "cpus": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads(),
           "marker_impl": getattr(hooks._range_enter, "__name__", str(hooks._range_enter)),
           "command": " ".join(["python3", "benchmarks/overhead_gpu.py", *(argv if argv is not None else sys.argv[1:])])}
    print("env", env, flush=True)
    comp = component_costs(dev, 2000 if a.tiny else 20000)
    print("components", comp, flush=True)
    results = {"env": env, "components_us_per_range": comp, "workloads": {}}
    md = [f"# Recording overhead per training step ({env['device']}, torch {env['torch']})", "",
          f"`{env['command']}`", "",
          "Blocks of "
          f"{a.warmup} untimed + {a.steps} timed steps per mode, modes in a rotating order every round, every step "
          "synchronised. \"vs base\": geometric mean over rounds of (mode's median / base's median in the same "
          "round), 95 % bootstrap interval, sign test (rounds slower : faster, two-sided p). \"host\": the launch "
          "path (step() returning, before the sync): wall and thread-CPU medians, and the paired difference to "
          "the base in us per step.", "",
          f"Cost of one marker range (start + end), best of 3 × {2000 if a.tiny else 20000}: " +
          "; ".join(f"{k}: {v:.2f} us" for k, v in comp.items()), ""]
    for wname in [w for w in a.workloads.split(",") if w]:
        R = rounds.get(wname, rounds.get("*", 40))
        limit = budget.get(wname, budget.get("*", math.inf))
        modes = gmodes if wname == "gpt" else wmodes
        base = "record" if "record" in modes else "none"
        desc, model, opt, step = build(wname, dev, a.tiny)
        counter = [0]
        for _ in range(3):  # first-use costs (cuBLAS handles, AdamW state) outside every mode
            step(counter[0])
            counter[0] += 1
        sync(dev)
        for m in modes:  # one untimed block per mode: first recording, first hook install
            run_block(m, model, opt, step, dev, 1, 2, counter)
        gc.collect()
        gc.freeze()  # run_block then collects only what each block left
        blocks: dict[str, dict[int, dict]] = {m: {} for m in modes}
        infos: dict[str, list] = {m: [] for m in modes}
        t_start = time.perf_counter()
        for r in range(R):
            elapsed = time.perf_counter() - t_start
            if r and elapsed * (r + 1) / r > limit:  # the next round would end past the budget
                R = r
                break
            for m in order_for(modes, r):
                try:
                    wall, host, host_cpu, info = run_block(m, model, opt, step, dev, a.warmup, a.steps, counter)
                except Exception as e:  # one mode failing must not lose the others
                    print(f"FAIL {wname} {m}: {type(e).__name__}: {e}", flush=True)
                    continue
                blocks[m][r] = {"wall": [round(x, 1) for x in wall], "host": [round(x, 1) for x in host],
                                "host_cpu": [round(x, 1) for x in host_cpu]}
                infos[m].append(info)
            if r % 10 == 9 or r == R - 1:
                print(f"{wname} round {r + 1}/{R} " + "  ".join(
                    f"{m}={statistics.median(blocks[m][r]['wall']):.1f}us" for m in modes if r in blocks[m]),
                    flush=True)
        seconds = time.perf_counter() - t_start
        gc.unfreeze()
        rows = []
        for m in modes:
            if not blocks[m]:
                rows.append({"mode": m, "failed": True})
                continue
            allw = [x for b in blocks[m].values() for x in b["wall"]]
            row = {"mode": m, "rounds": len(blocks[m]), "ms_median": statistics.median(allw) / 1e3,
                   "host_us_median": statistics.median(x for b in blocks[m].values() for x in b["host"]),
                   "host_cpu_us_median": statistics.median(x for b in blocks[m].values() for x in b["host_cpu"]),
                   "exit_s_max": max(i["exit_s"] for i in infos[m]),
                   "events_max": max((i.get("events") or 0 for i in infos[m]), default=0) or None,
                   "marker_starts": infos[m][-1].get("marker_starts")}
            for ref in ("none", base):
                if ref == m or ref not in blocks or not blocks[ref]:
                    continue
                ratios, _ = compare(blocks, m, ref, "wall")
                lo, hi = bootstrap_ci(ratios)
                up, down, p = sign_test([x - 1 for x in ratios])
                _, hdiff = compare(blocks, m, ref, "host")
                _, cdiff = compare(blocks, m, ref, "host_cpu")
                hlo, hhi = bootstrap_mean_ci(hdiff)
                row[f"vs_{ref}"] = {
                    "pct": 100 * (geo_mean(ratios) - 1), "ci_pct": [100 * (lo - 1), 100 * (hi - 1)],
                    "median_ratio_pct": 100 * (statistics.median(ratios) - 1),
                    "slower_rounds": up, "faster_rounds": down, "sign_p": p,
                    "host_diff_us": statistics.fmean(hdiff), "host_diff_ci_us": [hlo, hhi],
                    "host_cpu_diff_us": statistics.fmean(cdiff),
                    "verdict": verdict(100 * (lo - 1), 100 * (hi - 1), TARGETS.get(wname) if ref == base and m.startswith("instrument") else None),
                }
            rows.append(row)
        results["workloads"][wname] = {
            "description": desc, "rows": rows, "params": sum(p.numel() for p in model.parameters()),
            "seconds": seconds, "rounds": R,
            "blocks": {m: {str(r): b for r, b in bl.items()} for m, bl in blocks.items()}}
        md += [f"## {wname}: {desc}", "", f"{R} rounds, {seconds:.0f} s.", "",
               f"| mode | ms/step (median) | vs none | vs {base} (95 % CI) | slower:faster, p | host wall / CPU us | "
               f"host vs {base} (us/step, 95 % CI) | exit (s) | events | verdict |",
               "|---|---:|---:|---:|---|---:|---:|---:|---:|---|"]
        for r in rows:
            if r.get("failed"):
                md.append(f"| {r['mode']} | failed | | | | | | | | |")
                continue
            vn = r.get("vs_none")
            vb = r.get(f"vs_{base}")
            md.append(
                f"| {r['mode']} | {r['ms_median']:.3f} | "
                + (f"{vn['pct']:+.2f} %" if vn else "—") + " | "
                + (f"{vb['pct']:+.2f} % ({vb['ci_pct'][0]:+.2f} … {vb['ci_pct'][1]:+.2f})" if vb else "—") + " | "
                + (f"{vb['slower_rounds']}:{vb['faster_rounds']}, {vb['sign_p']:.2g}" if vb else "—") + " | "
                + f"{r['host_us_median']:.0f} / {r['host_cpu_us_median']:.0f} | "
                + (f"{vb['host_diff_us']:+.1f} ({vb['host_diff_ci_us'][0]:+.1f} … {vb['host_diff_ci_us'][1]:+.1f})" if vb else "—")
                + f" | {r['exit_s_max']:.2f} | {r['events_max'] or '—'} | " + (vb["verdict"] if vb else "") + " |")
        md.append("")
        # before/after, paired directly: instrument() against the same with record_function markers
        direct = {}
        for other in [m for m in modes if m.startswith("instrument") and m != "instrument"]:
            if "instrument" not in modes or not blocks["instrument"] or not blocks[other]:
                continue
            ratios, _ = compare(blocks, "instrument", other, "wall")
            lo, hi = bootstrap_ci(ratios)
            up, down, p = sign_test([x - 1 for x in ratios])
            _, hdiff = compare(blocks, "instrument", other, "host")
            hlo, hhi = bootstrap_mean_ci(hdiff)
            direct[other] = {"pct": 100 * (geo_mean(ratios) - 1), "ci_pct": [100 * (lo - 1), 100 * (hi - 1)],
                             "slower_rounds": up, "faster_rounds": down, "sign_p": p,
                             "host_diff_us": statistics.fmean(hdiff), "host_diff_ci_us": [hlo, hhi]}
            md.append(f"instrument vs {other}, paired: step {direct[other]['pct']:+.2f} % ({100 * (lo - 1):+.2f} … "
                      f"{100 * (hi - 1):+.2f}), slower:faster {up}:{down} (p {p:.2g}); host path "
                      f"{direct[other]['host_diff_us']:+.1f} us/step ({hlo:+.1f} … {hhi:+.1f})")
        results["workloads"][wname]["instrument_vs"] = direct
        if direct:
            md.append("")
        starts = {m: infos[m][-1].get("marker_starts") for m in modes if infos[m] and infos[m][-1].get("marker_starts")}
        if starts:
            md += ["Marker STARTs in each instrument block's snapshot (last round): " +
                   "; ".join(f"{m}: {s}" for m, s in starts.items()), ""]
        del model, opt, step
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        # write as we go: a run cut short keeps the finished workloads
        with open(os.path.join(a.out, "overhead.md"), "w") as f:
            f.write("\n".join(md) + "\n")
        with open(os.path.join(a.out, "overhead.json"), "w") as f:
            json.dump(results, f)
    print("\n".join(md), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
