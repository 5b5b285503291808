"""The pytest plugin: @pytest.mark.phasemem_limit(...) records a test's body (here the CPU path, this
machine has no GPU), fails it when a budget is broken, naming the phase and the shape, and writes the
picture, the report and the snapshot beside the test's report; plain code and instrument() both work."""
from __future__ import annotations

import json
import sys
from importlib.metadata import entry_points

import pytest
import tomllib

from helpers.paths import ROOT

pytest_plugins = ["pytester"]
# Runs that record import torch in a subprocess: pytester's in-process runs drop the modules a run
# imported, and torch cannot be imported a second time in one process.

MiB = 2**20


def _plugin_args() -> list[str]:
    # Installed, the entry point loads the plugin in every pytest run; from a bare checkout, name it.
    installed = any(e.value == "phasemem.integrations.pytest_plugin" for e in entry_points(group="pytest11"))
    return [] if installed else ["-p", "phasemem.integrations.pytest_plugin"]


def run(pytester, source: str, *args: str):
    pytester.makepyfile(test_it=source)
    return pytester.runpytest(*_plugin_args(), "-p", "no:cacheprovider", *args)


def test_the_plugin_is_declared_as_a_pytest11_entry_point():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["pytest11"]["phasemem"] == "phasemem.integrations.pytest_plugin"
    assert not any("pytest" in d for d in meta["project"]["dependencies"])  # no new dependency


SCENARIOS = """
import pytest, torch
from phasemem import instrument


def allocate():
    blocks = [torch.ones(4 * 2**20) for _ in range(8)]   # 8 x 16 MiB float32, all alive at once
    del blocks


@pytest.mark.phasemem_limit(peak="64 MiB")
def test_plain_over():
    allocate()


@pytest.mark.phasemem_limit(peak="256 MiB")
def test_plain_within():
    allocate()


def train(steps=3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    opt = torch.optim.AdamW(model.parameters())
    with instrument(model, opt):
        for _ in range(steps):
            loss = model(torch.randn(512, 256)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()


@pytest.mark.phasemem_limit(backward="1 MiB", peak="1 GiB")
def test_instrumented_over():
    train()


@pytest.mark.phasemem_limit(backward="1 GiB")
def test_instrumented_within():
    train()


@pytest.mark.phasemem_limit(optimizer="1 GiB")
def test_phase_never_ran():
    torch.ones(1000)


@pytest.mark.phasemem_limit(peak="1 B")
def test_body_fails():
    assert 1 == 2, "the test itself"
"""


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    """One pytest run (a subprocess: torch imports once per process) of every scenario; per test, its
    outcome, its message and its junit properties."""
    pytest.importorskip("torch")  # the scenarios record torch tensors
    import subprocess
    import xml.etree.ElementTree as ET

    where = tmp_path_factory.mktemp("scenarios")
    (where / "test_it.py").write_text(SCENARIOS)
    done = subprocess.run([sys.executable, "-m", "pytest", *_plugin_args(), "-p", "no:cacheprovider", "-q",
                           "--junitxml=reports/junit.xml", "test_it.py"], cwd=where, capture_output=True, text=True,
                          timeout=600)
    out = {}
    for case in ET.parse(where / "reports" / "junit.xml").getroot().iter("testcase"):
        failure = case.find("failure")
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        out[case.get("name")] = ("failed" if failure is not None else "passed",
                                 (failure.get("message", "") + (failure.text or "")) if failure is not None else "",
                                 props)
    return where, out, done.stdout


def test_plain_code_over_its_budget_fails_with_the_picture_written(scenarios):
    where, out, _ = scenarios
    outcome, message, props = out["test_plain_over"]
    assert outcome == "failed"
    # 128 MiB alive at once: 8 blocks of 4 Mi float32
    assert "phasemem_limit: over budget: peak=64 MiB: peak 128.0 MiB (limit 64.00 MiB)" in message
    # beside the junit report, as no --phasemem-dir was given
    png, js, snap = (where / "reports" / f"test_it.py_test_plain_over{s}" for s in (".png", ".json", ".pkl.xz"))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and snap.exists()
    assert json.loads(js.read_text())["peak_bytes"] == 128 * MiB
    assert props["phasemem_picture"] == str(png) and f"picture {png}" in message


def test_plain_code_within_its_budget_passes(scenarios):
    where, out, _ = scenarios
    assert out["test_plain_within"][0] == "passed"
    assert not (where / "reports" / "test_it.py_test_plain_within.png").exists()


def test_instrument_inside_the_test_names_the_phase_that_broke_the_budget(scenarios):
    outcome, message, _ = scenarios[1]["test_instrumented_over"]
    assert outcome == "failed"
    line = next(s for s in message.splitlines() if "over budget" in s).removeprefix("Failed: ")
    assert line.startswith("phasemem_limit: over budget: backward=1 MiB: backward peak ")
    assert " backward" in line.split("at step")[1]
    # the hidden layer's output (512 x 1024 float32 = 2 MiB) is alive into backward: the peak is above it
    assert float(line.split("backward peak ")[1].split(" MiB")[0]) > 2
    assert "the test's own instrument() block was measured" in message
    assert "peak=1 GiB" not in message


def test_instrument_inside_the_test_within_budget_passes(scenarios):
    assert scenarios[1]["test_instrumented_within"][0] == "passed"


def test_a_phase_the_test_never_ran_fails_rather_than_passes(scenarios):
    outcome, message, _ = scenarios[1]["test_phase_never_ran"]
    assert outcome == "failed" and "no optimizer phase" in message


def test_a_failing_body_is_reported_as_itself(scenarios):
    outcome, message, _ = scenarios[1]["test_body_fails"]
    assert outcome == "failed" and "the test itself" in message and "over budget" not in message


def test_phasemem_dir_chooses_the_folder(pytester):
    pytest.importorskip("torch")
    pytester.makepyfile(test_it="import pytest, torch\n\n@pytest.mark.phasemem_limit(peak='1 MiB')\n"
                                "def test_x():\n    torch.ones(2**20)\n")
    result = pytester.runpytest_subprocess(*_plugin_args(), "-p", "no:cacheprovider", "--phasemem-dir=pics")
    result.assert_outcomes(failed=1)
    assert (pytester.path / "pics" / "test_it.py_test_x.png").exists()


@pytest.mark.parametrize("marker, says", [
    ('peak="lots"', "give a size"),
    ('forwrd="1 GiB"', "no phase, category or shape"),
    ('"peak>+5%"', "relative to a base run"),
    ("", "give at least one budget"),
])
def test_a_budget_that_does_not_parse_fails_the_test(pytester, marker, says):
    result = run(pytester, f"import pytest\n\n@pytest.mark.phasemem_limit({marker})\ndef test_x():\n    pass\n")
    result.assert_outcomes(failed=1)
    assert says in result.stdout.str()


def test_the_marker_is_registered_and_loading_the_plugin_loads_no_torch(pytester):
    result = run(pytester, "def test_x():\n    pass\n", "--markers")
    assert any(s.startswith("@pytest.mark.phasemem_limit(") for s in result.stdout.lines)
    # pytest loads the plugin in every session: torch and matplotlib wait for a marked test
    code = "import sys, phasemem.integrations.pytest_plugin; print(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))"
    assert pytester.run(sys.executable, "-c", code).outlines[-1] == "[]"
