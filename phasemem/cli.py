"""``phasemem``: small subcommands over one reader (in the style of memray).

    phasemem analyze SNAPSHOT -o memory.png [--json memory.json] [--device N] [--markers PREFIX] [--trust]
                              [--steps 2-4] [--by event|time] [--color category|stack|phase]
                              [--max-bands N] [--size WxH] [--dpi N]
    phasemem convert SNAPSHOT -o trace.npz [--device N] [--markers PREFIX] [--trust]
    phasemem demo [-o demo.png] [--json demo.json] [--device cpu|cuda] [--steps 3] [picture options]

Input phasemem cannot use is reported as one line, ``phasemem: error: ...``, with exit status 2 and
no traceback; bad usage also exits 2, Ctrl-C exits 130. Outputs are written atomically and only
after the analysis succeeded, so a failed run leaves any existing output as it was.
"""
from __future__ import annotations

import argparse
import os
import sys

from .errors import PhasememError
from .output import MAX_PICTURE, MIN_PICTURE, PICTURE_SIZES, write_all
from .vocab import MARKER_PREFIX

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
_PICTURE_EXTS = (".png", ".svg", ".pdf")


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status instead of exiting.

    Example:
        >>> from phasemem.cli import main
        >>> main(["analyze", "snapshot.pickle", "-o", "memory.png", "--json", "memory.json"])
        0
    """
    parser = _parser()
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # argparse: --help (0) or bad usage (2), already printed
            return _code(e)
        return args.run(args)
    except PhasememError as e:
        _error(str(e))
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `phasemem analyze x | head`: the reader left; the rest of the report is not wanted.
        _silence_stdout()
        return 0


def _code(e: SystemExit) -> int:
    return e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_ERROR)


def _error(message: str) -> None:
    # One line whatever the message holds: scripts grep for it, humans read it.
    line = " ".join(message.split())
    print(f"phasemem: error: {line}", file=sys.stderr)


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


# -- argument types -------------------------------------------------------------------------------


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give the picture size as WIDTHxHEIGHT in pixels, e.g. 1600x900") from None
    if not (MIN_PICTURE[0] <= w <= MAX_PICTURE and MIN_PICTURE[1] <= h <= MAX_PICTURE):
        raise argparse.ArgumentTypeError(f"{text!r}: {PICTURE_SIZES}")
    return w, h


def _dpi(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: the dpi is a whole number, e.g. 100") from None
    if not 10 <= v <= 2000:
        raise argparse.ArgumentTypeError(f"{text!r}: use a dpi from 10 to 2000")
    return v


def _picture(text: str) -> str:
    if os.path.splitext(text)[1].lower() not in _PICTURE_EXTS:
        raise argparse.ArgumentTypeError(f"{text!r}: name the picture .png, .svg or .pdf")
    return text


def _bands(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = -1
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the number of bands is a whole number >= 0, e.g. 2000")
    return v


def _device(text: str):
    if text == "all":
        return text
    try:
        v = int(text)
    except ValueError:
        v = -1
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a device number (0, 1, ...) or 'all'")
    return v


def _per_device(path: str | None, device: str) -> str | None:
    """memory.png → memory.cuda1.png: one file per device with --device all."""
    if path is None:
        return None
    root, ext = os.path.splitext(path)
    return f"{root}.{device.replace(':', '')}{ext}"


def _steps(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the number of steps is a whole number >= 1")
    return v


# -- commands -------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(
        prog="phasemem",
        description="Read a PyTorch memory snapshot: training steps, their phases, and what peaked where.",
    )
    p.add_argument("--version", action="version", version=f"phasemem {__version__}")
    sub = p.add_subparsers(title="commands", metavar="COMMAND", required=True)

    _analyze_parser(sub)
    _convert_parser(sub)
    _demo_parser(sub)
    return p


def _analyze_parser(sub) -> None:
    a = sub.add_parser(
        "analyze", help="analyse a snapshot pickle: print the report, draw the picture",
        description="Analyse a torch.cuda.memory._dump_snapshot pickle (plain, .gz or .xz): print the "
                    "report and draw the labeled picture.",
    )
    a.add_argument("snapshot", metavar="SNAPSHOT", help="the snapshot file")
    a.add_argument("-o", "--output", type=_picture, default="memory.png", metavar="PICTURE",
                   help="picture to write: .png, .svg or .pdf (default: memory.png)")
    a.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    a.add_argument("--device", type=_device, metavar="N|all",
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
    _picture_options(a)
    a.set_defaults(run=_analyze)


def _convert_parser(sub) -> None:
    v = sub.add_parser(
        "convert", help="save a snapshot's trace in phasemem's columnar form, to analyse it again fast",
        description="Read a snapshot once and write its trace as a columnar .npz: analysing that again "
                    "needs no unpickling (seconds and a fraction of the memory for a 10M-event trace).",
    )
    v.add_argument("snapshot", metavar="SNAPSHOT", help="the snapshot file")
    v.add_argument("-o", "--output", required=True, metavar="TRACE.npz", help="the columnar file to write")
    v.add_argument("--device", type=int, metavar="N", help="which device's trace (default: the busiest)")
    v.add_argument("--markers", default=None, metavar="PREFIX",
                   help="name prefix of the phase markers its step index is built for, and the default when "
                        "analysing the file (default: the snapshot's own, else phasemem::)")
    v.add_argument("--trust", action="store_true",
                   help="unpickle without restrictions (only for files you made yourself)")
    v.set_defaults(run=_convert)


def _demo_parser(sub) -> None:
    d = sub.add_parser(
        "demo", help="train a small GPT-like model for a few steps under instrument() and analyse it",
        description="Train a small GPT-like language model for a few steps inside phasemem.instrument(), "
                    "print the report and draw the picture.",
    )
    d.add_argument("-o", "--output", type=_picture, default="demo.png", metavar="PICTURE",
                   help="picture to write (default: demo.png)")
    d.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    d.add_argument("--device", choices=("cpu", "cuda"), help="where to train (default: cuda if available)")
    d.add_argument("--steps", type=_steps, default=3, help="training steps to record (default: 3)")
    _picture_options(d)
    d.set_defaults(run=_demo)


def _picture_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("picture")
    g.add_argument("--by", choices=("event", "time"), default="event",
                   help="x axis: position in the allocator trace, or time (default: event)")
    g.add_argument("--color", choices=("category", "stack", "phase"), default="category",
                   help="colour the allocation bands by category, by call site, or by the phase that made them "
                        "(default: category)")
    g.add_argument("--max-bands", type=_bands, default=2000, metavar="N",
                   help="draw the N largest allocations one by one, the rest summed in one band (default: 2000)")
    g.add_argument("--size", type=_size, default=(1600, 900), metavar="WxH",
                   help="picture size in pixels (default: 1600x900)")
    g.add_argument("--dpi", type=_dpi, default=100, metavar="N", help="dots per inch: text size (default: 100)")


def _picture_kwargs(args) -> dict:
    return dict(size=args.size, dpi=args.dpi, by=args.by, color=args.color, max_bands=args.max_bands)


def _check_outputs(*paths: str | None) -> None:
    # Fail before the (possibly long) analysis, not after it.
    for path in paths:
        if path is None:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise PhasememError(f"{path}: the folder {folder} does not exist; create it or choose another output path")
        if os.path.isdir(path):
            raise PhasememError(f"{path}: is a directory; give a file name")


def _analyze(args) -> int:
    from .analyze import analyze
    from .render import visible_range
    from .steps import parse_steps

    _check_outputs(args.output, args.json)
    parse_steps(args.zoom)  # a malformed range fails now, not after a long analysis
    every = args.device == "all"
    report = analyze(args.snapshot, None if every else args.device, trusted=args.trust,
                     marker_prefix=args.markers, steps=args.zoom)
    reports = [report]
    if every:
        reports += [analyze(args.snapshot, d.index, trusted=args.trust, marker_prefix=args.markers, steps=args.zoom)
                    for d in report.other_devices if d.events]
        reports.sort(key=lambda r: r.device)
    outputs = []
    for r in reports:
        if r.live is None:
            visible_range(r, args.zoom)  # steps the report does not have: say so instead of the report
        picture, json_path = (_per_device(args.output, r.device), _per_device(args.json, r.device)) if every else (
            args.output, args.json)
        outputs.append((picture, r.picture_writer(picture, steps=args.zoom, **_picture_kwargs(args))))
        if json_path:
            outputs.append((json_path, r.json_writer()))
    print("\n\n".join(str(r) for r in reports))
    write_all(outputs)  # all of them or none
    print(f"\nwrote {', '.join(p for p, _ in outputs)}")
    return 0


def _convert(args) -> int:
    from .columnar import save_trace
    from .load import no_gc
    from .slicing import build_index
    from .stream import read_trace

    if not args.output.endswith(".npz"):
        raise PhasememError(f"{args.output}: name the columnar file .npz")
    _check_outputs(args.output)
    with no_gc():
        trace = read_trace(args.snapshot, args.device, trusted=args.trust)
        prefix = args.markers if args.markers is not None else str(trace.meta.get("markers") or MARKER_PREFIX)
        index = build_index(trace, prefix)
    save_trace(trace, args.output, index)
    steps = (f"{len(index)} step(s) indexed, so --steps reads only its steps" if index.exact
             else f"--steps will analyse every step ({index.reason})")
    print(f"wrote {args.output}: device {trace.device}, {len(trace):,} events; {steps}; "
          f"analyse it with: phasemem analyze {args.output}")
    return 0


def _demo(args) -> int:
    from . import demo

    _check_outputs(args.output, args.json)
    report = demo.run(device=args.device, steps=args.steps, out=None, json_path=None)
    print(report)
    outputs = [(args.output, report.picture_writer(args.output, **_picture_kwargs(args)))]
    if args.json:
        outputs.append((args.json, report.json_writer()))
    write_all(outputs)
    print(f"\nwrote {', '.join(p for p in (args.output, args.json) if p)}")
    return 0

