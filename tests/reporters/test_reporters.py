"""The reporters (phasemem.reporters): siblings behind one protocol, registered when phasemem is
imported, and reached from the report types (``print``, ``to_json``, ``save_png``) without any
module below them importing a reporter (issue 42: "Report as data").

The JSON is checked against ``to_dict()`` serialised here, the pictures by their file signature and
against the file ``save_png`` writes; the import rules by reading every module's imports (those inside
functions too) from its source.
"""
from __future__ import annotations

import ast
import json
import lzma
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import phasemem
from helpers.paths import ROOT
from phasemem.distributed.run_report import RunReport, summarize
from phasemem.report.comparison import Comparison
from phasemem.report.registry import drawer, reporter
from phasemem.report.report import Report
from phasemem.reporters import REPORTERS

PACKAGE = ROOT / "phasemem"
A = ROOT / "fixtures" / "gpt_foreach.pkl.xz"
B = ROOT / "fixtures" / "gpt_ckpt_fused.pkl.xz"
PNG = b"\x89PNG\r\n\x1a\n"
#: The deprecated views of ``report.analysis`` kept on Report, and what each stands for.
VIEWS = {"trace": "trace", "timeline": "timeline", "segmentation": "segmentation",
         "category_curves": "categories", "label_codes": "labels", "step_of": "step_of"}


@pytest.fixture(scope="module")
def report():
    return phasemem.analyze(A)


@pytest.fixture(scope="module")
def data(report):
    """One of each report type: a Report, a Comparison, a RunReport."""
    return [report, phasemem.compare(A, B), RunReport.of([summarize(report, rank=0)])]


def test_every_reporter_answers_the_protocol(data):
    assert sorted(r.name for r in REPORTERS) == ["html", "json", "memory_viz", "picture", "text"]
    for r in REPORTERS:
        assert r.suffixes and all(s.startswith(".") and s == s.lower() for s in r.suffixes), r.name
        assert r.takes and set(r.takes) <= {Report, Comparison, RunReport}, r.name
        assert callable(r.render) and callable(r.writer), r.name
        for d in data:
            if isinstance(d, r.takes):
                assert reporter(r.name, d) is r
            else:
                with pytest.raises(LookupError, match=f"no '{r.name}' reporter takes a {type(d).__name__}"):
                    reporter(r.name, d)


def test_each_report_type_is_written_through_its_reporters(data, tmp_path):
    for d in data:
        assert str(d) == reporter("text", d).render(d) and str(d).startswith("phasemem ")
        text = reporter("json", d).render(d)
        assert text == json.dumps(d.to_dict(), indent=1)
        d.to_json(tmp_path / "x.json")
        assert (tmp_path / "x.json").read_text() == text
        png = reporter("picture", d).render(d, size=(800, 450))
        assert png.startswith(PNG)
        d.save_png(tmp_path / "x.png", size=(800, 450))
        assert (tmp_path / "x.png").read_bytes() == png, type(d).__name__


def test_a_reports_text_and_extra_json_keys(report):
    assert report.text(full=True) == reporter("text", report).render(report, full=True) != str(report)
    extra = json.loads(reporter("json", report).render(report, extra={"budgets": ["ok"]}))
    assert extra["budgets"] == ["ok"] and extra["peak_bytes"] == report.peak_bytes


def test_the_page_is_the_html_reporters_and_only_a_reports(data, tmp_path):
    report, comparison, run = data
    assert drawer(report, "x.HTML").name == "html" and drawer(report, "x.svg").name == "picture"
    report.save_png(tmp_path / "r.html")
    assert (tmp_path / "r.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    for d in (comparison, run):  # no page of theirs: the picture's reporter says what it draws
        assert drawer(d, "x.html").name == "picture"
        with pytest.raises(phasemem.PhasememError, match="cannot draw this format"):
            d.save_png(tmp_path / "d.html")
        assert not (tmp_path / "d.html").exists()


def test_the_memory_viz_reporter_labels_the_snapshot_it_is_given(report):
    snap = pickle.loads(lzma.decompress(A.read_bytes()))
    snap = snap.get("snapshot", snap)
    labelled = pickle.loads(reporter("memory_viz", report).render(report, snapshot=snap))
    events = labelled["device_traces"][0]
    assert len(events) == len(snap["device_traces"][0]) == report.n_events
    assert {e["category"] for e in events if "category" in e} <= {*phasemem.vocab.CATEGORIES, "unknown"}
    allocs = [e for e in events if e["action"] == "alloc"]
    assert allocs and all("category" in e for e in allocs)  # every allocation the trace made is labelled,
    assert all(e["action"] in ("alloc", "free_requested", "free_completed") for e in events if "category" in e)  # and only those and frees


@pytest.mark.parametrize("name", list(VIEWS))
def test_an_older_view_warns_and_names_its_replacement(report, name):
    with pytest.warns(DeprecationWarning, match=rf"Report\.{name} is deprecated; use report\.analysis\.{VIEWS[name]}$"):
        got = getattr(report, name)
    assert got is getattr(report.analysis, VIEWS[name])


def test_what_fits_without_history_says_so_in_two_clauses():
    blocks = [{"address": 0, "size": 1 << 20, "requested_size": 1 << 20, "state": "active_allocated", "frames": []}]
    snap = {"segments": [{"device": 0, "address": 0, "total_size": 2 << 20, "stream": 0, "blocks": blocks}],
            "device_traces": [[]]}
    live = phasemem.analyze(snap)
    assert live.live is not None
    with pytest.raises(phasemem.PhasememError, match=r"this report has none; record one with torch"):
        live.fits("80GiB")
    with pytest.raises(phasemem.PhasememError, match=r"this report has none; record one with torch"):
        live.plan("ddp", ranks=2)


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at its top or inside a function, relative imports resolved."""
    package = path.relative_to(ROOT).parent.parts  # an __init__.py's too: its relative imports start there
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = list(package[:len(package) - node.level + 1]) if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out |= ({mod} if node.module else set()) | {f"{mod}.{a.name}" for a in node.names}
    return out


#: The floors the data flows up through, each importing only from those before it (and from the basics
#: at phasemem/'s top); capture, beside them, imports none: its report is added in phasemem/run.py.
FLOORS = ["read", "analysis", "predictions", "report", "distributed", "reporters", "commands"]
ABOVE_ALL = ["run", "integrations"]


@pytest.mark.parametrize("floor", ["capture", *FLOORS[:-1]])
def test_no_floor_imports_one_above_it(floor):
    """Function-level imports count: the report types reach the reporters through report/registry.py
    alone, never by importing one (issue 42), and nothing is imported by a name in a string."""
    above = FLOORS + ABOVE_ALL if floor == "capture" else FLOORS[FLOORS.index(floor) + 1:] + ABOVE_ALL
    above = tuple(f"phasemem.{f}" for f in above)
    for path in sorted((PACKAGE / floor).rglob("*.py")):
        wrong = sorted(m for m in _imports(path) if m == "phasemem" or m.startswith(above))
        assert not wrong, f"{path.relative_to(ROOT)} imports {wrong}"
        # the one exception: the shape kinds' package collects its own modules (a new kind is one new file)
        assert "import_module" not in path.read_text() or path == PACKAGE / "analysis/patterns/__init__.py", path


def test_import_phasemem_registers_every_reporter_and_loads_no_matplotlib():
    code = ("import sys, phasemem; from phasemem.report.registry import _REGISTERED; "
            "print(sorted(r.name for r in _REGISTERED), 'matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split("] ")[1].strip() == "False"
    assert out.stdout.startswith("['html', 'json', 'memory_viz', 'picture', 'text']")
