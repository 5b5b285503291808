"""The PNGs of two phasemem checkouts, pixel by pixel: every change to how the PNG is made must leave
its pixels alone (issue 34) unless it says which pictures it changes.

``--write DIR`` draws, with the phasemem its PYTHONPATH names, the PNG of each case into DIR: the first
``--fixtures`` snapshots under fixtures/ (sorted, subfolders after the top level) and every
../shared/wild snapshot with a history (a live-only one has no bands), each at 1600×900 with the default
colours and ``color="stack"``, and at 600×400. ``--compare A B`` counts the differing pixels of the
PNGs of the same name in two such folders. ``--before CHECKOUT`` does both: writes A with CHECKOUT,
B with this checkout, each in its own process, and compares.

Run (from the repository root):

    git archive HEAD | tar -x -C /tmp/base    # the code before the change
    python3 benchmarks/compare_pngs.py --before /tmp/base --out /tmp/pngs [--skip-stack]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WILD = ROOT.parent / "shared" / "wild"

#: Each case drawn in these variants; the stack colours are listed apart, as a change to them is
#: named (``--skip-stack`` leaves them out of the comparison).
VARIANTS = {"default": {}, "stack": {"color": "stack"}, "small": {"size": (600, 400)}}


def cases(n_fixtures: int) -> list[Path]:
    top = sorted((ROOT / "fixtures").glob("*.pkl.xz"))
    deeper = sorted(p for p in (ROOT / "fixtures").glob("*/**/*.pkl.xz"))
    wild = sorted(WILD.glob("*.pickle")) if WILD.exists() else []
    return (top + deeper)[:n_fixtures] + wild


def write(out: Path, n_fixtures: int) -> None:
    import phasemem

    out.mkdir(parents=True, exist_ok=True)
    for path in cases(n_fixtures):
        name = path.name.split(".")[0] if path.parent.name in ("fixtures", "wild") else \
            "_".join(path.relative_to(ROOT / "fixtures").parts).split(".")[0]
        try:
            report = phasemem.analyze(path)
        except Exception as e:  # noqa: BLE001 (a snapshot this reader refuses is left out, said)
            print(f"skip {name}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        if report.live is not None:
            continue
        for variant, options in VARIANTS.items():
            report.save_png(out / f"{name}__{variant}.png", **options)
    print(f"wrote {len(list(out.glob('*.png')))} PNGs with {phasemem.__file__}", file=sys.stderr)


def compare(a: Path, b: Path, skip_stack: bool) -> int:
    from PIL import Image

    differ, n = [], 0
    for pa in sorted(a.glob("*.png")):
        if skip_stack and pa.stem.endswith("__stack"):
            continue
        pb = b / pa.name
        if not pb.exists():
            differ.append((pa.name, "missing"))
            continue
        x, y = np.asarray(Image.open(pa).convert("RGBA")), np.asarray(Image.open(pb).convert("RGBA"))
        n += 1
        if x.shape != y.shape:
            differ.append((pa.name, f"size {x.shape} vs {y.shape}"))
        elif (x != y).any():
            differ.append((pa.name, f"{int((x != y).any(axis=2).sum())} pixels"))
    for name, what in differ:
        print(f"  {name}: {what}")
    print(f"{len(differ)} of {n} PNGs differ")
    return 1 if differ else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", type=Path, help="draw the PNGs into this folder")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"))
    ap.add_argument("--before", type=Path, help="the other checkout: write with it and with this one, compare")
    ap.add_argument("--out", type=Path, default=Path("/tmp/compare_pngs"), help="with --before: A and B go here")
    ap.add_argument("--fixtures", type=int, default=40, help="how many fixtures (default 40)")
    ap.add_argument("--skip-stack", action="store_true", help='leave color="stack" out of the comparison')
    args = ap.parse_args(argv)
    if args.write:
        write(args.write, args.fixtures)
        return 0
    if args.compare:
        return compare(*args.compare, args.skip_stack)
    if not args.before:
        ap.error("give --write, --compare or --before")
    for src, folder in ((args.before, args.out / "before"), (ROOT, args.out / "after")):
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--write", str(folder),
                        "--fixtures", str(args.fixtures)], check=True, cwd=str(src),
                       env={**os.environ, "PYTHONPATH": str(src)})
    return compare(args.out / "before", args.out / "after", args.skip_stack)


if __name__ == "__main__":
    sys.exit(main())
