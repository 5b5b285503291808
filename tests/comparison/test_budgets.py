"""Budgets (--fail-if, the pytest marker): every form the issue names parses to what it says; anything
else is a PhasememError naming the problem, never a pass; checked against numbers read off the raw
trace (a replay of its events) and the recording's own meta (the logits' size)."""
from __future__ import annotations

from pathlib import Path

import pytest

import phasemem
from helpers import reference
from helpers.paths import FIXTURES
from helpers.snapshots import read as raw
from phasemem.commands.cli import main
from phasemem.report.budgets import budget_for, check_comparison, check_report, parse_budget, parse_budgets, parse_size

FIX = FIXTURES
FOREACH, KEEP, END = FIX / "gpt_foreach.pkl.xz", FIX / "gpt_zero_grad_keep.pkl.xz", FIX / "gpt_zero_grad_end.pkl.xz"
GiB, MiB = 2**30, 2**20



@pytest.mark.parametrize("text, target, name, limit, relative, percent", [
    ("peak>+5%", "peak", "peak", 5, True, True),
    ("backward.peak>+512MiB", "phase", "backward", 512 * MiB, True, False),
    ("peak>20GiB", "peak", "peak", 20 * GiB, False, False),
    ("optimizer.peak>6GiB", "phase", "optimizer", 6 * GiB, False, False),
    ("activation>3GiB", "category", "activation", 3 * GiB, False, False),
    ("logits>1GiB", "shape", "logits", GiB, False, False),
    ("  peak >= 1.5 GiB ", "peak", "peak", 1.5 * GiB, False, False),
    ("peak>-10%", "peak", "peak", -10, True, True),
    ("peak>5%", "peak", "peak", 5, True, True),
    ("optimizer_state>2GB", "category", "optimizer_state", 2e9, False, False),
    ("other.peak>1KiB", "phase", "other", 1024, False, False),
    ("other>1KiB", "category", "other", 1024, False, False),
    ("softmax_spike>3e9", "shape", "softmax_spike", 3e9, False, False),
])
def test_every_form_parses_to_what_it_says(text, target, name, limit, relative, percent):
    b = parse_budget(text)
    assert (b.target, b.name, b.limit, b.relative, b.percent) == (target, name, limit, relative, percent)


@pytest.mark.parametrize("text, says", [
    ("peak", "does not parse"), ("peak>", "not a size"), ("peak>>5%", "not a size"), ("peak=5GiB", "does not parse"),
    ("peak>5 %%", "not a size"), ("peak>2G", "unknown unit"), ("peak>2 gigs", "unknown unit"),
    ("forward>1GiB", "write forward.peak"), ("forwrd.peak>1GiB", "no phase 'forwrd'"),
    ("backward.size>1GiB", "'.size'"), ("logit>1GiB", "no phase, category or shape"),
    ("peak>1e999GiB", "not a finite number"), ("", "does not parse"), ("peak>nan", "not a size"),
])
def test_anything_else_is_a_clear_error(text, says):
    with pytest.raises(phasemem.PhasememError, match=None) as e:
        parse_budget(text)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_sizes():
    assert parse_size("1.5 GiB") == 3 * 2**29
    assert parse_size("2GB") == 2_000_000_000 and parse_size("512MiB") == 2**29 and parse_size(4096) == 4096
    assert parse_size("100") == 100
    for bad in ("+1GiB", "5%", "-3", "lots", -1):
        with pytest.raises(phasemem.PhasememError):
            parse_size(bad)


def test_keywords_as_the_marker_takes_them():
    assert budget_for("peak", "2 GiB").target == "peak"
    assert (budget_for("backward", "1.5 GiB").target, budget_for("backward", "1.5 GiB").limit) == ("phase", 1.5 * GiB)
    assert budget_for("activation", 3 * GiB).target == "category"
    assert budget_for("logits", "1 GiB").target == "shape"
    assert budget_for("other", "1 GiB").target == "category"  # a bare name is the category, as on the CLI
    with pytest.raises(phasemem.PhasememError, match="backwards"):
        budget_for("backwards", "1 GiB")
    with pytest.raises(phasemem.PhasememError, match="size"):
        budget_for("peak", "+5%")


def test_one_run_has_no_base_for_a_relative_budget():
    with pytest.raises(phasemem.PhasememError, match="relative to a base run"):
        parse_budgets(["peak>20GiB", "peak>+5%"], absolute=True)


