"""The command line's words: a wrong flag is answered by its subcommand with the nearest right one,
--full prints the whole report, and the accuracy --fits claims is the one the README claims and the
real runs of docs/what-if.md show."""
import re
import sys

import pytest

import phasemem
from helpers.paths import ROOT
from phasemem.commands.cli import main

FOREACH = ROOT / "fixtures" / "gpt_foreach.pkl.xz"


@pytest.mark.parametrize("argv,usage,hint", [
    (["analyze", "--jsn", "x.json", "s.pickle"], "usage: phasemem analyze", "did you mean --json?"),
    (["analyze", "s.pickle", "--jsn=x.json"], "usage: phasemem analyze", "did you mean --json?"),
    (["analyze", "s.pickle", "--what_if"], "usage: phasemem analyze", "did you mean --what-if?"),
    (["diff", "a", "b", "--fial-if", "peak>1GiB"], "usage: phasemem diff", "did you mean --fail-if?"),
    (["analyze", "s.pickle", "--color", "categry"], "usage: phasemem analyze", "did you mean category?"),
    (["analyse", "s.pickle"], "usage: phasemem [-h]", "did you mean analyze?"),
])
def test_a_wrong_flag_gets_its_commands_usage_and_the_nearest_flag(argv, usage, hint, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(usage) and err.rstrip().endswith(hint) and "Traceback" not in err


def test_a_flag_near_nothing_suggests_nothing(capsys):
    assert main(["analyze", "s.pickle", "--zzzzzz"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: phasemem analyze") and "unrecognized argument: --zzzzzz" in err
    assert "did you mean" not in err


def test_full_prints_every_step_and_shape(tmp_path, capsys):
    r = phasemem.analyze(FOREACH)
    assert main(["analyze", str(FOREACH), "-o", str(tmp_path / "m.png")]) == 0
    short = capsys.readouterr().out
    assert main(["analyze", str(FOREACH), "-o", str(tmp_path / "m.png"), "--full"]) == 0
    full = capsys.readouterr().out
    assert short.startswith(str(r)) and full.startswith(r.text(full=True))
    assert "shapes found" in full and "shapes found" not in short
    for s in r.steps:  # every step's table rows in the full one
        assert len(re.findall(rf"^ +{s.number} \w+ ", full, re.M)) == len([p for p in s.phases.values()])


def test_the_accuracy_fits_claims_is_the_readmes_and_the_runs():
    from phasemem.predictions.fits.search import CHECKED_ERROR

    sys.path.insert(0, str(ROOT / "docs"))
    from eval_whatif import rows

    errors = [abs(r["error"]) for r in rows() if r["error"] is not None]
    assert len(errors) >= 50 and max(errors) <= CHECKED_ERROR
    said = f"within {CHECKED_ERROR * 100:.0f} %"
    assert said in (ROOT / "README.md").read_text()
    assert said in (ROOT / "docs" / "what-if.md").read_text()
    fit = phasemem.analyze(FOREACH).fits("80GiB")
    assert f"predictions were {said} of real runs" in str(fit)
    assert not re.search(r"within (?!%d )\d+ ?%%" % round(CHECKED_ERROR * 100), str(fit))
