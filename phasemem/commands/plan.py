"""``phasemem plan``: what each rank would hold under DDP, ZeRO-1, ZeRO-2 and FSDP2 at several rank
counts, replayed on one trace: the picture (reporters/picture/plans.py), a table, and the JSON."""
from __future__ import annotations

import json
import os

from ..errors import PhasememError
from ..output import write_all
from .options import check_outputs, dpi_number, picture_size

_PICTURE_EXTS = (".png", ".svg", ".pdf")


def register(sub) -> None:
    a = sub.add_parser(
        "plan", help="per-rank peak under DDP, ZeRO-1/2 and FSDP2 at 1-16 ranks, with what batch fits: a picture",
        description="Replay the parallel plans on a one-GPU snapshot: what each rank would hold under DDP, "
                    "ZeRO-1, ZeRO-2 and FSDP2 at each rank count, stacked by category beside the trace as "
                    "recorded, with the card's budget as a line and the largest batch per rank that fits over "
                    "each bar (docs/plans.md).",
    )
    a.add_argument("snapshot", metavar="SNAPSHOT", help="the snapshot file (a one-GPU trace: .pickle, .gz, .xz or .npz)")
    a.add_argument("-o", "--output", default="plan.png", metavar="PICTURE",
                   help="picture to write: .png, .svg or .pdf (default: plan.png)")
    a.add_argument("--json", metavar="PATH", help="also write every bar (each plan's answer and its fits) as JSON")
    a.add_argument("--budget", default="80GiB", metavar="SIZE",
                   help="the card's memory, drawn as a line; the largest batch per rank is solved under it "
                        "(default: 80GiB)")
    a.add_argument("--batch", default=None, metavar="B",
                   help="the trace's batch (per GPU): the largest batch per rank is then written as a number "
                        "(default: as a factor of the trace's batch, x3.2)")
    a.add_argument("--ranks", default="1,2,4,8,16", metavar="N,N,...",
                   help="the rank counts to draw, separated by commas (default: 1,2,4,8,16)")
    a.add_argument("--plan", dest="plans", action="append", default=[], metavar="PLAN",
                   help="only these plans, repeatable or separated by commas: ddp, zero1, zero2, fsdp2 "
                        "(default: all four)")
    a.add_argument("--param-dtype", dest="param_dtype", default=None, metavar="DTYPE",
                   help="fsdp2: the dtype FSDP2 gathers the parameters in (MixedPrecisionPolicy), bf16 or fp16 "
                        "(default: the trace's own)")
    a.add_argument("--bucket-view", dest="bucket_view", action="store_true",
                   help="ddp and zero1: DDP with gradient_as_bucket_view=True")
    a.add_argument("--keep-unsharded", dest="keep_unsharded", action="store_true",
                   help="fsdp2: reshard_after_forward=False (each layer kept whole from forward to backward)")
    a.add_argument("--device", default=None, metavar="N",
                   help="which device's trace (default: the device with the most recorded activity)")
    a.add_argument("--markers", default=None, metavar="PREFIX",
                   help="name prefix of the phase markers (default: the one the snapshot was recorded with)")
    a.add_argument("--trust", action="store_true",
                   help="unpickle without restrictions (only for files you made yourself)")
    g = a.add_argument_group("picture")
    g.add_argument("--size", type=picture_size, default=(1600, 900), metavar="WxH",
                   help="picture size in pixels (default: 1600x900)")
    g.add_argument("--dpi", type=dpi_number, default=100, metavar="N", help="dots per inch: text size (default: 100)")
    a.set_defaults(run=run)


def parse_ranks(text: str) -> tuple[int, ...]:
    """``"1,2,4,8"`` -> (1, 2, 4, 8), sorted, each once; a one-line error otherwise."""
    from ..reporters.picture.plan_data import MAX_RANK_COUNTS

    try:
        ranks = sorted({int(t) for t in str(text).split(",")})
    except ValueError:
        ranks = []
    if not ranks or ranks[0] < 1:
        raise PhasememError(f"--ranks {text!r}: give rank counts as whole numbers of 1 or more, separated by "
                            "commas (1,2,4,8,16)")
    if len(ranks) > MAX_RANK_COUNTS:
        raise PhasememError(f"--ranks {text!r}: at most {MAX_RANK_COUNTS} rank counts fit the picture; give fewer")
    return tuple(ranks)


def parse_plans(given: list[str]) -> tuple[str, ...]:
    """``["fsdp2,zero1"]`` -> ("zero1", "fsdp2") in PLANS order; all four when none is given."""
    from ..predictions.plans import PLANS

    names = [t.strip() for text in given for t in text.split(",")]
    for name in names:
        if name not in PLANS:
            hint = (" (the rank counts come from --ranks)" if ":" in name else "")
            raise PhasememError(f"--plan {name!r}: give one of {', '.join(PLANS)}{hint}")
    return tuple(p for p in PLANS if p in names) if names else PLANS


def parse_batch(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise PhasememError(f"--batch {text!r}: give the trace's batch per GPU as a whole number of 1 or more")
    return v


def _device(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        v = int(text)
    except ValueError:
        v = -1
    if v < 0:
        raise PhasememError(f"--device {text!r}: give one device number (0, 1, ...); a plan reads one GPU's trace")
    return v


def run(args) -> int:
    from .. import progress
    from ..predictions.plans import dtype_bytes
    from ..report.pipeline import analyze
    from ..reporters.picture.plan_data import PlanPicture
    from ..reporters.picture.plans import picture_writer
    from ..units import parse_size

    # Everything the user typed is checked before the (possibly long) analysis.
    if os.path.splitext(args.output)[1].lower() not in _PICTURE_EXTS:
        raise PhasememError(f"{args.output}: name the picture .png, .svg or .pdf")
    try:
        budget = parse_size(args.budget)
    except PhasememError as e:
        raise PhasememError(f"--budget {e}") from None
    if budget <= 0:
        raise PhasememError(f"--budget {args.budget!r}: give the card's memory, more than 0 (80GiB)")
    ranks, plans, batch = parse_ranks(args.ranks), parse_plans(args.plans), parse_batch(args.batch)
    if args.param_dtype is not None:
        dtype_bytes(args.param_dtype)
    device = _device(args.device)
    check_outputs(args.output, args.json)
    report = analyze(args.snapshot, device, trusted=args.trust, marker_prefix=args.markers, what_ifs=False)
    if report.analysis is None or report.live is not None:
        raise PhasememError(f"{args.snapshot}: the plans are replayed on an allocation history and this snapshot "
                            "has none; record it with torch.cuda.memory._record_memory_history() or instrument()")
    progress.stage("replaying the plans")
    pic = PlanPicture.of(report, budget, ranks=ranks, plans=plans, batch=batch, name=os.path.basename(args.snapshot),
                         param_dtype=args.param_dtype, reshard_after_forward=not args.keep_unsharded,
                         bucket_view=args.bucket_view)
    progress.stage(f"drawing {args.output}")
    outputs = [(args.output, picture_writer(pic, args.output, size=args.size, dpi=args.dpi))]
    if args.json:
        text = json.dumps(pic.to_dict(), indent=1)

        def write(tmp):
            with open(tmp, "w") as f:
                f.write(text)

        outputs.append((args.json, write))
    print(pic.text())
    write_all(outputs)  # all of them or none
    print(f"\nwrote {', '.join(p for p, _ in outputs)}")
    return 0
