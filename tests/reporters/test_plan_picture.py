"""The plan picture (``phasemem plan``, render/plans.py) on real one-GPU traces recorded with instrument()
(fixtures/plans, docs/plans.md): the JSON's bars are ``report.plan``'s answers, the bars drawn are the
predicted peaks by category (read back from the matplotlib artists), the numbers over them are the fits,
the trace's own bar is its peak replayed from the raw events, and bad input is one line, exit 2."""
from __future__ import annotations

import json
import lzma
import math
import pickle
import re
import xml.etree.ElementTree as ET

import pytest

import phasemem
from helpers.paths import ROOT
from helpers.reference import replay  # noqa: E402
from phasemem.commands.cli import main
from phasemem.predictions.plans import PLANS
from phasemem.vocab import CATEGORIES

GPT = ROOT / "fixtures" / "plans" / "gpt__single_fp32__n1_r0__b4.pkl.xz"
VIT = ROOT / "fixtures" / "plans" / "vit__single_fp32__n1_r0__b32.pkl.xz"
INFERENCE = ROOT / "fixtures" / "gpt_inference.pkl.xz"  # no backward: no plan can tell the parameters
BUDGET = "24GiB"
RANKS = (1, 2, 4, 8, 16)


def _kw(name: str, param_dtype=None, keep=False, bucket_view=False) -> dict:
    """The settings the command gives each plan (as analyze --plan does)."""
    if name == "fsdp2":
        return {"param_dtype": param_dtype, "reshard_after_forward": not keep}
    if name in ("ddp", "zero1"):
        return {"bucket_view": bucket_view}
    return {}


def _plain(d):
    return json.loads(json.dumps(d))


@pytest.fixture(scope="module")
def gpt():
    return phasemem.analyze(str(GPT))


@pytest.fixture(scope="module")
def ran(tmp_path_factory, gpt):
    out = tmp_path_factory.mktemp("plan")
    png, js = out / "plan.png", out / "plan.json"
    assert main(["plan", str(GPT), "-o", str(png), "--json", str(js), "--batch", "4", "--budget", BUDGET]) == 0
    return png, json.loads(js.read_text())


def test_the_command_writes_the_picture_and_the_json(ran, capsys):
    png, data = ran
    from matplotlib.image import imread  # a test helper only

    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert imread(str(png)).shape[:2] == (900, 1600)
    assert data["budget_bytes"] == 24 << 30 and data["batch"] == 4 and data["ranks"] == list(RANKS)
    assert [(b["plan"]["plan"], b["plan"]["ranks"]) for b in data["bars"]] == [(p, n) for p in PLANS for n in RANKS]


def test_the_json_bars_are_report_plan_and_report_fits(ran, gpt):
    _, data = ran
    for bar in data["bars"]:
        name, n = bar["plan"]["plan"], bar["plan"]["ranks"]
        assert bar["plan"] == _plain(gpt.plan(name, n, **_kw(name)).to_dict()), (name, n)
        factor = gpt.fits(BUDGET, plan=name, ranks=n, **_kw(name)).batch.largest_factor
        assert bar["largest_factor"] == factor
        assert bar["largest_batch"] == math.floor(factor * 4 + 1e-9)
    # the trace as recorded: its peak replayed from the raw events, split by category
    raw = pickle.loads(lzma.decompress(GPT.read_bytes()))
    _, level, _ = replay(raw["device_traces"][0], raw["segments"])
    ref = data["reference"]
    assert ref["peak_bytes"] == max(level) and sum(ref["by_category"].values()) == max(level)
    assert ref["largest_factor"] == gpt.fits(BUDGET).batch.largest_factor


def test_settings_reach_the_plans_that_take_them(tmp_path, gpt, capsys):
    js = tmp_path / "p.json"
    assert main(["plan", str(GPT), "-o", str(tmp_path / "p.png"), "--json", str(js), "--ranks", "2,32,8",
                 "--param-dtype", "bf16", "--keep-unsharded", "--bucket-view", "--plan", "zero1,fsdp2"]) == 0
    data = json.loads(js.read_text())
    assert data["ranks"] == [2, 8, 32] and data["plans"] == ["zero1", "fsdp2"]
    for bar in data["bars"]:
        name, n = bar["plan"]["plan"], bar["plan"]["ranks"]
        kw = _kw(name, "bf16", True, True)
        assert bar["plan"] == _plain(gpt.plan(name, n, **kw).to_dict())
        assert bar["largest_batch"] is None  # no --batch: the factor only
    # bf16 gathers from an fp32 trace: the trace cannot tell the loss's upcast, two readings
    assert all(b["plan"]["predicted_peak_bytes_low"] for b in data["bars"] if b["plan"]["plan"] == "fsdp2")
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.strip().startswith("fsdp2"))
    p = gpt.plan("fsdp2", 8, **_kw("fsdp2", "bf16", True))
    assert f"-{phasemem.units.format_bytes(p.predicted_peak_bytes)}" in row


