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
import threading
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


def report(folder: Path, workers: int, out: Path, with_json: bool) -> tuple[float, dict, tuple]:
    """Wall seconds of the folder report as a user runs it (a fresh ``python3 -m phasemem`` of this tree),
    the CPU seconds of each of its processes (``cpu_of``), and what it gave: its text, the picture's
    bytes, the JSON (with ``--json``)."""
    png, js = out / f"w{workers}.png", out / f"w{workers}.json"
    cmd = [sys.executable, "-m", "phasemem", "analyze", str(folder), "-o", str(png), "--workers", str(workers)]
    t0 = time.perf_counter()
    # -m puts the working directory first on sys.path (and the workers inherit it): this tree's phasemem
    proc = subprocess.Popen(cmd + (["--json", str(js)] if with_json else []), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    cpu = cpu_of(proc)
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"--workers {workers} failed ({proc.returncode}): {stderr.strip()}")
    text = stdout.replace(str(png), "PNG").replace(str(js), "JSON")
    return wall, cpu, (text, png.read_bytes(), js.read_text() if with_json else None)


def cpu_of(proc: subprocess.Popen) -> dict:
    """CPU seconds (user + system) of the command and of every process under it, read every 20 ms until it
    ends (psutil; {} without it): ``{"main", "server" (the forkserver), "tracker" (multiprocessing's resource
    tracker), "workers": [...]}``. Each is its last reading, so a process loses at most its last 20 ms."""
    try:
        import psutil
    except ImportError:
        proc.wait()
        return {}
    seen: dict[int, float] = {}
    role: dict[int, str] = {}
    try:
        root = psutil.Process(proc.pid)
    except psutil.NoSuchProcess:
        proc.wait()
        return {}
    while proc.poll() is None:
        try:
            for p in [root] + root.children(recursive=True):
                try:
                    t = p.cpu_times()
                    seen[p.pid] = t.user + t.system
                    if p.pid not in role:
                        line = " ".join(p.cmdline())
                        # the workers are forks of the forkserver: its command line, and it as their parent
                        role[p.pid] = ("main" if p.pid == proc.pid else "tracker" if "resource_tracker" in line
                                       else "server" if "forkserver import main" in line and p.ppid() == proc.pid
                                       else "worker")
                except psutil.NoSuchProcess:
                    pass
        except psutil.NoSuchProcess:
            break
        time.sleep(0.02)
    out = {"main": 0.0, "server": 0.0, "tracker": 0.0, "workers": []}
    for pid, v in seen.items():
        if role.get(pid) == "worker":
            out["workers"].append(v)
        else:
            out[role.get(pid, "tracker")] += v
    return out


def model(cpu_a: dict, cpu_b: dict) -> float | None:
    """The ratio on otherwise idle cores, from CPU seconds (the wall ratio of a busy machine is the share
    the kernel gives this session): B one after another takes its CPU; A at most its main process's CPU
    plus the forkserver's and the busiest worker's, as if nothing of them overlapped (the main's loading
    of the picture's modules and the server's import do overlap: an upper bound)."""
    if not cpu_a or not cpu_b or not cpu_b["main"]:
        return None
    return (cpu_a["main"] + cpu_a["server"] + cpu_a["tracker"] + max(cpu_a["workers"], default=0.0)) / cpu_b["main"]


class Busy:
    """How busy the machine was while a pair ran: the mean of the kernel's count of runnable tasks
    (/proc/loadavg's fourth field, ours included), sampled every 0.2 s."""

    def __init__(self):
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.2):
            try:
                with open("/proc/loadavg") as f:
                    self.samples.append(int(f.read().split()[3].split("/")[0]))
            except (OSError, ValueError, IndexError):
                return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    @property
    def mean(self) -> float:
        return statistics.mean(self.samples) if self.samples else float("nan")


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
    ratios, busies, models, res = [], [], [], {args.workers: [], 1: []}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.pairs):
            order = (args.workers, 1) if k % 2 == 0 else (1, args.workers)
            with Busy() as busy:
                got = {w: report(args.folder, w, Path(tmp), args.json) for w in order}
            busies.append(busy.mean)
            (pw, pcpu, pgot), (sw, scpu, sgot) = got[args.workers], got[1]
            models.append(model(pcpu, scpu))
            if pgot != sgot:
                raise SystemExit(f"pair {k + 1}: --workers {args.workers} and --workers 1 gave different reports")
            res[args.workers].append(pw)
            res[1].append(sw)
            ratios.append(pw / sw)
            print(f"pair {k + 1} ({'A B' if order[0] != 1 else 'B A'}): --workers {args.workers} {pw:6.2f} s   "
                  f"--workers 1 {sw:6.2f} s   ratio {pw / sw:.3f}   runnable tasks {busy.mean:.1f} (load average "
                  f"{os.getloadavg()[0]:.2f})" + (f"\n         CPU s: --workers {args.workers} main {pcpu['main']:.2f}, forkserver {pcpu['server']:.2f}, "
                  f"tracker {pcpu['tracker']:.2f}, workers {', '.join(f'{v:.2f}' for v in pcpu['workers'])}; --workers 1 "
                  f"{scpu['main']:.2f}; idle-core model ratio {models[-1]:.3f}" if models[-1] else ""), flush=True)
    n = len(list(args.folder.glob("rank*.pickle.xz")))
    print(f"\n{args.folder} ({n} ranks), {args.pairs} pairs of fresh processes, text, picture"
          f"{' and JSON' if args.json else ''} equal in every pair")
    for w in (args.workers, 1):
        print(f"  phasemem analyze DIR -o PNG{' --json J' if args.json else ''} --workers {w:<3} "
              f"median {statistics.median(res[w]):6.2f} s wall (min {min(res[w]):.2f}, max {max(res[w]):.2f})")
    print(f"  ratio (--workers {args.workers}) / (--workers 1), pair by pair: median {statistics.median(ratios):.3f}"
          f"  (min {min(ratios):.3f}, max {max(ratios):.3f})")
    if all(m is not None for m in models):
        print(f"  idle-core model ratio (CPU seconds, an upper bound): median {statistics.median(models):.3f}"
              f"  (min {min(models):.3f}, max {max(models):.3f})")
    # Where other work kept the cores busy, a second worker gets little more CPU than one (the kernel shares
    # the cores between sessions: autogroups): the pairs run while the machine was quietest say what it can do.
    quiet = sorted(range(len(ratios)), key=lambda k: busies[k])[:max(1, len(ratios) // 2)]
    print(f"  the {len(quiet)} quietest pair(s) (runnable tasks {', '.join(f'{busies[k]:.1f}' for k in quiet)}): "
          f"median ratio {statistics.median(ratios[k] for k in quiet):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
