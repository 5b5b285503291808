"""How well phasemem finds steps and phases from lifetimes alone, over every marked real trace.

Every trace the repository has with truth marks (``phasemem::`` markers in ``fixtures/`` and its
sub-folders, ``gt::`` ranges in the held-out sets, ``fixtures/truth`` and ``../shared/gpu-snapshots``)
is analysed with its marks (the truth), then with every annotation (torch's too) and every stack
frame removed (the segments' blocks' as well: ``tests/heldout_sets.bare``), and the two labellings
compared event by event.

Scoring. ``accuracy`` is the share of events whose phase equals the marked one; an event the
inference leaves ``other`` (unknown) where the marks name a phase counts as wrong, exactly as a wrong
phase does -- leaving events unnamed never raises it. ``claimed`` is the precision of what was named:
of the events labelled with a phase (not ``other``), the share the marks label the same. Lowering a
phase's ``confidence`` changes neither number; it only tells the reader how far to trust the phase.
Where the marks' ``gt::forward`` spans the model and its loss (``gt::`` sets), an inferred loss counts
as forward. Steps: the count must equal the marked one (one step where the trace has no backward:
nothing tells which forward calls make one request).

    python3 docs/eval_frameless.py                 # every marked trace: the table, mean, min
    python3 docs/eval_frameless.py heldout3 lora    # only traces whose path contains one of these words
    python3 docs/eval_frameless.py --frames         # the same traces with their stack frames kept

The marked analysis and the stripped trace are cached under $PHASEMEM_EVAL_CACHE (default
/tmp/phasemem-frameless-cache-v2), keyed on the file's content, so a second run costs only the
frameless inference.
"""
from __future__ import annotations

import copy
import hashlib
import lzma
import os
import pickle
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from phasemem.analysis.segmentation import segment  # noqa: E402
from phasemem.analysis.timeline import Timeline  # noqa: E402
from phasemem.read.trace import Trace  # noqa: E402
from phasemem.vocab import P, PHASES  # noqa: E402

CACHE = Path(os.environ.get("PHASEMEM_EVAL_CACHE", "/tmp/phasemem-frameless-cache-v2"))
SHARED = ROOT.parent / "shared" / "gpu-snapshots"


def traces() -> list[Path]:
    return sorted((ROOT / "fixtures").rglob("*.pkl.xz")) + sorted(SHARED.glob("*.pkl.xz"))


def _load(path: Path) -> tuple[dict, str]:
    obj = pickle.loads(lzma.decompress(path.read_bytes()))
    if "snapshot" in obj:
        return obj["snapshot"], "gt::"
    meta = obj.get("phasemem") or {}
    names = {str(a.get("name", "")) for a in obj.get("external_annotations") or []}
    prefix = meta.get("markers") or ("gt::" if any(n.startswith("gt::") for n in names) else "phasemem::")
    return obj, prefix


def unannotated(snap: dict) -> dict:
    """No annotations and no phasemem key; stack frames kept (``--frames``)."""
    s = copy.deepcopy(snap)
    s.pop("phasemem", None)
    s["external_annotations"] = []
    return s


def bare(snap: dict) -> dict:
    """No annotations, no phasemem key, no stack frames (events' nor the segments' blocks')."""
    s = copy.deepcopy(snap)
    s.pop("phasemem", None)
    s["external_annotations"] = []
    for t in s.get("device_traces") or []:
        for e in t:
            e["frames"] = []
    for seg in s.get("segments") or []:
        for b in seg.get("blocks") or []:
            b["frames"] = []
    return s


def _entry(path: Path) -> dict | None:
    """{name, prefix, truth labels, truth steps, has backward, the bare Trace}, or None when unmarked."""
    # keyed on content, not place or time, so that checkouts of the same fixtures share one cache
    key = hashlib.sha1(path.read_bytes()).hexdigest()[:16]
    cached = CACHE / f"{path.name}.{key}.pkl"
    if cached.exists():
        return pickle.loads(cached.read_bytes())
    snap, prefix = _load(path)
    out = None
    if snap.get("device_traces"):
        marked = Trace.from_snapshot(copy.deepcopy(snap))
        seg = segment(marked, prefix, Timeline.from_trace(marked))
        if seg.sources.get("forward") == "markers" or seg.sources.get("backward") == "markers":
            out = {"name": path.name.split(".")[0], "path": str(path.relative_to(ROOT.parent)), "prefix": prefix,
                   "truth": seg.labels.copy(), "steps": len(seg.steps),
                   "trains": bool((seg.labels == P["backward"]).any()),
                   "trace": Trace.from_snapshot(bare(snap), marked.device),
                   "framed": Trace.from_snapshot(unannotated(snap), marked.device)}
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL))
    tmp.replace(cached)
    return out


