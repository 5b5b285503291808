"""The parallel plans (phasemem.predictions.plans) against what rank 0 really held: fixtures/plans, recorded on an
H100 with torch's fake process group (FSDP2, ZeRO) and a one-rank NCCL group (DDP); docs/plans.md."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import lru_cache

import numpy as np
import pytest

import phasemem
from helpers.paths import FIXTURES, ROOT
from phasemem.errors import PhasememError
from phasemem.predictions.plans import parse_plan, plan, shard_bytes, zero_owner

HERE = str(FIXTURES / "plans")
TRUTH = json.load(open(os.path.join(HERE, "truth.json")))
RUNS = {r["name"]: r for r in TRUTH["runs"]}
#: How each recorded run is asked of phasemem (zero1 ran on the fake group, whose no-op comm hook lets
#: DDP's first buckets go before the rebuilt ones are made: docs/plans.md).
ASKED = {"ddp": ("ddp", {}), "ddp_view": ("ddp", {"bucket_view": True}),
         "zero1": ("zero1", {"rebuild_buckets": False}), "zero2": ("zero2", {}), "fsdp2": ("fsdp2", {}),
         "fsdp2_keep": ("fsdp2", {"reshard_after_forward": False}), "fsdp2_bf16": ("fsdp2", {"param_dtype": "bf16"})}
TOLERANCE = 0.05  # issue 41's target


@lru_cache(maxsize=None)
def report(name: str):
    return phasemem.analyze(os.path.join(HERE, name + ".pkl.xz"), what_ifs=False)


def base(run: dict) -> str:
    return f"{run['family']}__single_fp32__n1_r0__b{run['batch']}"


def truth_rows(plans):
    return [r for r in TRUTH["runs"] if r["plan"] in plans and not r.get("oom") and not r.get("error")
            and not (r["plan"].startswith("ddp") and r["ranks"] != 1)]


def _grads_bytes(run) -> int:
    rows = report(base(run)).analysis.trace.meta["parameters"]
    return sum(int(np.prod(r[1])) * 4 for r in rows if r[3])


@pytest.mark.parametrize("plan_name", ["zero1", "zero2", "fsdp2", "fsdp2_keep", "fsdp2_bf16"])
def test_each_rank_peak_within_five_percent(plan_name):
    """Every family, batch and world size of the fake group: rank 0's (and ZeRO's last rank's) peak,
    predicted from the one-GPU trace at the same batch per rank."""
    rows = truth_rows({plan_name})
    assert len(rows) >= 32
    misses = []
    for run in rows:
        name, kw = ASKED[plan_name]
        r = report(base(run))
        p = plan(r.analysis, r.patterns, name, run["ranks"], run["rank"], **kw)
        assert p.applies, (run["name"], p.why)
        err = p.predicted_peak_bytes / run["peak"] - 1
        if abs(err) > TOLERANCE:
            misses.append((run["name"], round(err, 3)))
    assert not misses


def test_ddp_counts_its_bucket_rebuild():
    """DDP on a real NCCL group: the prediction holds the buckets and, for the iteration after the
    first, the first set beside the rebuilt one; the real peak lies between the steady state and that."""
    for run in truth_rows({"ddp", "ddp_view"}):
        r = report(base(run))
        kw = ASKED[run["plan"]][1]
        p = plan(r.analysis, r.patterns, "ddp", 1, **kw)
        steady = plan(r.analysis, r.patterns, "ddp", 1, rebuild_buckets=False, **kw)
        extra = _grads_bytes(run)
        close = abs(p.predicted_peak_bytes / run["peak"] - 1) <= TOLERANCE
        # else the run let its first buckets go before its peak: then no more than their bytes over
        assert close or run["peak"] <= p.predicted_peak_bytes <= run["peak"] + extra, run["name"]
        assert steady.predicted_peak_bytes <= p.predicted_peak_bytes
    # and where the old buckets do live on (gpt: its tied weight's gradient views keep them), the
    # steady state alone is 9 % low
    run = RUNS["gpt__ddp__n1_r0__b4"]
    r = report(base(run))
    steady = plan(r.analysis, r.patterns, "ddp", 1, rebuild_buckets=False)
    assert steady.predicted_peak_bytes < run["peak"] * 0.92
    assert abs(plan(r.analysis, r.patterns, "ddp", 1).predicted_peak_bytes / run["peak"] - 1) < 0.01


def test_zero_partition_is_torchs():
    """ZeroRedundancyOptimizer's greedy partition (largest first, to the rank holding least), checked
    against the parameters each recorded rank owned."""
    checked = 0
    for run in TRUTH["runs"]:
        if run["plan"] not in ("zero1", "zero2") or "owned" not in run:
            continue
        rows = report(base(run)).analysis.trace.meta["parameters"]
        numel = np.array([int(np.prod(x[1])) for x in rows])
        owner = zero_owner(numel, run["ranks"])
        assert sorted(np.flatnonzero(owner == run["rank"]).tolist()) == sorted(run["owned"]), run["name"]
        checked += 1
    assert checked >= 40


def test_fsdp2_shards_pad_dim0():
    assert shard_bytes(np.array([10 * 4 * 3]), np.array([10]), 4).tolist() == [512]  # 3 rows of 12 B, a block
    big = shard_bytes(np.array([1000 * 4096]), np.array([1000]), 16)[0]
    assert big == 63 * 4096  # ceil(1000 / 16) rows


@pytest.mark.parametrize("family,batch", [("gpt", 4), ("vit", 64), ("bert", 8), ("llama", 8)])
def test_fsdp2_from_one_ranks_trace(family, batch):
    """From rank 0's trace at N=8, the same job at 2, 4 and 16 ranks."""
    r = report(f"{family}__fsdp2__n8_r0__b{batch}")
    for n in (2, 4, 16):
        p = plan(r.analysis, r.patterns, "fsdp2", n)
        real = RUNS[f"{family}__fsdp2__n{n}_r0__b{batch}"]["peak"]
        assert abs(p.predicted_peak_bytes / real - 1) < 0.02, (n, p.predicted_peak_bytes, real)
    other = plan(r.analysis, r.patterns, "zero1", 4)
    assert not other.applies and "one rank" in other.why[0]


