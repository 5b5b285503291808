"""``phasemem analyze``: the report, the picture, the JSON of a snapshot (one device or all)."""
from __future__ import annotations

import sys

from .. import progress
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
    a.add_argument("--full", action="store_true",
                   help="print the whole report: every step's phases and every shape found (default: a screen "
                        "or two: the peak, the typical step and the steps that differ, each shape kind once)")
    a.add_argument("--fits", metavar="BUDGET", default=None,
                   help="also print the largest batch and sequence factors predicted to fit in BUDGET (80GiB: "
                        "a card's memory), with the allocator's reserve, and the remedies that let the next fit")
    a.add_argument("--plan", dest="plans", action="append", default=[], metavar="PLAN[:RANKS]",
                   help="also print what each rank would hold under a parallel plan, repeatable: ddp, zero1, "
                        "zero2 or fsdp2, with the ranks after a colon (fsdp2:8); with --fits, the largest batch "
                        "per rank under each")
    a.add_argument("--param-dtype", dest="param_dtype", default=None, metavar="DTYPE",
                   help="fsdp2 plans: the dtype FSDP2 gathers the parameters in (MixedPrecisionPolicy), bf16 or "
                        "fp16 (default: the trace's own)")
    a.add_argument("--bucket-view", dest="bucket_view", action="store_true",
                   help="ddp and zero1 plans: DDP with gradient_as_bucket_view=True")
    a.add_argument("--keep-unsharded", dest="keep_unsharded", action="store_true",
                   help="fsdp2 plans: reshard_after_forward=False (each layer kept whole from forward to backward)")
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
    from ..report.budgets import parse_budgets
    from ..report.pipeline import analyze
    from ..reporters.picture.draw import visible_range
    from ..steps import parse_steps

    budgets = parse_budgets(args.fail_if, absolute=True)  # one that does not parse fails now, not as a pass
    if args.fits is not None:
        from ..units import parse_size

        parse_size(args.fits)  # a malformed size fails now, not after a long analysis
    check_outputs(args.output, args.json)
    parse_steps(args.zoom)  # a malformed range fails now, not after a long analysis
    _plans_asked(args)  # a malformed plan fails now too
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
    planned = [_plans(r, args) for r in reports]
    for r, fit, plans in zip(reports, answers, planned):
        if r.live is None:
            visible_range(r, args.zoom)  # steps the report does not have: say so instead of the report
        picture, json_path = (per_device(args.output, r.device), per_device(args.json, r.device)) if every else (
            args.output, args.json)
        progress.stage(f"drawing {picture}")
        outputs.append((picture, r.picture_writer(picture, steps=args.zoom, **picture_kwargs(args))))
        if json_path:
            extra = {} if args.fits is None else {"fits": fit and fit.to_dict()}
            if args.plans:
                extra["plans"] = [dict(p.to_dict(), fits=pf and pf.to_dict()) for p, pf in plans]
            outputs.append((json_path, r.json_writer(extra or None)))
    print("\n\n".join("\n\n".join(_sections(r, args, fit, plans))
                       for r, fit, plans in zip(reports, answers, planned)))
    broken = _over_budget(budgets, reports, every)  # a budget that cannot be checked fails before writing
    write_all(outputs)  # all of them or none
    print(f"\nwrote {', '.join(p for p, _ in outputs)}")
    for line in broken:
        print(f"phasemem: {line}", file=sys.stderr)
    return EXIT_OVER_BUDGET if broken else 0


def _sections(r, args, fit, plans) -> list[str]:
    """The report, then what --what-if, --fits and --plan asked for."""
    from ..reporters.text.full import format_what_if

    out = [r.text(full=args.full)]
    if args.what_if:
        out.append(format_what_if(r))
    if args.fits is not None:
        out.append(str(fit) if fit is not None else "what fits: nothing to solve (no allocation history)")
    if args.plans:
        lines = ["parallel plans (per rank, replayed on this trace; docs/plans.md):"]
        for p, pf in plans:
            lines.append(str(p))
            if pf is not None:
                lines.append("\n".join("    " + x for x in str(pf).splitlines()))
        out.append("\n".join(lines))
    return out


def _plans_asked(args) -> list[tuple[str, int, dict]]:
    from ..predictions.plans import dtype_bytes, parse_plan

    if args.param_dtype is not None:
        dtype_bytes(args.param_dtype)
    out = []
    for text in args.plans:
        name, n = parse_plan(text)
        kw = {}
        if name == "fsdp2":
            kw = {"param_dtype": args.param_dtype, "reshard_after_forward": not args.keep_unsharded}
        elif name in ("ddp", "zero1"):
            kw = {"bucket_view": args.bucket_view}
        out.append((name, n, kw))
    return out


def _plans(r, args):
    """Each --plan's answer, with its per-rank fits where --fits asked (None where it does not apply)."""
    if not args.plans or r.live is not None:
        return []
    progress.stage("replaying the plans")
    out = []
    for name, n, kw in _plans_asked(args):
        p = r.plan(name, n, **kw)
        pf = r.fits(args.fits, plan=name, ranks=n, **kw) if (args.fits is not None and p.applies) else None
        out.append((p, pf))
    return out


def _fits(r, args):
    """What --fits asked for (solved once: printed, and in --json as ``fits``); None where it was not
    asked or the snapshot has no allocation history to solve it from."""
    if args.fits is None or r.live is not None:
        return None
    progress.stage("solving what fits")
    return r.fits(args.fits)


def _over_budget(budgets, reports, every: bool) -> list[str]:
    from ..report.budgets import check_report

    return [(f"{r.device}: " if every else "") + line for r in reports for line in check_report(budgets, r)]


def _several_ranks(sources: list[str]) -> bool:
    import glob
    import os

    one = sources[0]
    return len(sources) > 1 or os.path.isdir(one) or (glob.has_magic(one) and not os.path.exists(one))


def _load_picture() -> None:
    """The picture's modules (matplotlib: 0.5 s), loaded while the workers analyse the ranks."""
    from ..reporters.picture import ranks  # noqa: F401


def _run_ranks(args, budgets) -> int:
    """A distributed run: every rank analysed, one report over them, the lanes picture (phasemem.distributed.run_report)."""
    from ..distributed.pool import rank_summaries
    from ..distributed.rank_files import rank_files
    from ..distributed.run_report import RunReport
    from ..errors import PhasememError

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
    print(run.text(full=args.full))
    write_all(outputs)  # all of them or none
    print(f"\nwrote {', '.join(p for p, _ in outputs)}")
    for line in broken:
        print(f"phasemem: {line}", file=sys.stderr)
    return EXIT_OVER_BUDGET if broken else 0
