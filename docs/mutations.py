"""Break phasemem one small way at a time, in a copy, and run the test suite there: every break must
fail at least one test (docs/testing.md has the table this prints).

    python3 docs/mutations.py [--without-shared] [NAME ...]

Each mutation names a file, a piece of its text and what replaces it; the copy is made fresh for
each, ``pytest -x -q`` runs in it, and the first failing test is reported. ``--without-shared`` runs
the copy with no ../shared beside it, as a clean checkout without the shared data is.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MUTATIONS = {
    "softmax spike detector removed": ("phasemem/analysis/patterns/logits.py",
                                       "    bwd_first = bwd[0] if bwd is not None else ctx.n\n",
                                       "    return None\n    bwd_first = bwd[0] if bwd is not None else ctx.n\n"),
    "logits release removed": ("phasemem/analysis/patterns/__init__.py", "found += leak.detect(ctx)",
                               "found = [p for p in found if p.kind != 'logits_release']\n    found += leak.detect(ctx)"),
    "gradient accumulation removed": ("phasemem/analysis/patterns/__init__.py", "found += leak.detect(ctx)",
                                      "found = [p for p in found if p.kind != 'gradient_accumulation']\n"
                                      "    found += leak.detect(ctx)"),
    "spike size wrong": ("phasemem/analysis/patterns/logits.py",
                         "height = int(ctx.level[p] - ctx.timeline.active_after[end])", "height = int(ctx.level[p])"),
    "FSDP2 guard in categories off": ("phasemem/analysis/categories.py", "if int(gsizes[paired].sum()) < int(gsizes.sum()) // 2:",
                                      "if False:"),
    "marker END boundary": ("phasemem/analysis/segmentation/markers.py", 'iv.stop = int(np.searchsorted(t, iv.t1, "right"))',
                            'iv.stop = int(np.searchsorted(t, iv.t1, "left"))'),
    "one loss per forward rule": ("phasemem/analysis/segmentation/markers.py", "if k >= 0 and fwd_ends[k] > prev_bwd_end:",
                                  "if k >= 0:"),
    "spike peak event": ("phasemem/analysis/patterns/logits.py",
                         'kind="softmax_spike", step=step, phase="forward", start_event=start, end_event=end, peak_event=p,',
                         'kind="softmax_spike", step=step, phase="forward", start_event=start, end_event=end, '
                         'peak_event=start,'),
}


def run(name: str, without_shared: bool) -> str:
    path, old, new = MUTATIONS[name]
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "main"
        shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.png", ".pytest_cache"))
        if not without_shared and (ROOT.parent / "shared").exists():
            os.symlink(ROOT.parent / "shared", Path(tmp) / "shared")
        target = copy / path
        text = target.read_text()
        if text.count(old) != 1:
            return f"mutation does not apply (the text is found {text.count(old)} times)"
        target.write_text(text.replace(old, new))
        out = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"], cwd=copy,
                             env={**os.environ, "PYTHONPATH": str(copy)}, capture_output=True, text=True)
        failed = [ln for ln in out.stdout.splitlines() if ln.startswith("FAILED")]
        last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-200:]
        return (failed[0].split(" - ")[0].replace("FAILED ", "fails ") if failed else "PASSES") + f" ({last})"


if __name__ == "__main__":
    without = "--without-shared" in sys.argv
    names = [a for a in sys.argv[1:] if not a.startswith("--")] or list(MUTATIONS)
    print(f"| behaviour broken | suite ({'without' if without else 'with'} ../shared) |\n|---|---|")
    for name in names:
        print(f"| {name} | {run(name, without)} |", flush=True)