def test_what_a_trace_lacks_is_said():
    plain = report("gpt__plain__b4")  # no instrument(): no parameter table, so no dtype
    p = plan(plain.analysis, plain.patterns, "fsdp2", 8, param_dtype="bf16")
    assert not p.applies and "dtype" in p.why[0]
    assert plan(plain.analysis, plain.patterns, "fsdp2", 8).applies  # the layers come from the gradients
    inference = phasemem.analyze(os.path.join(HERE, "..", "gpt_inference.pkl.xz"), what_ifs=False)
    q = plan(inference.analysis, inference.patterns, "zero1", 4)
    assert not q.applies and "gradients" in q.why[0]
    with pytest.raises(PhasememError):
        plan(plain.analysis, plain.patterns, "zero3", 4)
    with pytest.raises(PhasememError):
        plan(plain.analysis, plain.patterns, "fsdp2", 4, rank=4)


def test_bf16_parameters_from_an_autocast_trace_are_a_range_that_holds_the_truth():
    """fsdp2 with bf16 parameters read off the autocast trace of each run's family and batch: which blocks
    autocast kept in fp32 no trace tells, so the answer is a range, confidence low, and every real run
    lies inside it; from the fp32 trace, one number (bert's and vit's loss callers are known)."""
    rows = truth_rows({"fsdp2_bf16"})
    assert len(rows) >= 32 and len({r["family"] for r in rows}) == 4
    outside = []
    for run in rows:
        r = report(f"{run['family']}__single_bf16__n1_r0__b{run['batch']}")
        p = plan(r.analysis, r.patterns, "fsdp2", run["ranks"], run["rank"], param_dtype="bf16")
        assert p.confidence == "low" and p.predicted_peak_bytes_low is not None, (run["name"], p.why)
        assert "autocast" in p.why[1]
        if not p.predicted_peak_bytes_low <= run["peak"] <= p.predicted_peak_bytes:
            outside.append((run["name"], p.predicted_peak_bytes_low, run["peak"], p.predicted_peak_bytes))
    assert not outside
    fp32 = report("bert__single_fp32__n1_r0__b8")
    one = plan(fp32.analysis, fp32.patterns, "fsdp2", 8, param_dtype="bf16")
    assert one.predicted_peak_bytes_low is None and one.confidence == "medium"


