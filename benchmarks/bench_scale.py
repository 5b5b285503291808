"""Time and peak memory (RSS) of phasemem on a huge trace, each case in a fresh process.

By default the trace is the real H200 snapshot ``gpt_ckpt_fused_seedlike`` stretched to 10M events
by ``bench_analyze.replicate_steps`` (steps 1–2 repeated, ~2,480 events a step); with ``--seed``
any snapshot is stretched by ``scale_snapshot.replicate`` (``--share``: torch's sharing of frames,
or the seed's lists reused), to ``--events`` or to about ``--bytes`` on disk. It is written as a
plain pickle, the way ``torch.cuda.memory._dump_snapshot`` writes it. Each case runs as its own
``python3`` process; its wall time (interpreter start and imports included, as a user sees it) and
its peak resident memory (``ru_maxrss`` from ``os.wait4``) are printed:

- ``pickle.load`` of the file with the cyclic collector off (what any reader of the file pays) and on,
- the ordinary reader (``load.read_snapshot_file`` + ``Trace.from_snapshot``), the batch-streaming
  one (``stream._stream``) and ``stream.read_trace`` (which decodes the events from the bytes),
- ``phasemem convert`` (read, step index, .npz written),
- ``phasemem.analyze`` of the pickle, its .gz and the .npz (the whole trace, no picture),
- ``phasemem analyze trace.pickle -o memory.png`` (the CLI, whole trace and picture),
- ``phasemem analyze --steps K -o one.png`` (one step, picture included) from the .npz and the pickle.

``--cases`` picks some of them by number (as printed). Run (from the repository root; at 10M
events it needs ~3 GB of memory and ~2 GB of disk):

    python3 benchmarks/bench_scale.py [--events 10000000] [--step 1000] [--dir /tmp/phasemem-scale]
    python3 benchmarks/bench_scale.py --seed fixtures/plain_gpt_torch_defaults.pkl.xz --bytes 1e9 --cases 1,2,5,10
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
GZIP = "import gzip, shutil; shutil.copyfileobj(open({src!r}, 'rb'), gzip.open({dst!r}, 'wb', compresslevel=1), 1 << 20)"


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


def make(args, folder: Path, py: str) -> Path:
    """The stretched pickle (made once; kept with --dir)."""
    if args.seed is None:
        pkl = folder / f"trace{args.events}.pickle"
        if not pkl.exists():
            run([py, "-c", MAKE.format(bench=str(ROOT / "benchmarks"), events=args.events, path=str(pkl))],
                folder / "make.txt")
        return pkl
    size = f"{args.bytes:.0e}B" if args.bytes else str(args.events)
    pkl = folder / f"{args.seed.name.split('.')[0]}_{size}_{args.share}.pickle"
    if not pkl.exists():
        how = ["--bytes", str(args.bytes)] if args.bytes else ["--events", str(args.events)]
        run([py, str(ROOT / "benchmarks" / "scale_snapshot.py"), str(args.seed), str(pkl), "--share", args.share]
            + how, folder / "make.txt")
    return pkl


def cases(pkl: Path, npz: Path, gz: Path, png: Path, step: int, markers: str) -> list[tuple[str, list[str]]]:
    p, n = str(pkl), str(npz)
    return [
        ("pickle.load (gc off)", ["-c", f"import gc, pickle; gc.disable(); pickle.load(open({p!r}, 'rb'))"]),
        ("pickle.load (gc on)", ["-c", f"import pickle; pickle.load(open({p!r}, 'rb'))"]),
        ("ordinary reader (load + Trace.from_snapshot)",
         ["-c", "from phasemem.read.snapshot import read_snapshot_file; from phasemem.read.trace import no_gc; from phasemem.read.trace import Trace\n"
                f"with no_gc(): t = Trace.from_snapshot(read_snapshot_file({p!r}))"]),
        ("batch-streaming reader (stream._stream)",
         ["-c", f"from phasemem.read.batched import read_batched; assert read_batched({p!r}, None, False) is not None"]),
        ("stream.read_trace (events decoded from the bytes)",
         ["-c", f"from phasemem.read.decoder import decode_trace; assert decode_trace({p!r}, always=True) is not None"]),
        ("phasemem convert (with step index)", ["-m", "phasemem", "convert", p, "-o", n, "--markers", markers]),
        ("phasemem.report.pipeline(pickle), whole trace",
         ["-c", f"import phasemem; phasemem.analyze({p!r}, marker_prefix={markers!r})"]),
        ("phasemem.report.pipeline(pickle.gz), whole trace",
         ["-c", f"import phasemem; phasemem.analyze({str(gz)!r}, marker_prefix={markers!r})"]),
        ("phasemem.report.pipeline(npz), whole trace", ["-c", f"import phasemem; phasemem.analyze({n!r}, marker_prefix={markers!r})"]),
        ("phasemem analyze pickle -o memory.png", ["-m", "phasemem", "analyze", p, "--markers", markers, "-o",
                                                   str(png.with_name("memory.png"))]),
        (f"analyze npz --steps {step} -o one.png", ["-m", "phasemem", "analyze", n, "--steps", str(step), "-o", str(png)]),
        (f"analyze pickle --steps {step} -o one.png",
         ["-m", "phasemem", "analyze", p, "--markers", markers, "--steps", str(step), "-o", str(png)]),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=10_000_000, help="about how many events (default 10,000,000)")
    ap.add_argument("--bytes", type=float, help="instead of --events, about this many bytes of pickle (with --seed)")
    ap.add_argument("--seed", type=Path, help="stretch this snapshot with scale_snapshot.py (default: the shared "
                                              "gpt_ckpt_fused_seedlike, with bench_analyze.replicate_steps)")
    ap.add_argument("--share", default="torch", choices=("torch", "lists"), help="with --seed: how frames are shared")
    ap.add_argument("--markers", default="gt::", help="the marker prefix (default gt::)")
    ap.add_argument("--step", type=int, default=1000, help="the step --steps analyses (default 1000)")
    ap.add_argument("--cases", help="comma-separated case numbers (default: all)")
    ap.add_argument("--dir", type=Path, help="keep the files here and reuse them (default: a temporary directory)")
    args = ap.parse_args(argv)
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.dir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        pkl = make(args, folder, py)
        npz, gz, png = pkl.with_suffix(".npz"), pkl.with_suffix(".pickle.gz"), folder / "one.png"
        todo = cases(pkl, npz, gz, png, args.step, args.markers)
        pick = [int(k) for k in args.cases.split(",")] if args.cases else range(1, len(todo) + 1)
        if 8 in pick and not gz.exists():
            run([py, "-c", GZIP.format(src=str(pkl), dst=str(gz))])
        print(f"{pkl.name}: {pkl.stat().st_size / 2**20:,.0f} MiB pickle; python {sys.version.split()[0]}, "
              f"{os.cpu_count()} cores")
        print(f"{'case':<54} {'seconds':>8} {'peak RSS GiB':>13}")
        for k in pick:
            name, rest = todo[k - 1]
            wall, rss = run([py] + rest, folder / "last.txt")
            print(f"{k:>2} {name:<51} {wall:8.1f} {rss:13.2f}", flush=True)
        for f in (npz, gz):
            if f.exists():
                print(f"{f.name}: {f.stat().st_size / 2**20:,.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
