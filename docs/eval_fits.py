"""--fits against capped cards: the largest batch (or sequence) it names for a base trace, beside the
largest that really ran under the cap (docs/what-if.md, capacity; docs/accuracy.md, allocator).

Two sets: fixtures/capacity, capacity2, capacity3 (record_capacity.py on an H200, bf16 autocast, caps of
1-8 GiB: the set the allocator replay was built and checked on) and fixtures/plans/capped.json
(record_plans.py on an H100, fp32, a 24 GiB cap: held out, read once the replay was done).

    python3 docs/eval_fits.py              # the capacity set (markdown table)
    python3 docs/eval_fits.py --held-out   # fixtures/plans/capped.json's single-GPU runs too
    python3 docs/eval_fits.py --json       # the rows
"""
import json
import math
import sys
import time
from pathlib import Path

import phasemem

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SEQ_STEP = 64  # record_capacity.SEQ_STEP: sequences were tried in multiples of it


def _limit(runs, field):
    """(largest that ran below the first that ran out of memory, that first one): None where unseen."""
    runs = sorted(runs, key=lambda r: r[field])
    first_oom = next((r[field] for r in runs if r["oom"]), None)
    ok = [r[field] for r in runs if not r["oom"] and (first_oom is None or r[field] < first_oom)]
    return (max(ok) if ok else None), first_oom


def capacity_rows() -> list[dict]:
    rows = []
    for run in ("capacity", "capacity2", "capacity3"):
        path = FIXTURES / run / "capacity.json"
        if not path.exists():
            continue
        for fam, res in sorted(json.loads(path.read_text())["results"].items()):
            trace = FIXTURES / run / f"{fam}__base.pkl.xz"
            t0 = time.perf_counter()
            fx = phasemem.analyze(str(trace)).fits(res["cap_bytes"])
            seconds = time.perf_counter() - t0
            cfg = res["base"]["config"]
            for axis, fit in (("batch", fx.batch), ("sequence", fx.sequence)):
                u = res["under_cap"].get(axis, {})
                if "runs" not in u or not fit.applies:
                    continue
                field, unit, now = ("batch", 1, cfg["batch"]) if axis == "batch" else ("seq", SEQ_STEP, cfg["seq"])
                real, oom = _limit(u["runs"], field)
                rows.append(_row(f"{run}/{fam}", axis, now, unit, fit, real, oom, u.get("predicted_largest"),
                                 res["cap_bytes"], seconds))
    return rows


def held_out_rows() -> list[dict]:
    path = FIXTURES / "plans" / "capped.json"
    if not path.exists():
        return []
    doc = json.loads(path.read_text())
    rows = []
    for r in doc["runs"]:
        if r["plan"] != "single":
            continue
        first = doc["families"][r["family"]]["batches"][0]
        trace = FIXTURES / "plans" / f"{r['family']}__single_fp32__n1_r0__b{first}.pkl.xz"
        t0 = time.perf_counter()
        rep = phasemem.analyze(str(trace))
        fx = rep.fits(r["cap_bytes"])
        seconds = time.perf_counter() - t0
        runs = [{"batch": int(b), "oom": t["oom"]} for b, t in r["trials"].items()]
        real, oom = _limit(runs, "batch")
        rows.append(_row(f"plans/{r['family']}", "batch", first, 1, fx.batch, real, oom, None, r["cap_bytes"], seconds))
    return rows


def _row(name, axis, now, unit, fit, real, oom, before, cap, seconds) -> dict:
    pred = int(math.floor(now * fit.largest_factor / unit + 1e-9)) * unit
    loose = int(math.floor(now * fit.largest_factor_allocated / unit + 1e-9)) * unit
    row = {"trace": name, "axis": axis, "cap_bytes": cap, "predicted": pred, "real": real, "first_oom": oom,
           "allocated_bound": loose, "before": before, "seconds": round(seconds, 2),
           "fails_at": fit.fails_at}
    if real is not None:
        row["runs"] = pred <= real
        row["error"] = (pred - real) / real
    else:  # only an out-of-memory run was seen: the prediction must be under it
        row["runs"] = oom is None or pred < oom
        row["error"] = None
    return row


def table(rows) -> str:
    out = ["| trace | axis | cap | predicted | real limit (first OOM) | error | runs? | said when run | allocated bound |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        real = f"{r['real']} ({r['first_oom']})" if r["real"] is not None else f"< {r['first_oom']}"
        err = f"{r['error'] * 100:+.1f} %" if r["error"] is not None else "n/a"
        out.append(f"| {r['trace']} | {r['axis']} | {r['cap_bytes'] / 2 ** 30:.2f} GiB | {r['predicted']} | {real} | "
                   f"{err} | {'yes' if r['runs'] else '**no**'} | {r['before'] if r['before'] is not None else ''} | "
                   f"{r['allocated_bound']} |")
    return "\n".join(out)


if __name__ == "__main__":
    rows = capacity_rows()
    held = held_out_rows() if "--held-out" in sys.argv else []
    if "--json" in sys.argv:
        print(json.dumps({"capacity": rows, "held_out": held}, indent=1))
    else:
        print(table(rows))
        if held:
            print()
            print(table(held))