# -- checked on one run -------------------------------------------------------------------------------


def replayed(path: Path):
    snap = raw(path)
    events = snap["device_traces"][0]
    _, after, deltas = reference.replay(events, snap["segments"])
    level = [max(a, a - d) for a, d in zip(after, deltas)]
    labels = reference.label_events(events, reference.intervals(snap["external_annotations"], "phasemem::"))
    return snap, level, labels


def test_budgets_on_one_run_against_the_replayed_trace():
    snap, level, labels = replayed(FOREACH)
    peak = max(level)
    optimizer = max(v for v, ph in zip(level, labels) if ph == "optimizer")
    meta = snap["phasemem"]["meta"]
    logits = meta["vocab"] * meta["batch"] * meta["seq"] * 4  # fp32 logits of the whole batch
    r = phasemem.analyze(FOREACH)

    def broken(*texts):
        return [line.split(":")[1].strip() for line in check_report([parse_budget(t) for t in texts], r)]

    assert broken(f"peak>{peak - 1}", f"peak>{peak}", f"peak>={peak}") == [f"peak>{peak - 1}", f"peak>={peak}"]
    assert broken(f"optimizer.peak>{optimizer - 1}", f"optimizer.peak>{optimizer}") == [f"optimizer.peak>{optimizer - 1}"]
    assert broken(f"logits>{logits - 1}", f"logits>{logits}") == [f"logits>{logits - 1}"]
    assert broken("leak>0", "amp_unscale>0") == []  # shapes this run does not have are 0 bytes
    assert broken("peak<1GiB") == []
    line = check_report([parse_budget("peak>1GiB")], r)[0]
    assert "backward" in line and "step 1" in line  # which phase (and step) holds the peak


def test_a_phase_the_run_lacks_cannot_pass():
    r = phasemem.analyze(FIX / "gpt_inference.pkl.xz")
    assert "optimizer" not in r.phases
    with pytest.raises(phasemem.PhasememError, match="no optimizer phase"):
        check_report([parse_budget("optimizer.peak>6GiB")], r)


def test_analyze_fail_if_exits_1_after_writing(tmp_path, capsys):
    png, js = tmp_path / "m.png", tmp_path / "m.json"
    rc = main(["analyze", str(FOREACH), "-o", str(png), "--json", str(js),
               "--fail-if", "peak>1GiB", "--fail-if", "peak>20GiB", "--fail-if", "optimizer.peak>1GiB"])
    err = capsys.readouterr().err.splitlines()
    assert rc == 1 and png.exists() and js.exists()
    assert [e.split(":")[2].strip() for e in err] == ["peak>1GiB", "optimizer.peak>1GiB"]
    assert main(["analyze", str(FOREACH), "-o", str(png), "--fail-if", "peak>20GiB"]) == 0


@pytest.mark.parametrize("budget", ["peak>+5%", "peak>>1", "forward.peak>x"])
def test_analyze_fail_if_that_cannot_be_checked_is_one_line_exit_2(budget, tmp_path, capsys):
    png = tmp_path / "m.png"
    assert main(["analyze", str(FOREACH), "-o", str(png), "--fail-if", budget]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("phasemem: error: budget") and out == ""
    assert not png.exists()


# -- checked on two runs ------------------------------------------------------------------------------


def test_budgets_against_a_base_run():
    c = phasemem.compare(END, KEEP)
    grow = c.b.peak_bytes - c.a.peak_bytes
    share = 100.0 * grow / c.a.peak_bytes
    assert grow > 0

    def broken(*texts):
        return [line.split(": ")[1] for line in check_comparison([parse_budget(t) for t in texts], c)]

    assert broken(f"peak>+{share - 0.01:.2f}%", f"peak>+{share + 0.01:.2f}%") == [f"peak>+{share - 0.01:.2f}%"]
    assert broken(f"peak>+{grow - 1}B", f"peak>+{grow}B") == [f"peak>+{grow - 1}B"]
    assert broken(f"peak>{c.b.peak_bytes - 1}") == [f"peak>{c.b.peak_bytes - 1}"]  # absolute: on B
    assert broken("zero_grad.peak>+1B", "optimizer.peak>+1B") == []
    # the gradients at the peak: none in A, all of them in B (a percentage of nothing is infinite)
    assert broken("gradient>+1000%", "gradient>+100MiB") == ["gradient>+1000%", "gradient>+100MiB"]
    assert broken("peak<0%") == []
