"""The README's Python example runs as written, on a plain ``nn.Module`` on the CPU (issue 40: it
assumed the model returns ``.loss``): the code block under "## Use" is taken from README.md and run with
a tiny classifier, its optimizer and a batch in place of the reader's own."""
from __future__ import annotations

import json
import re

import pytest

from helpers.paths import ROOT

README = ROOT / "README.md"


def _use_example() -> str:
    text = README.read_text()
    use = text[text.index("\n## Use\n"):]
    return re.search(r"```python\n(.*?)```", use, re.S).group(1)


def test_the_readme_example_runs_on_a_plain_module(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    code = _use_example()
    assert "instrument(model, opt)" in code and "report.to_json" in code  # the block meant, not another
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    assert not hasattr(model(torch.randn(2, 32)), "loss")  # what a plain module returns: a tensor
    scope = {"model": model, "opt": torch.optim.AdamW(model.parameters()), "x": torch.randn(16, 32),
             "y": torch.randint(0, 10, (16,))}
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(README), "exec"), scope)
    report = scope["report"]
    assert len(report.steps) == 3 and {"forward", "backward", "optimizer"} <= set(report.phases)
    assert (tmp_path / "memory.png").stat().st_size > 0
    assert json.loads((tmp_path / "memory.json").read_text())["peak_bytes"] == report.peak_bytes
