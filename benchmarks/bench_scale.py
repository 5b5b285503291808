"""Time and peak memory (RSS) of phasemem on a 10-million-event trace, each case in a fresh process.

The trace is the real H200 snapshot ``gpt_ckpt_fused_seedlike`` stretched by
``bench_analyze.replicate_steps`` (steps 1–2 repeated, ~2,480 events a step), written as a plain
pickle the way ``torch.cuda.memory._dump_snapshot`` writes it. Each case runs as its own
``python3`` process; its wall time (interpreter start and imports included, as a user sees it) and
its peak resident memory (``ru_maxrss`` from ``os.wait4``) are printed:

- ``pickle.load`` of the file with the cyclic collector off (what any reader of the file pays),
- the ordinary reader (``load.read_snapshot_file`` + ``Trace.from_snapshot``) and the streaming
  one (``stream.read_trace``), each only reading the trace,
- ``phasemem convert`` (streamed read, step index, .npz written),
- ``phasemem.analyze`` of the pickle and of the .npz (the whole trace, no picture),
- ``phasemem analyze --steps K -o one.png`` (one step, picture included) from the .npz and the pickle.

Run (from the repository root; needs ~3 GB of memory and ~1.2 GB of disk at 10M events):

    python3 benchmarks/bench_scale.py [--events 10000000] [--step 1000] [--dir /tmp/phasemem-scale]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MAKE = """
import pickle, sys
sys.path.insert(0, {bench!r})
from bench_analyze import SOURCE, read_shared, replicate_steps
base = read_shared(SOURCE)
n0 = len(base["device_traces"][0])
per_block = len(replicate_steps(base, 2)["device_traces"][0]) - n0
copies = max(1, round(({events} - n0) / per_block) + 1)
big = replicate_steps(base, copies)
with open({path!r}, "wb") as f:
    pickle.dump(big, f)
print(len(big["device_traces"][0]), copies)
"""


def run(argv: list[str], out: Path | None = None) -> tuple[float, float]:
    """Wall seconds and peak RSS (GiB) of one process."""
    sink = open(out, "w") if out else subprocess.DEVNULL
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if out:
        sink.close()
    if p.returncode:
        raise SystemExit(f"{' '.join(argv)} failed with {p.returncode}" + (f": {out.read_text()[-2000:]}" if out else ""))
    return wall, usage.ru_maxrss / 2**20  # KiB on Linux


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=10_000_000, help="about how many events (default 10,000,000)")
    ap.add_argument("--step", type=int, default=1000, help="the step --steps analyses (default 1000)")
    ap.add_argument("--dir", type=Path, help="keep the files here and reuse them (default: a temporary directory)")
    args = ap.parse_args(argv)
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.dir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        pkl, npz, png = folder / f"trace{args.events}.pickle", folder / f"trace{args.events}.npz", folder / "one.png"
        if not pkl.exists():
            log = folder / "make.txt"
            run([py, "-c", MAKE.format(bench=str(ROOT / "benchmarks"), events=args.events, path=str(pkl))], log)
            print(f"made {pkl}: {log.read_text().split()[0]} events")
        print(f"{pkl.stat().st_size / 2**20:,.0f} MiB pickle; python {sys.version.split()[0]}, {os.cpu_count()} cores")
        cases = [
            ("pickle.load (gc off)",
             ["-c", f"import gc, pickle; gc.disable(); pickle.load(open({str(pkl)!r}, 'rb'))"]),
            ("ordinary reader (load + Trace.from_snapshot)",
             ["-c", "from phasemem.load import read_snapshot_file, no_gc; from phasemem.trace import Trace\n"
                    f"with no_gc(): t = Trace.from_snapshot(read_snapshot_file({str(pkl)!r}))"]),
            ("streaming reader (stream.read_trace)",
             ["-c", f"from phasemem.stream import read_trace; read_trace({str(pkl)!r})"]),
            ("phasemem convert (streamed, with step index)",
             ["-m", "phasemem", "convert", str(pkl), "-o", str(npz), "--markers", "gt::"]),
            ("phasemem.analyze(pickle), whole trace",
             ["-c", f"import phasemem; phasemem.analyze({str(pkl)!r}, marker_prefix='gt::')"]),
            ("phasemem.analyze(npz), whole trace",
             ["-c", f"import phasemem; phasemem.analyze({str(npz)!r}, marker_prefix='gt::')"]),
            (f"analyze npz --steps {args.step} -o one.png",
             ["-m", "phasemem", "analyze", str(npz), "--steps", str(args.step), "-o", str(png)]),
            (f"analyze pickle --steps {args.step} -o one.png",
             ["-m", "phasemem", "analyze", str(pkl), "--markers", "gt::", "--steps", str(args.step), "-o", str(png)]),
        ]
        print(f"{'case':<48} {'seconds':>8} {'peak RSS GiB':>13}")
        for name, rest in cases:
            out = folder / "last.txt"
            wall, rss = run([py] + rest, out)
            print(f"{name:<48} {wall:8.1f} {rss:13.2f}", flush=True)
        print(f"npz: {npz.stat().st_size / 2**20:,.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
