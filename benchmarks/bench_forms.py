"""Reading against the floor on every form a snapshot comes in: does any form fall off a cliff?

A real snapshot in torch's default form (``fixtures/plain_gpt_torch_defaults``: ``stacks="all"``)
is stretched by ``scale_snapshot.replicate`` to each size, in each form:

- ``shared``: as torch writes it (frame dicts shared by every traceback, a new list per step);
- ``unshared``: every event its own list of its own frame dicts (``scale_snapshot.unshare``: a
  snapshot rebuilt by another tool, or after a JSON round trip);

each with C++ frames (``cpp``) and with only Python frames (``py``, ``scale_snapshot.python_frames``).
Each file is a plain pickle. Per file, best of N, in this process:

- floor: ``pickle.load`` with the collector off;
- floor+columns: that, then ``Trace.from_snapshot`` (the plain columnar pass): what reading must
  never be slower than, whatever the form;
- read: ``phasemem.read.trace(path)`` (what ``analyze`` reads a pickle with);
- analyze: ``phasemem.analyze(path)`` end to end (no picture).

Run (from the repository root; 1,000,000 events take a few minutes per form):

    python3 benchmarks/bench_forms.py [--events 10000,100000,1000000] [--forms shared,unshared] \
        [--frames cpp,py] [--repeat 3] [--dir DIR]
"""
from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_floor import SEED, best_of  # noqa: E402


def make(seed: Path, events: int, form: str, frames: str, path: Path) -> int:
    from scale_snapshot import copies_for, python_frames, read_seed, replicate, unshare

    snap = read_seed(str(seed))
    if frames == "py":
        snap = python_frames(snap)
    share = "torch" if form == "shared" else "lists"
    big = replicate(snap, copies_for(snap, events, share=share), share=share)
    if form == "unshared":
        big = unshare(big)
    with open(path.with_suffix(".tmp"), "wb") as f:
        pickle.dump(big, f)
    os.replace(path.with_suffix(".tmp"), path)
    return sum(map(len, big["device_traces"]))


def measure(path: Path, repeat: int) -> dict:
    import phasemem
    from phasemem.read import trace as read_trace
    from phasemem.read.trace import Trace

    def plain_load():
        with open(path, "rb") as f:
            return pickle.load(f)

    def load_and_columns():
        return Trace.from_snapshot(plain_load())

    out = {}
    out["floor"], _ = best_of(repeat, plain_load, collector=False)
    out["floor+columns"], plain = best_of(repeat, load_and_columns, collector=False)
    out["read"], trace = best_of(repeat, lambda: read_trace(path))
    out["analyze"], _ = best_of(repeat, lambda: phasemem.analyze(path))
    out["events"] = len(trace)
    out["same"] = _same(trace, plain)
    return out


def _same(a, b) -> bool:
    """The same events and, per event, the same frames (stack and frame ids may be numbered otherwise)."""
    if not all(np.array_equal(getattr(a, k), getattr(b, k)) for k in ("action", "addr", "size", "stream", "time_us")):
        return False
    ids = {tuple(b.frames[f] for f in s): k for k, s in enumerate(b.stacks)}
    to_b = np.array([ids.get(tuple(a.frames[f] for f in s), -2) for s in a.stacks] + [-1], np.int64)
    return bool(np.array_equal(to_b[a.stack], b.stack))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", default="10000,100000,1000000")
    ap.add_argument("--forms", default="shared,unshared")
    ap.add_argument("--frames", default="cpp,py")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=Path, default=SEED)
    ap.add_argument("--dir", type=Path, help="keep the files here and reuse them")
    args = ap.parse_args(argv)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores; seed {args.seed.name}; best of {args.repeat}")
    print(f"{'form':<10}{'frames':<7}{'events':>10}{'MiB':>8}{'floor s':>9}{'+columns s':>11}{'read s':>9}"
          f"{'analyze s':>10}{'read/floor':>11}{'read/+col':>10}{'analyze/floor':>14}  same")
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.dir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for n in map(int, args.events.split(",")):
            for form in args.forms.split(","):
                for frames in args.frames.split(","):
                    path = folder / f"{args.seed.name.split('.')[0]}_{n}_{form}_{frames}.pickle"
                    if not path.exists():
                        make(args.seed, n, form, frames, path)
                    r = measure(path, args.repeat)
                    f = r["floor"]
                    print(f"{form:<10}{frames:<7}{r['events']:>10,}{path.stat().st_size / 2**20:>8.1f}{f:>9.3f}"
                          f"{r['floor+columns']:>11.3f}{r['read']:>9.3f}{r['analyze']:>10.3f}{r['read'] / f:>11.2f}"
                          f"{r['read'] / r['floor+columns']:>10.2f}{r['analyze'] / f:>14.2f}  {r['same']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
