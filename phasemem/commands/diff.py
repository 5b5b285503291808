"""``phasemem diff``: what changed from run A to run B, phase by phase and shape by shape; a CI gate."""
from __future__ import annotations

import sys

from ..errors import PhasememError
from ..output import write_all
from .options import check_outputs, device_choice, dpi_number, picture_file, picture_size

#: The exit status when a budget is broken (the outputs are written first); 2 stays bad input.
EXIT_OVER_BUDGET = 1


def register(sub) -> None:
    d = sub.add_parser(
        "diff", help="compare two snapshots: phase peaks, shapes, categories, what caused the change",
        description="Compare run B with run A (two snapshot pickles, .gz/.xz, or .npz): steps aligned, "
                    "phases by name, shapes by kind; the change of the peak split into named causes. "
                    "With --fail-if, exit 1 when a budget is broken (after writing the outputs).",
    )
    d.add_argument("a", metavar="A", help="the base snapshot")
    d.add_argument("b", metavar="B", help="the snapshot to compare with it")
    d.add_argument("-o", "--output", type=picture_file, default="diff.png", metavar="PICTURE",
                   help="picture to write: .png, .svg or .pdf (default: diff.png)")
    d.add_argument("--json", metavar="PATH", help="also write the comparison as JSON")
    d.add_argument("--steps", default="steady", metavar="WHICH",
                   help="steady (default: a steady step of each), all (whole recordings), N (step N of both) "
                        "or N:M (A's step N with B's step M)")
    d.add_argument("--fail-if", dest="fail_if", action="append", default=[], metavar="BUDGET",
                   help="a budget, repeatable: peak>+5%%, backward.peak>+512MiB (against A), peak>20GiB, "
                        "optimizer.peak>6GiB, activation>3GiB, logits>1GiB (on B)")
    d.add_argument("--device", type=device_choice, metavar="N", help="which device's trace of both (default: the busiest)")
    d.add_argument("--markers", default=None, metavar="PREFIX", help="name prefix of the phase markers")
    d.add_argument("--trust", action="store_true", help="unpickle without restrictions (only for files you made yourself)")
    g = d.add_argument_group("picture")
    g.add_argument("--size", type=picture_size, default=(1600, 900), metavar="WxH",
                   help="picture size in pixels (default: 1600x900)")
    g.add_argument("--dpi", type=dpi_number, default=100, metavar="N", help="dots per inch: text size (default: 100)")
    d.set_defaults(run=run)


def run(args) -> int:
    from ..report.budgets import check_comparison, parse_budgets
    from ..report.compare import compare, parse_compare_steps

    if args.device == "all":
        raise PhasememError("--device all: diff compares one device of each run; give its number")
    budgets = parse_budgets(args.fail_if)  # a budget that does not parse is an error, not a pass
    check_outputs(args.output, args.json)
    parse_compare_steps(args.steps)  # a malformed choice fails now, not after two analyses
    c = compare(args.a, args.b, steps=args.steps, device=args.device, trusted=args.trust, marker_prefix=args.markers)
    broken = check_comparison(budgets, c)  # a budget that cannot be checked fails before any output
    outputs = [(args.output, c.picture_writer(args.output, size=args.size, dpi=args.dpi))]
    if args.json:
        said = [{"budget": b.text, "broken": next(iter(check_comparison([b], c)), None)} for b in budgets]
        outputs.append((args.json, c.json_writer({"budgets": said})))
    print(c)
    write_all(outputs)  # all of them or none
    print(f"\nwrote {', '.join(p for p, _ in outputs)}")
    for line in broken:
        print(f"phasemem: {line}", file=sys.stderr)
    return EXIT_OVER_BUDGET if broken else 0