def score(e: dict, frames: bool = False) -> dict:
    """The frameless labelling of one cached entry (with ``frames``: the frames-kept one) against its truth."""
    trace = e["framed" if frames else "trace"]
    t0 = time.perf_counter()
    seg = segment(trace, "phasemem::", Timeline.from_trace(trace))
    got = seg.labels.copy()
    truth = e["truth"]
    if e["prefix"] == "gt::":  # gt::forward spans the model and its loss
        got[got == P["loss"]] = P["forward"]
    ok = truth == got
    named = got != P["other"]
    expected = e["steps"] if e["trains"] else 1
    return {"accuracy": float(ok.mean()), "claimed": float(ok[named].mean()) if named.any() else 1.0,
            "steps": (len(seg.steps), expected), "seconds": time.perf_counter() - t0,
            "hits": {ph: (int((ok & (got == c)).sum()), int((got == c).sum())) for ph, c in P.items() if ph != "other"},
            "confidence": {ph: c for ph, c in (seg.confidence or {}).items() if seg.sources.get(ph) == "inferred"},
            "doubts": list(seg.doubts)}


def main(words: list[str]) -> int:
    frames = "--frames" in words
    words = [w for w in words if w != "--frames"]
    rows = []
    for path in traces():
        rel = str(path.relative_to(ROOT.parent))
        if words and not any(w in rel for w in words):
            continue
        e = _entry(path)
        if e is None:
            continue
        rows.append((e, score(e, frames)))
    print("| trace | events | steps (truth) | steps | accuracy | claimed | lowest confidence |")
    print("|---|---|---|---|---|---|---|")
    for e, r in rows:
        low = min(r["confidence"].items(), key=lambda kv: kv[1]) if r["confidence"] else ("-", 1.0)
        mark = "" if r["steps"][0] == r["steps"][1] else " **"
        print(f"| {e['path'].split('/', 1)[1]} | {len(e['truth']):,} | {r['steps'][1]} | {r['steps'][0]}{mark} "
              f"| {r['accuracy']:.3f} | {r['claimed']:.3f} | {low[0]} {low[1]:.2f}{' (doubt)' if r['doubts'] else ''} |")
    if not rows:
        print("no marked trace matched")
        return 1
    acc = np.array([r["accuracy"] for _, r in rows])
    exact = sum(r["steps"][0] == r["steps"][1] for _, r in rows)
    prec = {ph: (sum(r["hits"][ph][0] for _, r in rows), sum(r["hits"][ph][1] for _, r in rows)) for ph in rows[0][1]["hits"]}
    print(f"\n{len(rows)} traces: mean accuracy {acc.mean():.4f}, min {acc.min():.3f} "
          f"({rows[int(acc.argmin())][0]['name']}), below 0.7: {int((acc < 0.7).sum())}, "
          f"below 0.9: {int((acc < 0.9).sum())}; steps exact {exact}/{len(rows)}; "
          f"mean claimed {np.mean([r['claimed'] for _, r in rows]):.4f}")
    print("precision of each inferred phase, pooled: "
          + ", ".join(f"{ph} {h / t:.3f}" for ph, (h, t) in prec.items() if t))
    for flagged in (False, True):
        sub = [r for _, r in rows if bool(r["doubts"]) == flagged]
        if not sub:
            continue
        h, t = sum(sum(v[0] for v in r["hits"].values()) for r in sub), sum(sum(v[1] for v in r["hits"].values()) for r in sub)
        each = {ph: (sum(r["hits"][ph][0] for r in sub), sum(r["hits"][ph][1] for r in sub)) for ph in sub[0]["hits"]}
        print(f"{'with' if flagged else 'without'} doubts: {len(sub)} traces, mean accuracy "
              f"{np.mean([r['accuracy'] for r in sub]):.3f}, pooled precision of the phases named {h / max(t, 1):.3f} ("
              + ", ".join(f"{ph} {a / b:.3f}" for ph, (a, b) in each.items() if b) + ")")
    print(f"inference time {sum(r['seconds'] for _, r in rows):.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