@pytest.fixture(scope="module")
def drawn(gpt):
    from phasemem.reporters.picture.plan_data import PlanPicture
    from phasemem.reporters.picture.plans import plot_plans

    pic = PlanPicture.of(gpt, 24 << 30, batch=4, param_dtype="bf16")
    return pic, plot_plans(pic)


def test_the_bars_drawn_are_the_predicted_peaks_by_category(drawn, gpt):
    pic, fig = drawn
    div = fig.phasemem_unit
    bars = [d for d in fig.phasemem_bars if d["plan"] != "trace"]
    assert [(d["plan"], d["ranks"]) for d in bars] == [(p, n) for p in PLANS for n in RANKS]
    xs = [d["x"] for d in fig.phasemem_bars]
    assert xs == sorted(xs) and len(set(xs)) == len(xs)
    for d in bars:
        p = gpt.plan(d["plan"], d["ranks"], **_kw(d["plan"], "bf16"))
        rects = [r for _, _, r in d["segments"]]
        assert all(r.axes is fig.phasemem_axes for r in rects)
        # stacked: each segment starts where the one below ends, from 0 to the predicted peak
        assert rects[0].get_y() == 0
        for a, b in zip(rects, rects[1:]):
            assert b.get_y() == pytest.approx(a.get_y() + a.get_height(), abs=1e-9)
        top = rects[-1].get_y() + rects[-1].get_height()
        assert top * div == pytest.approx(p.predicted_peak_bytes, rel=1e-9)
        for cat in CATEGORIES:
            h = sum(r.get_height() for c, _, r in d["segments"] if c == cat)
            assert h * div == pytest.approx(p.categories[cat], abs=1)
        for role, nbytes in p.wrapper.items():  # the wrapper's own buffers: hatched, inside their category
            own = [r for _, ro, r in d["segments"] if ro == role]
            assert own and all(r.get_hatch() for r in own)
            assert sum(r.get_height() for r in own) * div == pytest.approx(nbytes, abs=1)
        if p.predicted_peak_bytes_low is not None:
            assert d["low"].get_y() * div == pytest.approx(p.predicted_peak_bytes_low, abs=1)
            assert (d["low"].get_y() + d["low"].get_height()) * div == pytest.approx(p.predicted_peak_bytes, abs=1)
        else:
            assert d["low"] is None
    assert any(d["low"] is not None for d in bars)  # fsdp2 with bf16 gathers: the range is drawn
    assert any(ro == "ddp_buckets" for d in bars for _, ro, _ in d["segments"])


def test_the_trace_bar_is_its_peak_and_the_labels_are_the_fits(drawn, gpt):
    pic, fig = drawn
    div = fig.phasemem_unit
    raw = pickle.loads(lzma.decompress(GPT.read_bytes()))
    _, level, _ = replay(raw["device_traces"][0], raw["segments"])
    ref = fig.phasemem_bars[0]
    assert ref["plan"] == "trace"
    assert sum(r.get_height() for _, _, r in ref["segments"]) * div == pytest.approx(max(level), rel=1e-9)
    assert ref["label"].get_text() == str(math.floor(gpt.fits("24GiB").batch.largest_factor * 4 + 1e-9))
    for d in fig.phasemem_bars[1:]:
        fit = gpt.fits("24GiB", plan=d["plan"], ranks=d["ranks"], **_kw(d["plan"], "bf16")).batch
        assert d["label"].get_text() == str(math.floor(fit.largest_factor * 4 + 1e-9)), (d["plan"], d["ranks"])


def test_the_budget_line(gpt):
    from phasemem.reporters.picture.plan_data import PlanPicture
    from phasemem.reporters.picture.plans import plot_plans

    def lines_at(ax, y):
        return [ln for ln in ax.get_lines() if len(set(ln.get_ydata())) == 1 and ln.get_ydata()[0] == pytest.approx(y)]

    # far above the bars: drawn over a break of the y axis, the bars keep their scale
    pic = PlanPicture.of(gpt, 24 << 30, ranks=(1, 8), plans=("fsdp2",))
    fig = plot_plans(pic, size=(1000, 600))
    assert fig.phasemem_broken and fig.phasemem_budget is not fig.phasemem_axes
    assert lines_at(fig.phasemem_budget, (24 << 30) / fig.phasemem_unit)
    assert fig.phasemem_axes.get_ylim()[1] * fig.phasemem_unit < 2 * gpt.peak_bytes
    # near them: on their scale
    pic = PlanPicture.of(gpt, 4 << 30, ranks=(1, 8), plans=("fsdp2",))
    fig = plot_plans(pic, size=(1000, 600))
    assert not fig.phasemem_broken and fig.phasemem_budget is fig.phasemem_axes
    assert lines_at(fig.phasemem_axes, (4 << 30) / fig.phasemem_unit)
    assert fig.phasemem_bars[1]["label"].get_text() == f"×{pic.bars[0].largest_factor:.3g}"


