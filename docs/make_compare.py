"""The pictures and tables of docs/compare.md, from the recorded pairs (fixtures/pairs/, H200) and the
near-pairs among the fixtures. Run from the repository root:

    python3 docs/make_compare.py            # every pair found; rewrites the marked parts of docs/compare.md

Each pair is ``phasemem.compare(base, changed)``: its picture goes to docs/img/compare/NAME.png
(1600x900), its table, shapes, causes and named main cause into docs/compare.md between the
``<!-- NAME:begin -->`` / ``<!-- NAME:end -->`` lines of its section (the section's prose is kept).
Pairs whose files are absent are said to be so and left as they were.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import phasemem  # noqa: E402
from phasemem.report.comparison import named_floor, pct, signed  # noqa: E402
from phasemem.units import format_bytes  # noqa: E402
from phasemem.vocab import CATEGORY_NAMES  # noqa: E402

PAIRS = ROOT / "fixtures" / "pairs"
FIX = ROOT / "fixtures"
DOC = ROOT / "docs" / "compare.md"
IMG = ROOT / "docs" / "img" / "compare"

#: (section name, base file, changed file, what was changed) in the order docs/compare.md shows them.
CASES = [
    ("fused", PAIRS / "base.pkl.xz", PAIRS / "fused.pkl.xz", "AdamW(fused=True) instead of the foreach default"),
    ("chunked_ce", PAIRS / "base.pkl.xz", PAIRS / "chunked_ce.pkl.xz",
     "lm_head and cross-entropy computed in token chunks: the full logits never exist"),
    ("ckpt", PAIRS / "base.pkl.xz", PAIRS / "ckpt.pkl.xz", "checkpoint(block, use_reentrant=False) per block"),
    ("half_batch", PAIRS / "base.pkl.xz", PAIRS / "half_batch.pkl.xz", "batch B/2"),
    ("zero_grad_before", PAIRS / "base.pkl.xz", PAIRS / "zero_grad_before.pkl.xz",
     "opt.zero_grad(set_to_none=True) at the top of the step instead of after forward"),
    ("bf16_logits", PAIRS / "base.pkl.xz", PAIRS / "bf16_logits.pkl.xz", "cross-entropy on the bf16 logits, no fp32 upcast"),
    ("fixture_zero_grad", FIX / "gpt_zero_grad_end.pkl.xz", FIX / "gpt_zero_grad_keep.pkl.xz",
     "zero_grad(set_to_none=True) at the end of the step vs zero_grad(set_to_none=False) at its start"),
    ("fixture_fused_ckpt", FIX / "gpt_foreach.pkl.xz", FIX / "gpt_ckpt_fused.pkl.xz",
     "a bigger GPT (6 layers, d 768, vocab 151936, batch 2), bf16 autocast, checkpointing, fused AdamW"),
]


def section(name: str, a: Path, b: Path, what: str) -> tuple[str, dict | None]:
    rel = lambda p: p.relative_to(ROOT).as_posix()  # noqa: E731
    c = phasemem.compare(a, b, names=(rel(a), rel(b)))
    IMG.mkdir(parents=True, exist_ok=True)
    c.save_png(IMG / f"{name}.png")
    main = c.main_cause()
    named = sum(x.bytes for x in c.attribution)
    lines = [f"`phasemem diff {rel(a)} {rel(b)}` — {what}.", "",
             f"![{name}](img/compare/{name}.png)", "",
             f"**{_headline(c)}**", "", f"Named main cause: **{_main(main)}**.", "",
             "| phase | A peak | B peak | Δ | Δ % |", "|---|---:|---:|---:|---:|"]
    for p in c.phases.values():
        cell = lambda v: format_bytes(v) if v is not None else "—"  # noqa: E731
        lines.append(f"| {p.name}{'' if p.aligned else '*'} | {cell(p.a_peak)} | {cell(p.b_peak)} | "
                     f"{signed(p.delta) if p.delta is not None else '—'} | {pct(p.delta, p.a_peak)} |")
    lines.append(f"| **peak** | {format_bytes(c.a.peak_bytes)} | {format_bytes(c.b.peak_bytes)} | "
                 f"{signed(c.delta)} | {pct(c.delta, c.a.peak_bytes)} |")
    if not all(p.aligned for p in c.phases.values()):
        lines.append("\n(* ran at another place of the step in B: its two peaks are of different moments)")
    changed = [s for s in c.shapes if s.change != "same"]
    lines += ["", "Shapes: " + ("; ".join(f"{s.phase} {s.said()}" for s in changed) if changed else "none changed") + "."]
    floor = format_bytes(named_floor(c.a.peak_bytes, c.b.peak_bytes))
    if c.attribution:
        lines += ["", "The peak's change by cause: " + ", ".join(f"{_cause(x)} {signed(x.bytes)}" for x in c.attribution)
                  + f"; unexplained {signed(c.unexplained_bytes)}. Named causes sum to {signed(named)} of "
                  f"{signed(c.delta)} ({_share(named, c.delta)})."]
    else:
        lines += ["", f"No cause of the peak's change is named: it is {signed(c.delta)}, under the {floor} a cause "
                  f"needs."]
    return "\n".join(lines), main


def _headline(c) -> str:
    where = lambda s: s.peak_phase + (f" ({s.peak_shape})" if s.peak_shape else "")  # noqa: E731
    return (f"peak {format_bytes(c.a.peak_bytes)} → {format_bytes(c.b.peak_bytes)} ({signed(c.delta)}, "
            f"{pct(c.delta, c.a.peak_bytes)}), A step {c.a.steps[0]} at {where(c.a)}, B step {c.b.steps[0]} at {where(c.b)}")


def _main(m) -> str:
    if m is None:
        return "nothing changed"
    what = m["cause"] if m["type"] != "category" else f"{CATEGORY_NAMES.get(m['cause'], m['cause'])} outside the shapes"
    if m["where"] == "peak":
        return f"{what} {signed(m['bytes'])}"
    return f"the peak did not move; {m['where']}'s peak changed {signed(m['phase_delta'])}, mostly {what} {signed(m['bytes'])}"


def _cause(x) -> str:
    return x.cause if x.type == "shape" else f"{CATEGORY_NAMES.get(x.cause, x.cause)} outside the shapes"


def _share(named: int, delta: int) -> str:
    return "100 %" if named == delta else f"{100.0 * named / delta:.2f} %" if delta else "—"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated section names")
    args = ap.parse_args(argv)
    text, summary = DOC.read_text(), {}
    for name, a, b, what in CASES:
        if args.only and name not in args.only.split(","):
            continue
        if not (a.exists() and b.exists()):
            print(f"{name}: {a.name} or {b.name} not there; left as it was")
            continue
        begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
        if begin not in text:
            print(f"{name}: no {begin} in {DOC.name}; left out")
            continue
        body, summary[name] = section(name, a, b, what)
        text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: f"{begin}\n{body}\n{end}", text, flags=re.S)
        print(f"{name}: written")
    DOC.write_text(text)
    print(json.dumps(summary, indent=1))  # the named main cause of each pair
    return 0


if __name__ == "__main__":
    sys.exit(main())
