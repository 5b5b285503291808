"""``phasemem demo``: a small GPT-like model trained for a few steps under instrument(), then analysed."""
from __future__ import annotations

from ..output import write_all
from .options import check_outputs, picture_file, picture_kwargs, picture_options, step_count


def register(sub) -> None:
    d = sub.add_parser(
        "demo", help="train a small GPT-like model for a few steps under instrument() and analyse it",
        description="Train a small GPT-like language model for a few steps inside phasemem.instrument(), "
                    "print the report and draw the picture.",
    )
    d.add_argument("-o", "--output", type=picture_file, default="demo.png", metavar="PICTURE",
                   help="picture to write (default: demo.png)")
    d.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    d.add_argument("--device", choices=("cpu", "cuda"), help="where to train (default: cuda if available)")
    d.add_argument("--steps", type=step_count, default=3, help="training steps to record (default: 3)")
    d.add_argument("--full", action="store_true", help="print the whole report: every step's phases and every shape")
    picture_options(d)
    d.set_defaults(run=run)


def run(args) -> int:
    from ..capture import demo
    from ..report.pipeline import analyze

    check_outputs(args.output, args.json)
    report = analyze(demo.record(device=args.device, steps=args.steps))
    print(report.text(full=args.full))
    outputs = [(args.output, report.picture_writer(args.output, **picture_kwargs(args)))]
    if args.json:
        outputs.append((args.json, report.json_writer()))
    write_all(outputs)
    print(f"\nwrote {', '.join(p for p in (args.output, args.json) if p)}")
    return 0
