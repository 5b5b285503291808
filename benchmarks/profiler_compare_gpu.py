"""The same 3 training steps seen by ``torch.profiler``'s memory timeline and by ``phasemem.instrument``.

Workload: ``gpt_foreach`` of fixtures/record.py (GPT 4 layers, d=512, vocab 32000, batch 4x512, fp32,
AdamW foreach default; forward+loss -> zero_grad(set_to_none) -> backward -> step), run twice from
the same seed, each with a fresh model and optimizer built before the recording:

1. under ``torch.profiler.profile(activities=[CPU, CUDA], profile_memory=True, record_shapes=True,
   with_stack=True)``, then ``prof.export_memory_timeline(...)`` in its three formats: ``.json``
   (``[times_us, sizes]``, ``sizes[i] = [0, <one column per category>]``), raw
   (``(time_ns, action, bytes, category)`` per event; the public call writes it for ``.raw.json.gz``) and ``.html`` (a PNG of its own plot, embedded);
2. under ``phasemem.instrument(model, opt)``; the snapshot is saved for the analysis to read.

One throw-away step first, so both runs see the same process state (cuBLAS workspaces exist).

Writes to ``--out``: ``profiler_timeline.json`` (the category names, per-category bytes at the
profiler's peak, the share it leaves unknown, and the category curve downsampled to <= 2000 points),
``profiler_compare_snapshot.pkl.xz`` (phasemem's snapshot), ``profiler_timeline.png`` (the profiler's
own plot, taken out of the HTML; else drawn from the JSON) and ``profiler_extra.tar.xz`` (the three exports).

    PYTHONPATH=. python3 benchmarks/profiler_compare_gpu.py --out $OUT
    PYTHONPATH=. python3 benchmarks/profiler_compare_gpu.py --device cpu --tiny --out /tmp/p   # smoke test
"""
from __future__ import annotations

import argparse
import base64
import gc
import json
import os
import re
import sys
import tarfile
import tempfile
import time
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmarks.overhead_gpu import GPT  # noqa: E402  (the same GPT as fixtures/record.py)
from phasemem.run import instrument  # noqa: E402


def build(dev: str, tiny: bool, seed: int = 0):
    L, d, V, B, T = (2, 64, 1024, 2, 32) if tiny else (4, 512, 32000, 4, 512)
    torch.manual_seed(seed)
    model = GPT(V, d, L, T).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1234)
    batches = [(torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g)) for _ in range(3)]
    dims = dict(layers=L, d_model=d, vocab=V, batch=B, seq=T)
    return model, opt, batches, dims


def steps(model, opt, batches, dev):
    for x, y in batches:
        x, y = x.to(dev), y.to(dev)
        logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def sync(dev):
    if dev.startswith("cuda"):
        torch.cuda.synchronize(dev)


def free(dev):
    gc.collect()
    if dev.startswith("cuda"):
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()


def category_names() -> list[str]:
    """Column names of the timeline's ``sizes`` rows, read from this torch (column 0 is a zero base)."""
    from torch.profiler import _memory_profiler as mp

    names = ["(base)"] + [None] * len(mp._CATEGORY_TO_INDEX)
    for cat, i in mp._CATEGORY_TO_INDEX.items():
        names[i + 1] = "unknown" if cat is None else cat.name.lower()
    return names


