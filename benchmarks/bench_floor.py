"""phasemem against the decode floor: ``pickle.load`` with the collector off, side by side in one run.

A real snapshot in torch's default form (``fixtures/plain_gpt_torch_defaults``: ``stacks="all"``,
C++ frames, no instrument()) is stretched to ~1,000,000 events by ``scale_snapshot.replicate``,
in the sharing torch writes (``--share torch``: new traceback lists every step, frame dicts shared)
and, for comparison, with the seed's lists reused (``--share lists``). Each file is written as a
plain pickle, then, best of N, in this order, in this process:

- ``pickle.load`` with the collector on (as a user calls it) and off (the floor);
- ``phasemem.read.trace`` (what ``analyze`` reads a pickle with);
- ``phasemem.analyze(path)`` + ``report.save_png`` end to end, and its parts: ``analyze_trace`` of
  the trace already read, ``save_png`` of the report.

Run (from the repository root):

    python3 benchmarks/bench_floor.py [--events 1000000] [--repeat 3] [--seed PATH] [--share torch,lists] [--dir DIR]
"""
from __future__ import annotations

import argparse
import gc
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "fixtures" / "plain_gpt_torch_defaults.pkl.xz"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def best_of(repeat: int, fn, collector: bool = True):
    """Best wall time of ``repeat`` calls (each after a full collection), and the last result."""
    times, result = [], None
    for _ in range(repeat):
        result = None
        gc.collect()
        was = gc.isenabled()
        (gc.enable if collector else gc.disable)()
        try:
            t0 = time.perf_counter()
            result = fn()
            times.append(time.perf_counter() - t0)
        finally:
            (gc.enable if was else gc.disable)()
    return min(times), result


def make(seed: Path, events: int, share: str, path: Path) -> int:
    from scale_snapshot import copies_for, read_seed, replicate

    snap = read_seed(str(seed))
    big = replicate(snap, copies_for(snap, events, share=share), share=share)
    with open(path, "wb") as f:
        pickle.dump(big, f)
    return sum(map(len, big["device_traces"]))


def measure(path: Path, repeat: int, png: str) -> dict:
    import phasemem
    from phasemem.report.pipeline import analyze_trace
    from phasemem.read import trace as read_trace

    def plain_load():
        with open(path, "rb") as f:
            return pickle.load(f)

    out = {}
    out["pickle.load (gc on)"], _ = best_of(repeat, plain_load)
    out["pickle.load (gc off: the floor)"], _ = best_of(repeat, plain_load, collector=False)
    out["read_trace"], trace = best_of(repeat, lambda: read_trace(path))

    def end_to_end():
        report = phasemem.analyze(path)
        report.save_png(png)
        return report

    out["analyze + save_png"], report = best_of(repeat, end_to_end)
    prefix = str(trace.meta.get("markers") or "phasemem::")
    out["  of which analyze_trace"], report = best_of(repeat, lambda: analyze_trace(trace, marker_prefix=prefix))
    out["  of which save_png"], _ = best_of(repeat, lambda: report.save_png(png))
    out["steps"] = len(report.steps)
    out["events"] = len(trace)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=Path, default=SEED, help="the snapshot stretched (any snapshot with steps)")
    ap.add_argument("--share", default="torch,lists", help="torch, lists or both (comma-separated)")
    ap.add_argument("--dir", type=Path, help="keep the files here and reuse them")
    args = ap.parse_args(argv)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores; seed {args.seed.name}; best of {args.repeat}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.dir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for share in args.share.split(","):
            path = folder / f"{args.seed.name.split('.')[0]}_{args.events}_{share}.pickle"
            if not path.exists():
                make(args.seed, args.events, share, path)
            r = measure(path, args.repeat, str(folder / "memory.png"))
            floor = r["pickle.load (gc off: the floor)"]
            print(f"\n--share {share}: {r['events']:,} events, {r['steps']} steps, "
                  f"{path.stat().st_size / 2**20:,.1f} MiB pickle")
            for name, t in r.items():
                if name not in ("steps", "events"):
                    print(f"  {name:<34} {t:7.3f} s   {t / floor:5.2f} x floor")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
