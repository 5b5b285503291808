"""How well phasemem finds steps and phases without markers, on real H200 snapshots.

Ground truth: the phases and steps from the markers recorded with each snapshot (phasemem:: for
fixtures/, gt:: for ../shared/gpu-snapshots). Then every annotation is removed (PyTorch's own
optimizer annotations too) and the snapshot analysed again; and once more with every stack frame
removed as well. Prints the table for docs/accuracy.md.

    python3 docs/eval_inference.py [SNAPSHOT ...]
"""
from __future__ import annotations

import copy
import lzma
import pickle
import sys
from pathlib import Path

import numpy as np

import phasemem
from phasemem.vocab import P

ROOT = Path(__file__).resolve().parents[1]


def load(path: Path):
    obj = pickle.loads(lzma.decompress(path.read_bytes()))
    if "snapshot" in obj:
        return obj["snapshot"], "gt::"
    return obj, obj["phasemem"].get("markers", "phasemem::")


def stripped(snap: dict, frames: bool, keep_torch: bool = False) -> dict:
    """The snapshot without its truth marks (phasemem:: or gt::) and, unless ``keep_torch``, without
    PyTorch's own annotations (``Optimizer.step#…``, DataLoader ranges) either; without frames too
    unless ``frames``. ``keep_torch``: what a plain recording of the same loop holds."""
    s = copy.deepcopy(snap)
    s.pop("phasemem", None)
    s["external_annotations"] = [a for a in s.get("external_annotations") or []
                                 if keep_torch and not str(a.get("name", "")).startswith(("phasemem::", "gt::"))]
    if not frames:
        for t in s["device_traces"]:
            for e in t:
                e["frames"] = []
    return s


def score(truth, got, loss_in_forward: bool) -> dict:
    got_codes = got.analysis.labels.copy()
    if loss_in_forward:  # the shared snapshots' gt::forward spans the model and the loss
        got_codes[got_codes == P["loss"]] = P["forward"]
    ok = truth.analysis.labels == got_codes
    peaks = []
    for name, ph in truth.phases.items():
        if name == "other" or ph.peak_bytes == 0:
            continue
        g = got.phases.get(name)
        if loss_in_forward and name == "forward" and "loss" in got.phases:
            g = max(g, got.phases["loss"], key=lambda p: p.peak_bytes) if g else got.phases["loss"]
        peaks.append(abs((g.peak_bytes if g else 0) - ph.peak_bytes) / ph.peak_bytes)
    hits = {ph: (int(((got_codes == code) & ok).sum()), int((got_codes == code).sum()))
            for ph, code in P.items() if ph != "other"}
    # Without a backward an inferred trace is one step (nothing tells which forwards make one call).
    expected = len(truth.steps) if (truth.analysis.labels == P["backward"]).any() else 1
    return {"accuracy": float(ok.mean()), "steps": (len(got.steps), expected), "hits": hits,
            "peak_err": max(peaks) if peaks else 0.0, "phases": len(peaks),
            "phases_within": sum(p <= 0.02 for p in peaks)}


def main(paths: list[str]) -> int:
    files = [Path(p) for p in paths] or sorted((ROOT / "fixtures").glob("*.pkl.xz")) + sorted(
        (ROOT.parent / "shared" / "gpu-snapshots").glob("*.pkl.xz"))
    print("| snapshot | steps (truth) | accuracy, frames | steps, frames | max peak diff, frames "
          "| accuracy, no frames | steps, no frames | max peak diff, no frames "
          "| accuracy, torch's annotations + frames | steps | accuracy, torch's annotations, no frames | steps |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for path in files:
        snap, prefix = load(path)
        truth = phasemem.analyze(snap, marker_prefix=prefix)
        gt = prefix == "gt::"
        a = score(truth, phasemem.analyze(stripped(snap, True)), gt)
        b = score(truth, phasemem.analyze(stripped(snap, False)), gt)
        c = score(truth, phasemem.analyze(stripped(snap, True, keep_torch=True)), gt)
        d = score(truth, phasemem.analyze(stripped(snap, False, keep_torch=True)), gt)
        rows.append((a, b, c, d))
        print(f"| {path.name.split('.')[0]} | {len(truth.steps)} | {a['accuracy']:.3f} | {a['steps'][0]} "
              f"| {a['peak_err']:.1%} | {b['accuracy']:.3f} | {b['steps'][0]} | {b['peak_err']:.1%} "
              f"| {c['accuracy']:.3f} | {c['steps'][0]} | {d['accuracy']:.3f} | {d['steps'][0]} |")
    for label, k in (("frames", 0), ("no frames", 1), ("torch's annotations + frames", 2),
                     ("torch's annotations, no frames", 3)):
        acc = [r[k]["accuracy"] for r in rows]
        exact = sum(r[k]["steps"][0] == r[k]["steps"][1] for r in rows)
        within = sum(r[k]["peak_err"] <= 0.02 for r in rows)
        phases = sum(r[k]["phases"] for r in rows)
        phases_within = sum(r[k]["phases_within"] for r in rows)
        prec = {ph: (sum(r[k]["hits"][ph][0] for r in rows), sum(r[k]["hits"][ph][1] for r in rows))
                for ph in rows[0][k]["hits"]}
        print(f"\n{label}: precision of each inferred phase (events labelled so that the markers agree with): "
              + ", ".join(f"{ph} {h / t:.3f}" for ph, (h, t) in prec.items() if t))
        print(f"{label}: mean accuracy {np.mean(acc):.3f}, min {np.min(acc):.3f}; "
              f"step count exact in {exact}/{len(rows)}; every phase's peak within 2 % in "
              f"{within}/{len(rows)}; {phases_within} of {phases} phase peaks within 2 %")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
