"""The folder report of many ranks on every local core against the same report one rank after another
(issue 41): ``phasemem analyze DIR -o PNG --workers N`` against ``--workers 1``, each a fresh process, in
alternating pairs (A B, B A, ...), the ratio taken pair by pair; the two reports (text, picture bytes,
and the JSON with ``--json``) are checked equal.

The ranks are made from a real trace: its steady steps repeated to about ``--events`` events
(``scale_snapshot.replicate``), and rank r's every address and size scaled by (16 + r) / 16, so the
ranks differ (rank 15 holds about twice rank 0's bytes) with the same steps and events; each is written
as ``run.save`` writes it (``rank<r>.pickle.xz``, ``phasemem.rank`` and ``world_size`` in its metadata).

Run (from the repository root):

    python3 benchmarks/bench_ranks_parallel.py /tmp/ranks16 [--ranks 16 --events 100000] [--workers 2] [--pairs 5] [--json]

The folder is made on the first run and reused after (``--remake`` makes it again).
"""
from __future__ import annotations

import argparse
import lzma
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from scale_snapshot import busiest, copies_for, read_seed, replicate  # noqa: E402

SEED = ROOT / "fixtures" / "plain_gpt_torch_defaults.pkl.xz"
#: Rank r's bytes are (SCALE_BASE + r) / SCALE_BASE of the seed's.
SCALE_BASE = 16


def scaled(snap: dict, rank: int, world: int) -> dict:
    """The snapshot with every address and size mapped through x -> x * (16 + rank) // 16: a monotone
    map, so blocks stay apart (and inside their segments) and an allocation and its free still match."""
    k = SCALE_BASE + rank

    def f(x):
        return x * k // SCALE_BASE

    def ev(e):
        a, n = e["addr"], e["size"]
        return {**e, "addr": f(a), "size": f(a + n) - f(a)}

    def block(b):
        a = b["address"]
        return {**b, "address": f(a), "size": f(a + b["size"]) - f(a),
                **({"requested_size": b["requested_size"] * k // SCALE_BASE} if "requested_size" in b else {})}

    def segment(s):
        a = s["address"]
        sizes = {key: s[key] * k // SCALE_BASE for key in ("allocated_size", "active_size", "requested_size") if key in s}
        return {**s, **sizes, "address": f(a), "total_size": f(a + s["total_size"]) - f(a),
                "blocks": [block(b) for b in s.get("blocks", [])]}

    meta = {**(snap.get("phasemem") or {}), "rank": rank, "world_size": world}
    return {**snap, "device_traces": [[ev(e) for e in t] for t in snap["device_traces"]],
            "segments": [segment(s) for s in snap.get("segments", [])], "phasemem": meta}


def make(folder: Path, seed: Path, ranks: int, events: int) -> None:
    snap = read_seed(str(seed))
    big = replicate(snap, copies_for(snap, events))
    folder.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        path = folder / f"rank{r}.pickle.xz"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(lzma.compress(pickle.dumps(scaled(big, r, ranks))))
        os.replace(tmp, path)
    n = len(big["device_traces"][busiest(snap)])
    print(f"{folder}: {ranks} ranks of {n:,} events each, "
          f"{sum(p.stat().st_size for p in folder.glob('rank*.pickle.xz')) / 2**20:,.1f} MiB", flush=True)


def report(folder: Path, workers: int, out: Path, with_json: bool) -> tuple[float, tuple]:
    """Wall seconds of the folder report as a user runs it (a fresh ``python3 -m phasemem`` of this tree),
    and what it gave: its text, the picture's bytes, the JSON (with ``--json``)."""
    png, js = out / f"w{workers}.png", out / f"w{workers}.json"
    cmd = [sys.executable, "-m", "phasemem", "analyze", str(folder), "-o", str(png), "--workers", str(workers)]
    t0 = time.perf_counter()
    # -m puts the working directory first on sys.path (and the workers inherit it): this tree's phasemem
    done = subprocess.run(cmd + (["--json", str(js)] if with_json else []), cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"--workers {workers} failed ({done.returncode}): {done.stderr.strip()}")
    text = done.stdout.replace(str(png), "PNG").replace(str(js), "JSON")
    return wall, (text, png.read_bytes(), js.read_text() if with_json else None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path, help="the rank files (made here if missing)")
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--events", type=int, default=100_000, help="about how many events a rank")
    ap.add_argument("--seed", type=Path, default=SEED, help="the real trace the ranks are made from")
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)), help="A's workers (default: every core)")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="also write the JSON (--json J) and compare it")
    ap.add_argument("--remake", action="store_true")
    args = ap.parse_args(argv)
    if args.remake or not any(args.folder.glob("rank*.pickle.xz")):
        make(args.folder, args.seed, args.ranks, args.events)
    ratios, res = [], {args.workers: [], 1: []}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.pairs):
            order = (args.workers, 1) if k % 2 == 0 else (1, args.workers)
            got = {w: report(args.folder, w, Path(tmp), args.json) for w in order}
            (pw, pgot), (sw, sgot) = got[args.workers], got[1]
            if pgot != sgot:
                raise SystemExit(f"pair {k + 1}: --workers {args.workers} and --workers 1 gave different reports")
            res[args.workers].append(pw)
            res[1].append(sw)
            ratios.append(pw / sw)
            print(f"pair {k + 1} ({'A B' if order[0] != 1 else 'B A'}): --workers {args.workers} {pw:6.2f} s   "
                  f"--workers 1 {sw:6.2f} s   ratio {pw / sw:.3f}   load {os.getloadavg()[0]:.2f}", flush=True)
    n = len(list(args.folder.glob("rank*.pickle.xz")))
    print(f"\n{args.folder} ({n} ranks), {args.pairs} pairs of fresh processes, text, picture"
          f"{' and JSON' if args.json else ''} equal in every pair")
    for w in (args.workers, 1):
        print(f"  phasemem analyze DIR -o PNG{' --json J' if args.json else ''} --workers {w:<3} "
              f"median {statistics.median(res[w]):6.2f} s wall (min {min(res[w]):.2f}, max {max(res[w]):.2f})")
    print(f"  ratio (--workers {args.workers}) / (--workers 1), pair by pair: median {statistics.median(ratios):.3f}"
          f"  (min {min(ratios):.3f}, max {max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
