"""``color="stack"``: a call site's colour follows its frames, so one trace gets one picture whichever
reader numbered its stacks."""
from __future__ import annotations

import numpy as np
import pytest

import phasemem
from helpers.paths import ROOT
from helpers.snapshots import load_snapshot
from phasemem.reporters.picture import colours

FIXTURES = ROOT / "fixtures"


def _pixels(report, **options) -> np.ndarray:
    fig = report.plot(size=(900, 500), **options)
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


@pytest.mark.parametrize("name", ["resnet_sgd", "gpt_compiled"])
def test_stack_colours_do_not_depend_on_the_reader(name):
    """The path goes through the batched reader, the dict through ``Trace.from_snapshot``: they number
    the stacks differently (checked here, or the test would prove nothing), yet the pictures agree."""
    path = FIXTURES / f"{name}.pkl.xz"
    by_path = phasemem.analyze(path)
    by_dict = phasemem.analyze(load_snapshot(path))
    assert not np.array_equal(by_path.analysis.trace.stack, by_dict.analysis.trace.stack)
    assert by_path.n_events == by_dict.n_events
    assert np.array_equal(_pixels(by_path, color="stack"), _pixels(by_dict, color="stack"))


def test_a_site_has_one_colour_whatever_its_id():
    """Every drawn band's colour is its stack's frames' colour: bands of one site share it, and the
    sites' colours do not move when the stack ids are renumbered (reversed here)."""
    report = phasemem.analyze(FIXTURES / "resnet_sgd.pkl.xz")
    fig = report.plot(color="stack")
    st = fig.phasemem_stack
    rgb, _ = colours._stack_colors(report, st)
    trace = report.analysis.trace
    n = len(trace.stacks)
    trace.stacks = trace.stacks[::-1]
    trace.stack = np.where(trace.stack >= 0, n - 1 - trace.stack, -1).astype(trace.stack.dtype)
    rgb2, _ = colours._stack_colors(report, st)
    assert np.array_equal(rgb, rgb2)
