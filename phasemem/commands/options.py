"""What the subcommands share: argument types, the picture options, checking output paths first."""
from __future__ import annotations

import argparse
import os
from typing import overload

from ..errors import PhasememError
from ..output import MAX_PICTURE, MIN_PICTURE, PICTURE_SIZES

_PICTURE_EXTS = (".png", ".svg", ".pdf", ".html")


def picture_size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give the picture size as WIDTHxHEIGHT in pixels, e.g. 1600x900") from None
    if not (MIN_PICTURE[0] <= w <= MAX_PICTURE and MIN_PICTURE[1] <= h <= MAX_PICTURE):
        raise argparse.ArgumentTypeError(f"{text!r}: {PICTURE_SIZES}")
    return w, h


def dpi_number(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: the dpi is a whole number, e.g. 100") from None
    if not 10 <= v <= 2000:
        raise argparse.ArgumentTypeError(f"{text!r}: use a dpi from 10 to 2000")
    return v


def picture_file(text: str) -> str:
    if os.path.splitext(text)[1].lower() not in _PICTURE_EXTS:
        raise argparse.ArgumentTypeError(f"{text!r}: name the picture .png, .svg or .pdf, or the interactive page .html")
    return text


def band_count(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = -1
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the number of bands is a whole number >= 0, e.g. 2000")
    return v


def device_choice(text: str):
    if text == "all":
        return text
    try:
        v = int(text)
    except ValueError:
        v = -1
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a device number (0, 1, ...) or 'all'")
    return v


@overload
def per_device(path: str, device: str) -> str: ...
@overload
def per_device(path: None, device: str) -> None: ...
def per_device(path: str | None, device: str) -> str | None:
    """memory.png → memory.cuda1.png: one file per device with --device all."""
    if path is None:
        return None
    root, ext = os.path.splitext(path)
    return f"{root}.{device.replace(':', '')}{ext}"


def step_count(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the number of steps is a whole number >= 1")
    return v


def picture_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("picture")
    g.add_argument("--by", choices=("event", "time"), default="event",
                   help="x axis: position in the allocator trace, or time (default: event)")
    g.add_argument("--color", choices=("category", "stack", "phase"), default="category",
                   help="colour the allocation bands by category, by call site, or by the phase that made them "
                        "(default: category)")
    g.add_argument("--max-bands", type=band_count, default=2000, metavar="N",
                   help="draw the N largest allocations one by one, the rest summed in one band (default: 2000)")
    g.add_argument("--size", type=picture_size, default=(1600, 900), metavar="WxH",
                   help="picture size in pixels (default: 1600x900)")
    g.add_argument("--dpi", type=dpi_number, default=100, metavar="N", help="dots per inch: text size (default: 100)")


def picture_kwargs(args) -> dict:
    return dict(size=args.size, dpi=args.dpi, by=args.by, color=args.color, max_bands=args.max_bands)


def check_outputs(*paths: str | None) -> None:
    # Fail before the (possibly long) analysis, not after it.
    for path in paths:
        if path is None:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise PhasememError(f"{path}: the folder {folder} does not exist; create it or choose another output path")
        if os.path.isdir(path):
            raise PhasememError(f"{path}: is a directory; give a file name")



