"""The PNG against the decode floor: ``report.save_png`` beside ``pickle.load`` (collector off) of
the same snapshot, in one run, on both frame forms torch can write.

A real snapshot in torch's default form (``fixtures/plain_gpt_torch_defaults``) is stretched to each
size by ``scale_snapshot.replicate`` (``--share torch``: new traceback lists every step, as torch
writes; ``--share lists``: the seed's lists reused) and written as a plain pickle. Then, ``--runs``
times, each in a fresh process so the floor's 4 GiB of dicts at 10M events never sit beside the
analysis: the floor (``pickle.load`` of the file with the collector off), and ``phasemem.analyze``
of the file (not timed) followed by ``report.save_png`` timed with the allocation bands as one
image (``bands="raster"``, what ``save_png`` draws) and as one polygon each (``bands="vector"``,
what it drew before; the SVG outlines), after one untimed PNG (fonts, caches). Medians of the runs.
The child's peak RSS is reported after the analysis and after the PNGs (``ru_maxrss``); every time
also as the process' CPU seconds, steadier than the wall clock on a shared machine.

Target (issue 34): the PNG alone at most 0.1 × the floor at 1M and 10M events.

Run (from the repository root; the snapshots are kept in --dir and reused):

    python3 benchmarks/bench_render.py [--events 100000,1000000] [--share torch,lists] [--runs 3] [--dir DIR]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "fixtures" / "plain_gpt_torch_defaults.pkl.xz"
if "--child" not in sys.argv:  # a child imports the phasemem its PYTHONPATH names (--before: another checkout)
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


TIMED = ("floor", "raster", "vector", "before")


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_floor(path: str) -> dict:
    gc.disable()
    t0, c0 = time.perf_counter(), time.process_time()
    with open(path, "rb") as f:
        pickle.load(f)
    return {"floor": time.perf_counter() - t0, "floor_cpu": time.process_time() - c0}


def child_png(path: str, png: str) -> dict:
    import phasemem

    report = phasemem.analyze(path)
    gc.collect()
    out = {"events": report.n_events, "steps": len(report.steps), "patterns": len(report.patterns),
           "rss_analysis": _rss_mib()}
    report.save_png(png)  # fonts, text caches, the first draw's imports
    for bands in ("raster", "vector"):
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        report.save_png(png, bands=bands)
        out[bands], out[bands + "_cpu"] = time.perf_counter() - t0, time.process_time() - c0
    fig = report.plot()
    out["drawn"] = len(fig.phasemem_stack.index)
    out["rss_png"] = _rss_mib()
    return out


def child_png_before(path: str, png: str) -> dict:
    """``save_png`` as another checkout of phasemem draws it (``--before``: no ``bands`` option there)."""
    import phasemem

    assert Path(phasemem.__file__).resolve().is_relative_to(Path.cwd().resolve()), phasemem.__file__
    report = phasemem.analyze(path)
    gc.collect()
    report.save_png(png)
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    report.save_png(png)
    return {"before": time.perf_counter() - t0, "before_cpu": time.process_time() - c0}


def _child(*args, src=ROOT) -> dict:
    res = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", *args], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(src)}, cwd=str(src))
    if res.returncode:
        raise SystemExit(f"child {args} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", default="100000,1000000", help="about how many events, comma separated")
    ap.add_argument("--share", default="torch,lists", help="torch, lists or both (comma separated)")
    ap.add_argument("--runs", type=int, default=3, help="median of N runs (default 3)")
    ap.add_argument("--seed", type=Path, default=SEED)
    ap.add_argument("--dir", type=Path, help="keep the snapshots here and reuse them")
    ap.add_argument("--before", type=Path, help="also time save_png of the phasemem checkout at this path "
                    "(e.g. `git worktree add /tmp/before COMMIT`)")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        kind, *rest = args.child
        print(json.dumps({"floor": child_floor, "png": child_png, "before": child_png_before}[kind](*rest)))
        return 0
    from bench_floor import make

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores; seed {args.seed.name}; "
          f"median of {args.runs} runs, each a fresh process; 1600x900 PNG, every default")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.dir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for n in (int(s) for s in args.events.split(",")):
            for share in args.share.split(","):
                path = folder / f"{args.seed.name.split('.')[0]}_{n}_{share}.pickle"
                if not path.exists():
                    make(args.seed, n, share, path)
                runs = []
                for _ in range(args.runs):
                    r = _child("floor", str(path))
                    r.update(_child("png", str(path), str(folder / "memory.png")))
                    if args.before:
                        r.update(_child("before", str(path), str(folder / "before.png"), src=args.before))
                    runs.append(r)
                    print(f"  {n:,} {share}: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items()
                                                          if k.split("_")[0] in TIMED), file=sys.stderr)
                med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k.split("_")[0] in TIMED}
                rows.append((runs[0], share, path.stat().st_size / 2**20, med,
                             max(r["rss_analysis"] for r in runs), max(r["rss_png"] for r in runs)))
    before = f" | PNG, {args.before} (s) | × floor" if args.before else ""
    print("| events | frames | pickle (MiB) | steps | patterns | bands | floor (s) | PNG, raster (s) | × floor "
          f"| PNG, polygons (s) | × floor{before} | peak RSS after analysis / after PNGs (MiB) |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if args.before else "") + "---:|")
    for r, share, mib, med, rss_a, rss_p in rows:
        f = med["floor"]
        old = f" | {med['before']:.3f} | {med['before'] / f:.2f}" if args.before else ""
        print(f"| {r['events']:,} | {share} | {mib:,.0f} | {r['steps']:,} | {r['patterns']:,} | {r['drawn']:,} "
              f"| {f:.3f} | **{med['raster']:.3f}** | **{med['raster'] / f:.2f}** | {med['vector']:.3f} "
              f"| {med['vector'] / f:.2f}{old} | {rss_a:,.0f} / {rss_p:,.0f} |")
    _cpu_table(rows, bool(args.before))
    return 0


def _cpu_table(rows, before: bool) -> None:
    """The same medians in CPU seconds of the process (``time.process_time``): on a machine shared with
    other jobs the wall clock moves by 2x between runs, the CPU time much less."""
    print("\nCPU seconds (medians):\n")
    print("| events | frames | floor | PNG, raster | × floor | PNG, polygons | × floor"
          + (" | PNG, before | × floor |" if before else " |"))
    print("|---:|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if before else ""))
    for r, share, _, med, _, _ in rows:
        f = med["floor_cpu"]
        old = f" | {med['before_cpu']:.3f} | {med['before_cpu'] / f:.2f}" if before else ""
        print(f"| {r['events']:,} | {share} | {f:.3f} | **{med['raster_cpu']:.3f}** | **{med['raster_cpu'] / f:.2f}** "
              f"| {med['vector_cpu']:.3f} | {med['vector_cpu'] / f:.2f}{old} |")


if __name__ == "__main__":
    raise SystemExit(main())
