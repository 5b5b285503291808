"""The what-if table of docs/what-if.md: each remedy predicted from fixtures/pairs/base, beside the real run.

    python3 docs/eval_whatif.py
"""
import json
from pathlib import Path

import phasemem
from phasemem.units import format_bytes

PAIRS = Path(__file__).resolve().parents[1] / "fixtures" / "pairs"
REAL_RUN = {"fused_optimizer": "fused", "chunked_cross_entropy": "chunked_ce", "activation_checkpointing": "ckpt",
            "half_batch": "half_batch", "zero_grad_before_forward": "zero_grad_before", "bf16_logits": "bf16_logits",
            "smaller_optimizer_state": None}


def main() -> None:
    base = phasemem.analyze(str(PAIRS / "base.pkl.xz"))
    print(f"base: peak {format_bytes(base.peak_bytes)} in {base.peak.phase} "
          f"(max_memory_allocated {format_bytes(json.loads((PAIRS / 'base.json').read_text())['peak_allocated'])})\n")
    print("| remedy | predicted peak (phase) | real run: trace peak (phase) | max_memory_allocated | error |")
    print("|---|---|---|---|---|")
    for w in base.what_if:
        run = REAL_RUN.get(w.remedy)
        pred = f"{format_bytes(w.predicted_peak_bytes)} ({w.new_peak_phase})" if w.applies else "does not apply"
        if run is None:
            print(f"| {w.remedy} | {pred} | not run (no 8-bit optimizer on the H200 image) | | |")
            continue
        real = phasemem.analyze(str(PAIRS / f"{run}.pkl.xz"))
        mx = json.loads((PAIRS / f"{run}.json").read_text())["peak_allocated"]
        err = f"{(w.predicted_peak_bytes - mx) / mx:+.1%}" if w.applies else ""
        print(f"| {w.remedy} | {pred} | {format_bytes(real.peak_bytes)} ({real.peak.phase}) | {format_bytes(mx)} | {err} |")


if __name__ == "__main__":
    main()
