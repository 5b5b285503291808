"""Redraw every picture the docs show, from the recorded H200 snapshots in fixtures/.

    python3 docs/make_pictures.py                 # all of them
    python3 docs/make_pictures.py --only patterns # docs/img/patterns/<kind>.png only

Writes docs/img/gallery/<name>.png (the pictures of docs/gallery.md), docs/img/patterns/<kind>.png
(one real occurrence of each pattern kind, zoomed to its events with some context, the pattern's
event range bracketed under the phase strip) and docs/img/categories_phasemem.png. Run it after changing the picture or the analysis.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import phasemem  # noqa: E402
from phasemem.reporters.picture import draw as render  # noqa: E402

FIXTURES = ROOT / "fixtures"
OUT = ROOT / "docs" / "img"

#: name: (fixture, plot options). The first four are the gallery's required ones.
GALLERY = {
    "gpt_foreach": ("gpt_foreach", {}),
    "qwen_hf_ckpt_fused": ("qwen_hf_ckpt_fused", {}),
    "resnet_sgd": ("resnet_sgd", {}),
    "mlp_fp16_scaler": ("mlp_fp16_scaler", {}),
    "gpt_foreach_stack_steps_1-2": ("gpt_foreach", {"color": "stack", "steps": "1-2"}),
    "gpt_foreach_time": ("gpt_foreach", {"by": "time", "color": "phase"}),
    "gpt_forloop_accum": ("gpt_forloop_accum", {}),
    "gpt_wrapped": ("gpt_wrapped", {}),
}

#: kind: (fixture, step number, phase) of the occurrence shown. Step 1 where it exists: steady state.
PATTERNS = {
    "logits": ("llama_hf", 1, "forward"),
    "softmax_spike": ("qwen_hf_ckpt_fused", 1, "forward"),
    "logits_release": ("gpt_foreach", 1, "backward"),
    "checkpoint_recompute": ("gpt_ckpt_fused", 1, "backward"),
    "gradients": ("gpt_foreach", 1, "backward"),
    "optimizer_state_init": ("gpt_foreach", 0, "optimizer"),
    "optimizer_temporaries": ("gpt_foreach", 1, "optimizer"),
    "gradient_accumulation": ("gpt_forloop_accum", 1, "backward"),
}

_reports: dict = {}


def report_of(name: str):
    """The analysed fixture (the qwen run falls back to gpt_ckpt_fused where it is missing)."""
    if name not in _reports:
        path = FIXTURES / f"{name}.pkl.xz"
        if not path.exists() and name == "qwen_hf_ckpt_fused":
            path = FIXTURES / "gpt_ckpt_fused.pkl.xz"
        # analyze() takes the marker prefix each snapshot says it was recorded with (plain_*: gt::)
        _reports[name] = phasemem.analyze(path)
    return _reports[name]


def gallery() -> None:
    folder = OUT / "gallery"
    folder.mkdir(parents=True, exist_ok=True)
    for name, (fixture, options) in GALLERY.items():
        path = folder / f"{name}.png"
        render.save(report_of(fixture), path, **options)
        print(f"wrote {path.relative_to(ROOT)}")


def patterns() -> None:
    folder = OUT / "patterns"
    folder.mkdir(parents=True, exist_ok=True)
    for kind, (fixture, step, phase) in PATTERNS.items():
        report = report_of(fixture)
        found = report.patterns_of(kind)
        if not found:
            print(f"no {kind} in {fixture}: skipped", file=sys.stderr)
            continue
        p = next((q for q in found if report.steps[q.step].number == step and q.phase == phase), found[0])
        # Context on both sides: half the pattern's length, at least 60 events.
        margin = max(60, (p.end_event - p.start_event + 1) // 2)
        a, b = max(p.start_event - margin, 0), min(p.end_event + 1 + margin, report.n_events)
        # Only this occurrence of its kind, so that it is the one called out in full.
        focused = dataclasses.replace(report, patterns=[q for q in report.patterns if q.kind != kind or q is p])
        fig = render.plot(focused, events=(a, b), size=(1100, 620))
        ax = fig.axes[0]
        # The pattern's own events, bracketed just under the phase strip.
        ax.annotate("", xy=(p.start_event, 0.9), xytext=(p.end_event + 1, 0.9), xycoords=ax.get_xaxis_transform(),
                    arrowprops=dict(arrowstyle="|-|", color="#333333", lw=1.0, shrinkA=0, shrinkB=0,
                                    mutation_scale=4), zorder=10)
        path = folder / f"{kind}.png"
        fig.savefig(path, dpi=fig.dpi, facecolor="white")
        print(f"wrote {path.relative_to(ROOT)}  ({fixture}, step {report.steps[p.step].number}, "
              f"events {p.start_event}-{p.end_event}, shown {a}-{b - 1})")


def categories() -> None:
    """docs/categories.md: the run compared with torch.profiler's memory timeline, by category."""
    snap = ROOT / "benchmarks" / "results" / "profiler_compare_snapshot.pkl.xz"
    path = OUT / "categories_phasemem.png"
    render.save(phasemem.analyze(snap), path, color="category", size=(1400, 700))
    print(f"wrote {path.relative_to(ROOT)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=("gallery", "patterns", "categories"))
    args = ap.parse_args(argv)
    if args.only in (None, "gallery"):
        gallery()
    if args.only in (None, "patterns"):
        patterns()
    if args.only in (None, "categories"):
        categories()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
