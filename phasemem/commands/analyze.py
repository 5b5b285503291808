"""``phasemem analyze``: the report, the picture, the JSON of a snapshot (one device or all)."""
from __future__ import annotations

import sys

from ..output import write_all
from .diff import EXIT_OVER_BUDGET
from .options import check_outputs, device_choice, per_device, picture_file, picture_kwargs, picture_options

def register(sub) -> None:
    a = sub.add_parser(
        "analyze", help="analyse a snapshot pickle: print the report, draw the picture",
        description="Analyse a torch.cuda.memory._dump_snapshot pickle (plain, .gz or .xz): print the "
                    "report and draw the labeled picture.",
    )
    a.add_argument("snapshot", metavar="SNAPSHOT", nargs="+",
                   help="the snapshot file; or the ranks of one distributed run: the folder run.save(folder) "
                        "wrote, several files, or a glob (one report over the ranks, a lane per rank)")
    a.add_argument("-o", "--output", type=picture_file, default="memory.png", metavar="PICTURE",
                   help="picture to write: .png, .svg or .pdf (default: memory.png)")
    a.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    a.add_argument("--device", type=device_choice, metavar="N|all",
                   help="which device's trace, or 'all' for one report, picture and JSON each (files named "
                        "PICTURE.cudaN.png ...; default: the device with the most recorded activity)")
    a.add_argument("--markers", default=None, metavar="PREFIX",
                   help="name prefix of the phase markers (default: the one the snapshot was recorded with, "
                        "else phasemem::)")
    a.add_argument("--trust", action="store_true",
                   help="unpickle without restrictions (only for files you made yourself)")
    a.add_argument("--steps", metavar="RANGE", dest="zoom",
                   help="analyse and draw only these steps (numbers as in the report): 3, 2-4, 2- or -4 "
                        "(default: all); from a converted .npz only their events are read")
    a.add_argument("--fail-if", dest="fail_if", action="append", default=[], metavar="BUDGET",
                   help="a budget, repeatable: peak>20GiB, optimizer.peak>6GiB, activation>3GiB "
                   "(a category at the peak), logits>1GiB (a shape); exit 1 when one is broken, after writing")
    a.add_argument("--what-if", dest="what_if", action="store_true",
                   help="also print what each remedy (fused optimizer, chunked cross-entropy, checkpointing, "
                        "half the batch, ...) would do to the peak, replayed on this trace, ranked by saving")
    a.add_argument("--fits", metavar="BUDGET", default=None,
                   help="also print the largest batch and sequence factors predicted to fit in BUDGET (80GiB: "
                        "a card's memory), with the allocator's reserve, and the remedies that let the next fit")
    ranks = a.add_argument_group("several ranks (a folder, several files or a glob)")
    ranks.add_argument("--workers", type=_workers, default=None, metavar="N",
                       help="analyse the ranks on N processes (default: every core; 1: one after another)")
    ranks.add_argument("--scheduler", default=None, metavar="ADDRESS",
                       help="analyse the ranks on the Dask cluster at ADDRESS (tcp://HOST:8786), each worker "
                            "reading its rank's file by path (pip install 'phasemem[dask]')")
    picture_options(a)
    a.set_defaults(run=run)


def _workers(text: str) -> int:
    import argparse

    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of processes, 1 or more (1: one rank after another)")
    return v