def test_plain_trace_reads_the_layers_from_its_gradients():
    """A user's recording (torch's defaults, no instrument()): the same FSDP2 answer within 5 %."""
    run = RUNS["gpt__fsdp2__n8_r0__b4"]
    r = report("gpt__plain__b4")
    p = plan(r.analysis, r.patterns, "fsdp2", 8)
    assert "gradients" in p.why[-1]
    assert abs(p.predicted_peak_bytes / run["peak"] - 1) < TOLERANCE


def test_categories_at_the_predicted_peak_add_up():
    r = report("llama__single_fp32__n1_r0__b4")
    p = plan(r.analysis, r.patterns, "fsdp2", 8)
    assert sum(p.categories.values()) == p.predicted_peak_bytes
    assert p.phase_peaks[p.peak_phase] == p.predicted_peak_bytes


def test_parse_plan():
    assert parse_plan("fsdp2:8") == ("fsdp2", 8)
    assert parse_plan("ddp") == ("ddp", 1)
    for bad in ("fsdp3:8", "fsdp2:0", "fsdp2:x", ""):
        with pytest.raises(PhasememError):
            parse_plan(bad)


def test_cli_plans_in_text_and_json(tmp_path):
    trace = os.path.join(HERE, "vit__single_fp32__n1_r0__b32.pkl.xz")
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "phasemem", "analyze", trace, "--plan", "fsdp2:8", "--plan", "zero1:4",
                        "--json", str(out), "-o", str(tmp_path / "m.png")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "fsdp2 with 8 rank(s)" in p.stdout and "zero1 with 4 rank(s)" in p.stdout
    plans = json.loads(out.read_text())["plans"]
    r = report("vit__single_fp32__n1_r0__b32")
    assert [x["predicted_peak_bytes"] for x in plans] == [
        r.plan("fsdp2", 8).predicted_peak_bytes, r.plan("zero1", 4).predicted_peak_bytes]
    bad = subprocess.run([sys.executable, "-m", "phasemem", "analyze", trace, "--plan", "fsdp9:8"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_per_rank_fits_start_from_the_plans_peak(tmp_path):
    """Under a plan, what fits starts from the peak that plan predicts per rank, in the JSON and in the
    text printed under it, never the one-GPU trace's (printed once, above)."""
    from phasemem.units import format_bytes

    trace = os.path.join(HERE, "gpt__single_fp32__n1_r0__b4.pkl.xz")
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "phasemem", "analyze", trace, "--plan", "zero1:4", "--plan", "fsdp2:8",
                        "--fits", "24GiB", "--json", str(out), "-o", str(tmp_path / "m.png")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    plans = json.loads(out.read_text())["plans"]
    said = [line for line in p.stdout.splitlines() if line.startswith("    what fits in")]
    assert len(plans) == len(said) == 2
    for plan_json, line in zip(plans, said):
        assert plan_json["fits"]["peak_bytes"] == plan_json["predicted_peak_bytes"]
        assert f"(peak now {format_bytes(plan_json['predicted_peak_bytes'])}," in line
    assert json.loads(out.read_text())["fits"]["peak_bytes"] == report("gpt__single_fp32__n1_r0__b4").peak_bytes


def test_per_rank_fits_against_the_capped_runs():
    """Under a 24 GiB cap, the largest batch per rank --fits names for the one GPU, fsdp2:8 and zero1:4 of
    every family (all held out): within 5 % of the largest that ran; every one runs but gpt's zero1:4,
    one sample over (DDP's rebuilt buckets fragment the card in a way the plan's whole buffers do not)."""
    sys.path.insert(0, str(ROOT / "docs"))
    from eval_plans import capped_rows

    rows = list(capped_rows())
    assert len(rows) == 12
    over = []
    for run, named in rows:
        assert abs(named / run["largest_batch"] - 1) <= TOLERANCE, run["name"]
        if named > run["largest_batch"]:
            over.append((run["name"], named - run["largest_batch"]))
    assert over == [("gpt__capped_zero1__n4", 1)]
