"""The README's quickstart and CI agree: ``.ci/run`` runs the README's test command as written, after the
checks the README names (ruff and mypy), so a reader who runs the quickstart runs what CI runs."""
from __future__ import annotations

import re

from helpers.paths import ROOT


def _quickstart_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Quickstart\n.*?```bash\n(.*?)```", text, re.S).group(1)
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_ci_runs_the_readmes_test_command_after_the_checks_it_names():
    demo, tests = _quickstart_commands()
    assert "phasemem demo" in demo
    install, run = tests.split(" && ")
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert install in ci and run in ci, "the README's test command, as written, in .ci/run"
    checks = "python3 -m ruff check phasemem tests && python3 -m mypy"
    assert checks in ci and ci.index(install) < ci.index(checks) < ci.index(run)
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert checks in readme, "the README names the checks CI runs"
