"""One record per shape kind (issue 42): every kind declares every field beside its detector, every
module of analysis/patterns/ declares its kinds or serves one that does, and a new module is all a
new kind needs (discovered, listed in its place, its detector run)."""
from __future__ import annotations

import ast
import dataclasses
import inspect
import pkgutil
import sys
from pathlib import Path

import pytest

import phasemem
from helpers.paths import ROOT
from phasemem.analysis import patterns
from phasemem.analysis.patterns import BY_NAME, KIND_NAMES, KINDS, SHAPE_PRIORITY, ShapeKind, discover
from phasemem.vocab import PHASES

PACKAGE = Path(patterns.__file__).parent


def test_every_kind_has_every_field():
    """No field left out or empty: a kind without a marker, a colour, a size label or its place fails
    here (before the records, a forgotten marker fell back to "o" and a forgotten priority dropped the
    kind from peak.by_shape, and no test said so). A priority is None only by choice."""
    from matplotlib.colors import is_color_like
    from matplotlib.markers import MarkerStyle

    assert KINDS and all(isinstance(k, ShapeKind) for k in KINDS)
    for k in KINDS:
        for f in dataclasses.fields(k):
            assert getattr(k, f.name) is not None or f.name == "priority", (k.name, f.name)
        assert k.name.isidentifier() and k.name == k.name.lower(), k.name
        assert isinstance(k.per_step, bool)
        assert len(inspect.signature(k.detector).parameters) == (2 if k.per_step else 1), k.name
        assert MarkerStyle(k.marker).is_filled(), k.name  # drawn white with an edge: an unfilled one has no face
        assert is_color_like(k.colour), k.name
        assert k.priority is None or isinstance(k.priority, int), k.name
        assert isinstance(k.order, int), k.name
        assert isinstance(k.bytes_are({}), str) and k.bytes_are({}), k.name
        assert k.explanation.strip() and "\n" not in k.explanation and k.explanation.endswith("."), k.name
    for field in ("name", "marker", "order"):
        values = [getattr(k, field) for k in KINDS]
        assert len(set(values)) == len(values), field
    ranked = [k.priority for k in KINDS if k.priority is not None]
    assert len(set(ranked)) == len(ranked)


def test_the_tables_read_from_the_records_are_those_of_before():
    """The listing order, which shape claims a block first, the kinds that claim none, and the labels of
    a shape's own figure, as the report's text and the picture have said them since issue 40."""
    assert KIND_NAMES == ("logits", "softmax_spike", "logits_release", "checkpoint_recompute", "forward_rerun",
                          "gradients", "gradient_accumulation", "optimizer_state_init", "optimizer_temporaries",
                          "amp_unscale", "grad_clip", "workspace", "leak")
    assert SHAPE_PRIORITY == ("logits", "softmax_spike", "logits_release", "optimizer_temporaries",
                              "optimizer_state_init", "checkpoint_recompute", "forward_rerun", "gradients",
                              "gradient_accumulation", "workspace", "leak")
    assert {k.name for k in KINDS if k.priority is None} == {"amp_unscale", "grad_clip"}
    assert patterns.shape_size_label("gradients", {"release": True}) == "freed at once"
    assert patterns.shape_size_label("gradients", {"in_backward": True}) == "most at once"
    assert patterns.shape_size_label("checkpoint_recompute", {"evidence": "rng_replay"}) == "per region"
    assert patterns.shape_size_label("checkpoint_recompute", {"evidence": "frames"}) == "per layer"
    assert patterns.shape_size_label("no_such_kind") == "its size"


def _imported_here(path: Path) -> set[str]:
    """The modules of this package that ``path`` imports (``from .x import ...``)."""
    tree = ast.parse(path.read_text())
    return {n.module.split(".")[0] for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module}


