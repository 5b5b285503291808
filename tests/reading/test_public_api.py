"""The public API: every name in ``phasemem.__all__`` imports and is documented (README.md or a page of
docs/ other than design.md, which only lists them), and importing phasemem and all of it but
``instrument`` loads neither torch nor matplotlib."""
from __future__ import annotations

import re
import subprocess
import sys

import phasemem
from helpers.paths import ROOT


def test_every_public_name_imports():
    assert len(set(phasemem.__all__)) == len(phasemem.__all__)
    for name in phasemem.__all__:
        assert getattr(phasemem, name) is not None, name
        assert name in dir(phasemem), name
    assert {"Report", "Step", "Phase", "Pattern", "WhatIf", "Fits", "Plan", "OutOfMemory", "PeakBreakdown",
            "Comparison", "RunReport", "PhasememError", "analyze", "compare", "instrument"} <= set(phasemem.__all__)


def test_every_public_name_is_documented():
    pages = [ROOT / "README.md"] + [p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "design.md"]
    text = "\n".join(p.read_text() for p in pages)
    undocumented = [n for n in phasemem.__all__ if not re.search(rf"`(phasemem\.)?{n}[`(]", text)]
    assert not undocumented, f"say what each is in README.md's public API table: {undocumented}"


def test_the_public_names_but_instrument_load_neither_torch_nor_matplotlib():
    code = ("import sys, phasemem; [getattr(phasemem, n) for n in phasemem.__all__ if n != 'instrument']; "
            "print('torch' in sys.modules, 'matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
