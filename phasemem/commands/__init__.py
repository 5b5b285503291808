"""``phasemem``: small subcommands over one reader (in the style of memray).

    phasemem analyze SNAPSHOT -o memory.png [--json memory.json] [--device N] [--markers PREFIX] [--trust]
                              [--steps 2-4] [--by event|time] [--color category|stack|phase]
                              [--max-bands N] [--size WxH] [--dpi N]
    phasemem plan SNAPSHOT -o plan.png [--json plan.json] [--budget 80GiB] [--batch B] [--ranks 1,2,4,8,16]
                           [--plan ddp,zero1,zero2,fsdp2] [--param-dtype bf16] [--bucket-view] [--keep-unsharded]
    phasemem diff A B [-o diff.png] [--json diff.json] [--steps steady|all|N|N:M] [--fail-if BUDGET ...]
    phasemem convert SNAPSHOT -o trace.npz [--device N] [--markers PREFIX] [--trust]
    phasemem annotate SNAPSHOT -o labelled.pickle [--device N|all] [--markers PREFIX] [--trust]
    phasemem demo [-o demo.png] [--json demo.json] [--device cpu|cuda] [--steps 3] [picture options]

Input phasemem cannot use is reported as one line, ``phasemem: error: ...``, with exit status 2 and
no traceback; bad usage also exits 2, Ctrl-C exits 130. Outputs are written atomically and only
after the analysis succeeded, so a failed run leaves any existing output as it was.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import sys

from .. import progress
from ..errors import PhasememError
from . import analyze, annotate, convert, demo, diff, plan

# One module per subcommand, each with register(subparsers) and run(args); listed in --help order.
COMMANDS = (analyze, plan, diff, annotate, convert, demo)

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status instead of exiting.

    Example:
        >>> from phasemem.commands.cli import main
        >>> main(["analyze", "snapshot.pickle", "-o", "memory.png", "--json", "memory.json"])
        0
    """
    parser = _parser()
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # argparse: --help (0) or bad usage (2), already printed
            return _code(e)
        with progress.shown():  # a line on stderr while a long read or analysis runs, on a terminal
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


class _Parser(argparse.ArgumentParser):
    """argparse's parser, but a subcommand refuses an option it does not know itself, with its own
    usage (argparse leaves it to the top level, whose usage says nothing of the subcommand's
    options), and a wrong option or choice is answered with the nearest right one."""

    def parse_known_args(self, args=None, namespace=None):
        ns, extra = super().parse_known_args(args, namespace)
        if extra:
            self.error(f"unrecognized argument{'s' if len(extra) > 1 else ''}: {' '.join(extra)}"
                       + _nearest(extra, list(self._option_string_actions)))
        return ns, extra

    def error(self, message: str):
        m = re.match(r"argument \S+: invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if m:
            message += _nearest([m.group(1)], re.findall(r"'([^']*)'", m.group(2)))
        super().error(message)


#: How alike a wrong word must be to a right one to be suggested (difflib's ratio: --jsn / --json 0.91).
SUGGEST_CUTOFF = 0.6


def _nearest(words: list[str], known: list[str]) -> str:
    """"; did you mean --json?" for the first word that is near a known one, else ""."""
    for word in words:
        close = difflib.get_close_matches(word.split("=", 1)[0], known, n=1, cutoff=SUGGEST_CUTOFF)
        if close:
            return f"; did you mean {close[0]}?"
    return ""


def _parser() -> argparse.ArgumentParser:
    from .. import __version__

    p = _Parser(
        prog="phasemem",
        description="Read a PyTorch memory snapshot: training steps, their phases, and what peaked where.",
    )
    p.add_argument("--version", action="version", version=f"phasemem {__version__}")
    sub = p.add_subparsers(title="commands", metavar="COMMAND", required=True)

    for command in COMMANDS:
        command.register(sub)
    return p
