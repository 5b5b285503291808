"""What phasemem says about every real trace, as one JSON per trace, and the differences between two runs.

Behaviour changes must be deliberate: write the reports before a change, again after it, and read
the differences (labels as runs, steps, every number, patterns, categories, notes).

    python3 docs/diff_reports.py write OUT_DIR            # every fixture + ../shared (gpu-snapshots, wild)
    python3 docs/diff_reports.py diff BEFORE_DIR AFTER_DIR [--added] [--words]
Each trace is analysed as given, and once more with every annotation removed (the inferred path),
and once more without stack frames either ("-nomarks", "-noframes").
"""
from __future__ import annotations

import copy
import json
import lzma
import pickle
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's phasemem, whatever is installed

import phasemem  # noqa: E402
from phasemem.errors import PhasememError  # noqa: E402
ADDED = "--added" in sys.argv  # also list fields only the second run has
WORDS = "--words" in sys.argv  # also list changed explanations
SHARED = ROOT.parent / "shared"


def traces() -> list[Path]:
    out = sorted((ROOT / "fixtures").rglob("*.pkl.xz"))
    out += sorted((SHARED / "gpu-snapshots").glob("*.pkl.xz")) + sorted((SHARED / "wild").glob("*.pickle"))
    return out


def _load(path: Path):
    raw = path.read_bytes()
    obj = pickle.loads(lzma.decompress(raw) if path.suffix == ".xz" else raw)
    return obj["snapshot"] if isinstance(obj, dict) and "snapshot" in obj else obj


def _variants(snap):
    yield "", snap
    if not isinstance(snap, dict) or not snap.get("device_traces"):
        return
    s = copy.deepcopy(snap)
    s["external_annotations"] = []
    s.pop("phasemem", None)
    yield "-nomarks", s
    s = copy.deepcopy(s)
    for t in s["device_traces"]:
        for e in t:
            e["frames"] = []
    yield "-noframes", s


def summary(report) -> dict:
    d = report.to_dict()
    d.pop("category_curve", None)
    return d


def _name(path: Path) -> str:
    """A trace's report name: its stem, with its folder where it has one (fixtures in a subfolder: many
    hold a ``gpt__base`` or a ``lightning``, which overwrote each other when named by stem alone)."""
    stem = path.name.removesuffix(".xz").removesuffix(".pkl").removesuffix(".pickle")  # yiyi_opt1.3b.pickle
    if path.parent == ROOT / "fixtures":
        return stem
    if path.parent.parent == ROOT / "fixtures":
        return f"{path.parent.name}__{stem}"
    return f"{path.parent.name}-{stem}"


def write(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for path in traces():
        snap = _load(path)
        for tag, s in _variants(snap):
            name = _name(path) + tag
            try:
                doc = summary(phasemem.analyze(s, trusted=True))
            except PhasememError as e:
                doc = {"error": str(e)}
            (out / f"{name}.json").write_text(json.dumps(doc, indent=0, sort_keys=True, default=str))
            print(name, flush=True)


def _flat(obj, prefix=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flat(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, list):
        for k, v in enumerate(obj):
            yield from _flat(v, f"{prefix}[{k}]")
    else:
        yield prefix, obj


def diff(a: Path, b: Path) -> int:
    changed = 0
    for fa in sorted(a.glob("*.json")):
        fb = b / fa.name
        if not fb.exists():
            print(f"{fa.stem}: missing after")
            changed += 1
            continue
        da, db = dict(_flat(json.loads(fa.read_text()))), dict(_flat(json.loads(fb.read_text())))
        # A field the change added is no difference in behaviour; an explanation reworded is read apart.
        keys = [k for k in sorted(set(da) | (set(db) if ADDED else set())) if da.get(k) != db.get(k)
                and not (k.endswith(".explanation") and not WORDS)]
        if keys:
            changed += 1
            print(f"{fa.stem}: {len(keys)} values differ")
            for k in keys[:12]:
                print(f"    {k}: {str(da.get(k))[:90]!s} -> {str(db.get(k))[:90]!s}")
    print(f"{changed} trace(s) differ")
    return 1 if changed else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        write(Path(sys.argv[2]))
    elif len(sys.argv) >= 4 and sys.argv[1] == "diff":
        sys.exit(diff(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