def downsample(times, sizes, peak_i, n=2000):
    """At most n points: per bucket the point of highest total (the curve is a staircase, so the max
    keeps spikes), the global peak always kept."""
    m = len(times)
    if m <= n:
        return list(range(m))
    keep = {0, m - 1, peak_i}
    per = m / (n - 3)
    totals = [sum(r) for r in sizes]
    b = 0.0
    while int(b) < m:
        lo, hi = int(b), min(m, int(b + per) or 1)
        if hi <= lo:
            hi = lo + 1
        keep.add(max(range(lo, hi), key=totals.__getitem__))
        b += per
    return sorted(keep)[:n] if len(keep) <= n else sorted(sorted(keep, key=lambda i: -totals[i])[:n])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true")
    a = ap.parse_args(argv)
    dev = a.device
    if dev == "cuda":
        dev = f"cuda:{torch.cuda.current_device()}"
    cuda = dev.startswith("cuda")
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="profcmp-")
    result: dict = {"torch": torch.__version__, "device": torch.cuda.get_device_name(dev) if cuda else "cpu"}

    # 0. throw-away step: cuBLAS handles/workspaces exist before either recording
    model, opt, batches, dims = build(dev, a.tiny, seed=1)
    steps(model, opt, batches[:1], dev)
    del model, opt
    free(dev)
    result["workload"] = dict(name="gpt_foreach", **dims, optimizer="AdamW(foreach default)", dtype="fp32", nsteps=3,
                              loop="forward+loss -> zero_grad(set_to_none) -> backward -> step")

    # 1. phasemem first (cheap, and the snapshot is what we most want back)
    model, opt, batches, _ = build(dev, a.tiny)
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    t = time.perf_counter()
    with instrument(model, opt, device=dev) as run:
        steps(model, opt, batches, dev)
    result["phasemem_seconds"] = round(time.perf_counter() - t, 2)
    result["phasemem_max_memory_allocated"] = torch.cuda.max_memory_allocated(dev) if cuda else None
    snap = run.snapshot
    snap["phasemem"]["meta"] = dict(result["workload"], purpose="profiler_compare_gpu.py: same steps as the profiler run")
    run.save(os.path.join(a.out, "profiler_compare_snapshot.pkl.xz"))
    print("saved phasemem snapshot", len(snap["device_traces"][0] if snap["device_traces"] else []), "events", flush=True)
    try:
        import phasemem

        rep = phasemem.analyze(snap)
        result["phasemem_by_category_at_peak"] = getattr(rep, "by_category", None)
        result["phasemem_peak_bytes"] = rep.peak_bytes
    except Exception as e:  # analysis is done again on the workstation anyway
        result["phasemem_analyze_error"] = repr(e)
    del model, opt, run, snap
    free(dev)

    # 2. the profiler
    model, opt, batches, _ = build(dev, a.tiny)
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    t = time.perf_counter()
    with torch.profiler.profile(activities=acts, profile_memory=True, record_shapes=True, with_stack=True) as prof:
        steps(model, opt, batches, dev)
        sync(dev)
    result["profiler_seconds_run"] = round(time.perf_counter() - t, 2)
    result["profiler_max_memory_allocated"] = torch.cuda.max_memory_allocated(dev) if cuda else None
    tl_dev = "cuda:0" if cuda else "cpu"
    exports = {}
    warnings.simplefilter("ignore", FutureWarning)  # export_memory_timeline is deprecated in newer torch
    # The public call rebuilds the whole memory profile each time (slow); after the first, reuse the
    # MemoryProfileTimeline it leaves in prof.mem_tl and call the same per-format writers it would.
    writers = {".raw.json": "export_memory_timeline_raw", ".html": "export_memory_timeline_html"}
    for suffix in (".json", ".raw.json", ".html"):
        path = os.path.join(tmp, "profiler_timeline_torch" + suffix)
        t = time.perf_counter()
        try:
            tl = getattr(prof, "mem_tl", None)
            if suffix == ".json" or tl is None:
                prof.export_memory_timeline(path, device=tl_dev)
            else:
                getattr(tl, writers[suffix])(path, tl_dev)
            exports[suffix] = dict(ok=os.path.exists(path), seconds=round(time.perf_counter() - t, 2),
                                   bytes=os.path.getsize(path) if os.path.exists(path) else None)
        except Exception as e:
            exports[suffix] = dict(ok=False, error=f"{type(e).__name__}: {e}")
        print("export", suffix, exports[suffix], flush=True)
    result["exports"] = exports

    names = category_names()
    with open(os.path.join(tmp, "profiler_timeline_torch.json")) as f:
        times, sizes = json.load(f)
    totals = [sum(r) for r in sizes]
    peak_i = max(range(len(totals)), key=totals.__getitem__)
    at_peak = {names[j]: sizes[peak_i][j] for j in range(1, len(names))}
    peak = totals[peak_i]
    max_per_cat = {names[j]: max(r[j] for r in sizes) for j in range(1, len(names))}
    # time-weighted share: bytes x microseconds per category over the whole recording
    area = {names[j]: 0.0 for j in range(1, len(names))}
    for i in range(len(times) - 1):
        dt = times[i + 1] - times[i]
        for j in range(1, len(names)):
            area[names[j]] += sizes[i][j] * dt
    total_area = sum(area.values()) or 1.0
    keep = downsample(times, sizes, peak_i)
    t0 = times[0] if times else 0
    result.update({
        "categories": names[1:],
        "n_points": len(times),
        "peak_bytes": peak,
        "peak_time_us_from_start": times[peak_i] - t0 if times else None,
        "at_peak_bytes": at_peak,
        "at_peak_share": {k: v / peak if peak else 0.0 for k, v in at_peak.items()},
        "unknown_share_at_peak": at_peak.get("unknown", 0) / peak if peak else 0.0,
        "max_bytes_per_category": max_per_cat,
        "time_weighted_share": {k: v / total_area for k, v in area.items()},
        "curve": {"t0_us": t0, "t_us": [times[i] - t0 for i in keep],
                  "sizes": [sizes[i][1:] for i in keep], "columns": names[1:],
                  "downsampled_from": len(times)},
    })
    with open(os.path.join(a.out, "profiler_timeline.json"), "w") as f:
        json.dump(result, f, default=str)
    print("profiler peak", peak, "at peak", at_peak, "unknown share", result["unknown_share_at_peak"], flush=True)

    # the profiler's own plot: the PNG inside its HTML; else drawn here from the JSON
    png = os.path.join(a.out, "profiler_timeline.png")
    html = os.path.join(tmp, "profiler_timeline_torch.html")
    got = False
    if os.path.exists(html):
        m = re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", open(html).read())
        if m:
            with open(png, "wb") as f:
                f.write(base64.b64decode(m.group(1)))
            got = True
    if not got:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            import numpy as np

            tt = (np.array(times) - t0) / 1e3
            cum = np.cumsum(np.array(sizes)[:, 1:], axis=1) / 2**30
            fig, ax = plt.subplots(figsize=(14, 6))
            lo = np.zeros(len(tt))
            for j, n in enumerate(names[1:]):
                ax.fill_between(tt, lo, cum[:, j], step="post", label=n, alpha=0.8)
                lo = cum[:, j]
            ax.set_xlabel("ms"); ax.set_ylabel("GiB"); ax.legend(); ax.set_title("torch.profiler memory timeline")
            fig.savefig(png, dpi=80)
        except Exception as e:
            print("no PNG:", e, flush=True)
    with tarfile.open(os.path.join(a.out, "profiler_extra.tar.xz"), "w:xz") as tf:
        for fn in sorted(os.listdir(tmp)):
            tf.add(os.path.join(tmp, fn), arcname=fn)
    print("done", json.dumps({k: result[k] for k in ("peak_bytes", "at_peak_bytes", "unknown_share_at_peak")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