def test_a_plan_that_does_not_apply_is_an_empty_slot_with_its_reason(tmp_path, capsys):
    from phasemem.reporters.picture.plan_data import PlanPicture
    from phasemem.reporters.picture.plans import plot_plans

    report = phasemem.analyze(str(INFERENCE))
    pic = PlanPicture.of(report, 24 << 30, batch=8)
    fig = plot_plans(pic)
    for d, bar in zip(fig.phasemem_bars[1:], pic.bars):
        assert not bar.plan.applies and d["segments"] == [] and d["label"] is None
        assert bar.plan.why[0] in " ".join(d["why"].get_text().split())
    assert sum(r.get_height() for _, _, r in fig.phasemem_bars[0]["segments"]) * fig.phasemem_unit == pytest.approx(
        report.peak_bytes, rel=1e-9)
    assert main(["plan", str(INFERENCE), "-o", str(tmp_path / "p.png"), "--json", str(tmp_path / "p.json")]) == 0
    text = capsys.readouterr().out
    assert "n/a (ddp; zero1; zero2; fsdp2): " + pic.bars[0].plan.why[0] in text
    assert all(b["largest_factor"] is None for b in json.loads((tmp_path / "p.json").read_text())["bars"])


@pytest.mark.parametrize("bad, says", [
    (["--ranks", "1,x"], "--ranks '1,x'"),
    (["--ranks", "0,2"], "--ranks '0,2'"),
    (["--ranks", ",".join(map(str, range(1, 12)))], "at most 10 rank counts"),
    (["--budget", "lots"], "--budget 'lots'"),
    (["--budget", "0"], "--budget '0'"),
    (["--plan", "fsdp2:8"], "the rank counts come from --ranks"),
    (["--plan", "ddp,fsdp3"], "--plan 'fsdp3'"),
    (["--batch", "four"], "--batch 'four'"),
    (["--param-dtype", "int8"], "param_dtype 'int8'"),
    (["--device", "all"], "--device 'all'"),
])
def test_bad_values_are_one_line_and_exit_2_leaving_outputs_as_they_were(tmp_path, capsys, bad, says):
    png = tmp_path / "plan.png"
    png.write_bytes(b"mine")
    assert main(["plan", str(GPT), "-o", str(png), *bad]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("phasemem: error: ") and says in err, err
    assert png.read_bytes() == b"mine"


def test_a_picture_name_it_cannot_draw(tmp_path, capsys):
    assert main(["plan", str(GPT), "-o", str(tmp_path / "plan.html")]) == 2
    assert capsys.readouterr().err.count("\n") == 1 and not (tmp_path / "plan.html").exists()


def test_the_page_has_the_plan_section(gpt, monkeypatch):
    from phasemem.reporters.html import page as page_html

    section = page_html.plans_section(gpt)
    svg = section[section.index("<svg"):section.rindex("</svg>") + 6]
    root = ET.fromstring(svg)
    ids = [el.get("id") for el in root.iter() if el.get("id")]
    assert ids and all(i.startswith("pm-plan-") for i in ids) and len(set(ids)) == len(ids)
    refs = set(re.findall(r"url\(#([^)]+)\)", svg)) | set(re.findall(r'href="#([^"]+)"', svg))
    assert refs <= set(ids)
    # a large trace: a note saying how to draw it instead of a long replay
    monkeypatch.setattr(page_html, "PLAN_PAGE_EVENTS", gpt.n_events - 1)
    note = page_html.plans_section(gpt)
    assert "<svg" not in note and "phasemem plan" in note and f"{gpt.n_events:,} events" in note


def test_the_page_made_by_analyze_holds_it(tmp_path):
    out = tmp_path / "report.html"
    assert main(["analyze", str(VIT), "-o", str(out)]) == 0
    text = out.read_text()
    assert text.count("id=pm-plans-h") == 1 and text.count('class="pm-plans"') == 1
    assert text.index("id=pm-plans-h") < text.index("<h2>Report</h2>")
    ids = re.findall(r' id="([^"]+)"', text)
    assert len(ids) == len(set(ids))