def test_every_detector_module_declares_its_kinds():
    """A module of patterns/ declares KINDS, its detectors' own records, or is a helper that one that
    does imports (logits_regions, recompute_frames, shape_kind): a detector written without its record
    would never run, and this says so."""
    modules = [m.name for m in pkgutil.iter_modules([str(PACKAGE)])]
    declaring = {name: getattr(__import__(f"{patterns.__name__}.{name}", fromlist=["_"]), "KINDS", None)
                 for name in modules}
    helpers = set().union(*(_imported_here(PACKAGE / f"{name}.py") for name, kinds in declaring.items() if kinds))
    for name, kinds in declaring.items():
        if kinds is None:
            assert name in helpers, f"patterns/{name}.py declares no KINDS and no detector module imports it"
            continue
        assert kinds and all(isinstance(k, ShapeKind) for k in kinds), name
        for k in kinds:  # declared beside the detector that finds it
            assert k.detector.__module__ == f"{patterns.__name__}.{name}", (name, k.name)
    assert {k.name for ks in declaring.values() if ks for k in ks} == set(KIND_NAMES)


def test_every_kind_is_documented():
    text = (ROOT / "docs" / "patterns.md").read_text()
    assert [k for k in KIND_NAMES if f"## `{k}`" not in text] == []


TOY = '''
from phasemem.analysis.patterns.shape_kind import INK, ShapeKind
from phasemem.model import Pattern


def detect(ctx, step):
    s0, s1, _ = ctx.seg.steps[step]
    return [Pattern(kind="toy_blob", step=step, phase="other", start_event=s0, end_event=s1 - 1, peak_event=s0,
                    bytes=int(ctx.level[s0]), explanation="A toy.")]


KINDS = (ShapeKind("toy_blob", detect, per_step=True, marker="o", colour=INK, priority=None, size_label="a toy's",
                   explanation="A toy kind: a new module is all a kind needs.", order=55),)
'''


def test_a_new_kind_is_one_new_module(tmp_path, monkeypatch):
    """A module with a ShapeKind and its detector, dropped into the package's path, is discovered,
    listed in its place, and its detector runs beside the others, which find what they found before."""
    (tmp_path / "toy_blob.py").write_text(TOY)
    monkeypatch.setattr(patterns, "__path__", [*patterns.__path__, str(tmp_path)])
    try:
        kinds = discover(patterns.__name__)
        names = [k.name for k in kinds]
        assert names == [*KIND_NAMES[:5], "toy_blob", *KIND_NAMES[5:]]  # order 55: after forward_rerun
        assert kinds[5].bytes_are() == "a toy's"
        report = phasemem.analyze(ROOT / "fixtures" / "mlp_fp16_scaler.pkl.xz")
        ctx = report.analysis.facts
        found = patterns.detect(ctx, kinds)
        toys = [p for p in found if p.kind == "toy_blob"]
        assert [p.step for p in toys] == list(range(len(ctx.seg.steps))) and toys
        assert all(p.phase == PHASES[int(ctx.seg.labels[p.start_event])] for p in toys)  # placed as every shape
        rest = [p for p in found if p.kind != "toy_blob"]
        assert [(p.kind, p.start_event, p.bytes) for p in rest] == \
            [(p.kind, p.start_event, p.bytes) for p in patterns.detect(ctx)]
    finally:
        sys.modules.pop(f"{patterns.__name__}.toy_blob", None)


def test_records_are_what_the_picture_draws():
    """The picture's marks are the records' (a kind's marker, edged in its colour)."""
    pytest.importorskip("matplotlib")
    report = phasemem.analyze(ROOT / "fixtures" / "mlp_fp16_scaler.pkl.xz")
    fig = report.plot()
    marks = [c for ax in fig.axes for c in ax.collections if c.get_gid() == "pattern-marker"]
    assert marks
    for c in marks:
        k = BY_NAME[c.get_label()]
        assert tuple(c.get_edgecolor()[0][:3]) == pytest.approx(tuple(int(k.colour[i:i + 2], 16) / 255
                                                                      for i in (1, 3, 5)))
