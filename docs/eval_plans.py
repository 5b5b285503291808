"""Predicted against measured, for every run of fixtures/plans/truth.json (issue 41; docs/plans.md).

Each run's prediction comes from its family's single-GPU trace at the same batch per rank
(``FAMILY__single_fp32__n1_r0__bB.pkl.xz``, or ``--from bf16`` for the autocast one); the truth is the
run's own ``max_memory_allocated`` over its three steps. Held-out rows (decided before recording:
``truth.json``'s ``held_out``) are marked.

    python3 docs/eval_plans.py [--only gpt,vit] [--fit] [--from fp32|bf16]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import phasemem  # noqa: E402
from phasemem.predictions.plans import plan  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "plans")
#: A truth run's plan name -> (plan, its settings)
#: zero1 ran on the fake group with a no-op comm hook, which does not hold DDP's first buckets through
#: their rebuild (the default hook's future does: docs/plans.md): the rows are predicted without it.
RUN_PLANS = {"ddp": ("ddp", {}), "ddp_view": ("ddp", {"bucket_view": True}), "zero1": ("zero1", {"rebuild_buckets": False}),
             "zero2": ("zero2", {}), "fsdp2": ("fsdp2", {}), "fsdp2_keep": ("fsdp2", {"reshard_after_forward": False}),
             "fsdp2_bf16": ("fsdp2", {"param_dtype": "bf16"})}


def held_out(run: dict, truth: dict) -> bool:
    h = truth["held_out"]
    b = truth["families"][run["family"]]["batches"]
    return run["family"] in h["families"] or run["ranks"] in h["ranks"] or b.index(run["batch"]) in h["batch_index"]


def rows(only=None, source="fp32"):
    truth = json.load(open(os.path.join(HERE, "truth.json")))
    reports = {}
    for run in truth["runs"]:
        if run["plan"] not in RUN_PLANS or (only and run["family"] not in only) or run.get("oom") or run.get("error"):
            continue
        if run["plan"].startswith("ddp") and run["ranks"] != 1:
            continue  # the fake group's DDP check (no-op comm hook), not DDP's truth
        base = f"{run['family']}__single_{source}__n1_r0__b{run['batch']}.pkl.xz"
        if base not in reports:
            reports[base] = phasemem.analyze(os.path.join(HERE, base), what_ifs=False)
        name, kw = RUN_PLANS[run["plan"]]
        p = plan(reports[base].analysis, reports[base].patterns, name, ranks=max(run["ranks"], 1), rank=run["rank"], **kw)
        yield run, p, held_out(run, truth)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--fit", action="store_true", help="only the rows the rules were fitted on")
    ap.add_argument("--held-out", action="store_true", help="only the held-out rows")
    ap.add_argument("--from", dest="source", default="fp32")
    ap.add_argument("--markdown", action="store_true", help="the summary as a markdown table (docs/plans.md)")
    ap.add_argument("--capped", action="store_true", help="the per-rank --fits answers against the capped runs")
    a = ap.parse_args(argv)
    only = set(a.only.split(",")) if a.only else None
    errs = {}
    if a.markdown:
        return markdown(only, a.source)
    if a.capped:
        return capped()
    print(f"{'run':34s} {'held':4s} {'measured':>9s} {'predicted':>9s} {'error':>7s}  peak phase")
    for run, p, ho in rows(only, a.source):
        if (a.fit and ho) or (a.held_out and not ho):
            continue
        if not p.applies:
            print(f"{run['name']:34s} {'yes' if ho else '':4s} {run['peak'] / 2**20:9.0f} {'n/a':>9s}  {p.why[0][:60]}")
            continue
        err = p.predicted_peak_bytes / run["peak"] - 1
        errs.setdefault((run["plan"], ho), []).append(abs(err))
        print(f"{run['name']:34s} {'yes' if ho else '':4s} {run['peak'] / 2**20:9.0f} {p.predicted_peak_bytes / 2**20:9.0f} "
              f"{err:+7.1%}  {p.peak_phase}")
    print()
    for (plan_name, ho), e in sorted(errs.items()):
        print(f"{plan_name:12s} {'held out' if ho else 'fitted':8s} runs {len(e):3d}  mean |error| {sum(e) / len(e):6.1%}  "
              f"max {max(e):6.1%}  within 5%: {sum(x <= 0.05 for x in e)}/{len(e)}")
    return 0


def capped_rows():
    """Each capped run of capped.json (a 24 GiB cap, every one held out): the largest batch per rank
    that ran, and the one --fits names from the family's one-GPU trace at its first batch."""
    cap = json.load(open(os.path.join(HERE, "capped.json")))
    for run in cap["runs"]:
        fam, name, n = run["family"], run["plan"], run["ranks"]
        b = cap["families"][fam]["batches"][0]
        rep = phasemem.analyze(os.path.join(HERE, f"{fam}__single_fp32__n1_r0__b{b}.pkl.xz"), what_ifs=False)
        if name == "single":
            fx = rep.fits(run["cap_bytes"])
        else:  # the fake group's no-op hook: see RUN_PLANS
            fx = rep.fits(run["cap_bytes"], plan=name, ranks=n, **RUN_PLANS.get(name, (name, {}))[1])
        yield run, int(fx.batch.largest_factor * b)


def capped() -> int:
    print("| family | plan | largest batch that ran | first that ran out | --fits names | error | runs |")
    print("|---|---|---|---|---|---|---|")
    for run, named in capped_rows():
        real = run["largest_batch"]
        print(f"| {run['family']} | {run['plan']}:{run['ranks']} | {real} | {run['first_failing']} | {named} | "
              f"{named / real - 1:+.1%} | {'yes' if named <= real else 'no'} |")
    return 0


def markdown(only, source) -> int:
    """Per plan and world size: runs, mean and worst error, fitted and held-out apart."""
    cells = {}
    for run, p, ho in rows(only, source):
        if not p.applies:
            continue
        err = p.predicted_peak_bytes / run["peak"] - 1
        cells.setdefault((run["plan"], ho), []).append((run["ranks"], err, run["name"]))
    print("| plan | rows | runs | mean abs. error | worst | within 5 % |")
    print("|---|---|---|---|---|---|")
    for (name, ho), got in sorted(cells.items()):
        e = [abs(x[1]) for x in got]
        worst = max(got, key=lambda x: abs(x[1]))
        print(f"| {name} | {'held out' if ho else 'fitted'} | {len(e)} | {sum(e) / len(e):.1%} | "
              f"{worst[1]:+.1%} ({worst[2]}) | {sum(x <= 0.05 for x in e)}/{len(e)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