def run(args) -> int:
    from ..analyze import analyze
    from ..budgets import parse_budgets
    from ..render import visible_range
    from ..steps import parse_steps

    budgets = parse_budgets(args.fail_if, absolute=True)  # one that does not parse fails now, not as a pass
    if args.fits is not None:
        from ..units import parse_size

        parse_size(args.fits)  # a malformed size fails now, not after a long analysis
    check_outputs(args.output, args.json)
    parse_steps(args.zoom)  # a malformed range fails now, not after a long analysis
    if _several_ranks(args.snapshot):
        return _run_ranks(args, budgets)
    args.snapshot = args.snapshot[0]
    every = args.device == "all"
    # The remedies' replays are a fifth of the analysis (1M events); only --what-if and the JSON show
    # them (an out-of-memory's would-fit line replays what it needs either way).
    asked = dict(trusted=args.trust, marker_prefix=args.markers, steps=args.zoom,
                 what_ifs=bool(args.what_if or args.json))
    report = analyze(args.snapshot, None if every else args.device, **asked)
    reports = [report]
    if every:
        reports += [analyze(args.snapshot, d.index, **asked) for d in report.other_devices if d.events]
        reports.sort(key=lambda r: r.device)
    outputs = []
    answers = [_fits(r, args) for r in reports]
    for r, fit in zip(reports, answers):
        if r.live is None:
            visible_range(r, args.zoom)  # steps the report does not have: say so instead of the report
        picture, json_path = (per_device(args.output, r.device), per_device(args.json, r.device)) if every else (
            args.output, args.json)
        outputs.append((picture, r.picture_writer(picture, steps=args.zoom, **picture_kwargs(args))))
        if json_path:
            outputs.append((json_path, r.json_writer(None if args.fits is None else
                                                     {"fits": fit and fit.to_dict()})))
    print("\n\n".join("\n\n".join(_sections(r, args, fit)) for r, fit in zip(reports, answers)))
    broken = _over_budget(budgets, reports, every)  # a budget that cannot be checked fails before writing
    write_all(outputs)  # all of them or none
    print(f"\nwrote {', '.join(p for p, _ in outputs)}")
    for line in broken:
        print(f"phasemem: {line}", file=sys.stderr)
    return EXIT_OVER_BUDGET if broken else 0


def _sections(r, args, fit) -> list[str]:
    """The report, then what --what-if and --fits asked for."""
    from ..report import format_what_if

    out = [str(r)]
    if args.what_if:
        out.append(format_what_if(r))
    if args.fits is not None:
        out.append(str(fit) if fit is not None else "what fits: nothing to solve (no allocation history)")
    return out


def _fits(r, args):
    """What --fits asked for (solved once: printed, and in --json as ``fits``); None where it was not
    asked or the snapshot has no allocation history to solve it from."""
    return r.fits(args.fits) if args.fits is not None and r.live is None else None


def _over_budget(budgets, reports, every: bool) -> list[str]:
    from ..budgets import check_report

    return [(f"{r.device}: " if every else "") + line for r in reports for line in check_report(budgets, r)]


def _several_ranks(sources: list[str]) -> bool:
    import glob
    import os

    one = sources[0]
    return len(sources) > 1 or os.path.isdir(one) or (glob.has_magic(one) and not os.path.exists(one))


def _load_picture() -> None:
    """The picture's modules (matplotlib: 0.5 s), loaded while the workers analyse the ranks."""
    from ..render import ranks  # noqa: F401


def _run_ranks(args, budgets) -> int:
    """A distributed run: every rank analysed, one report over them, the lanes picture (phasemem.ranks)."""
    from ..errors import PhasememError
    from ..ranks import RunReport, rank_files, rank_summaries

    if args.device == "all" or args.what_if or args.fits is not None:
        flag = "--device all" if args.device == "all" else "--what-if" if args.what_if else "--fits"
        raise PhasememError(f"{flag} reads one snapshot; "
                            "with several ranks, run it on one rank's file")
    got = rank_summaries(rank_files(args.snapshot), workers=args.workers, scheduler=args.scheduler,
                         budgets=budgets, device=args.device, trusted=args.trust, marker_prefix=args.markers,
                         steps=args.zoom, meanwhile=_load_picture)
    summaries = [s for s, _ in got]
    broken = [f"{s.name}: {line}" for s, lines in got for line in lines]
    run = RunReport.of(summaries)
    outputs = [(args.output, run.picture_writer(args.output, size=args.size, dpi=args.dpi))]
    if args.json:
        outputs.append((args.json, run.json_writer()))
    print(run)
    write_all(outputs)  # all of them or none
    print(f"\nwrote {', '.join(p for p, _ in outputs)}")
    for line in broken:
        print(f"phasemem: {line}", file=sys.stderr)
    return EXIT_OVER_BUDGET if broken else 0
