"""``phasemem annotate``: the snapshot with phasemem's steps, phases, shapes and categories written into
it, for pytorch.org/memory_viz and torch's own ``_memory_viz`` tooling (phasemem/annotate.py)."""
from __future__ import annotations

import os

from ..errors import PhasememError
from ..output import write_all
from .options import check_outputs, device_choice

# memory_viz reads the raw pickle it is given, never a compressed one.
_COMPRESSED = (".gz", ".xz", ".bz2", ".zip")


def register(sub) -> None:
    a = sub.add_parser(
        "annotate", help="write phasemem's labels into a snapshot, for pytorch.org/memory_viz",
        description="Analyse a snapshot and write a copy of it with phasemem's labels in the forms memory_viz "
                    "shows: each allocation's category (the band colours and legend) and step, phase and shape "
                    "(its user_metadata, printed on hover), plus START/END ranges of every step, phase and "
                    "shape in external_annotations. Pickle protocol 4; the rest of the snapshot unchanged.",
    )
    a.add_argument("snapshot", metavar="SNAPSHOT", help="the snapshot file (plain, .gz or .xz)")
    a.add_argument("-o", "--output", required=True, metavar="LABELLED.pickle",
                   help="the labelled snapshot to write (a plain pickle: memory_viz reads no compressed file)")
    a.add_argument("--device", type=device_choice, metavar="N|all",
                   help="which device's trace to label, or 'all' (default: the busiest)")
    a.add_argument("--markers", default=None, metavar="PREFIX",
                   help="name prefix of the phase markers (default: the snapshot's own, else phasemem::)")
    a.add_argument("--trust", action="store_true",
                   help="unpickle without restrictions (only for files you made yourself)")
    a.set_defaults(run=run)


def run(args) -> int:
    from ..errors import NoHistory
    from ..read.snapshot import read_snapshot_file
    from ..report.pipeline import analyze
    from ..reporters.memory_viz import annotate, memoryviz_pickle, summary

    _check_paths(args.snapshot, args.output)
    try:
        snap = read_snapshot_file(args.snapshot, trusted=args.trust)
    except NoHistory:
        raise PhasememError(f"{args.snapshot}: the snapshot holds no allocation history, so there are no steps, "
                            "phases or allocations to label") from None
    first = analyze(snap, None if args.device == "all" else args.device, marker_prefix=args.markers)
    reports = [first]
    if args.device == "all":
        reports += [analyze(snap, d.index, marker_prefix=args.markers) for d in first.other_devices if d.events]
    labels = annotate(snap, reports)
    data = memoryviz_pickle(labels.snapshot)

    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(data)

    print(f"labelled {', '.join(r.device for r in reports)}: {summary(labels)}")
    write_all([(args.output, write)])
    print(f"wrote {args.output} (pickle protocol 4): open it in pytorch.org/memory_viz, or "
          f"python -m torch.cuda._memory_viz trace_plot {args.output} -o trace.html")
    return 0


def _check_paths(snapshot: str, output: str) -> None:
    check_outputs(output)
    if output.lower().endswith(_COMPRESSED):
        raise PhasememError(f"{output}: memory_viz reads a plain pickle; name the output .pickle")
    if os.path.exists(output) and os.path.exists(snapshot) and os.path.samefile(output, snapshot):
        raise PhasememError(f"{output}: is the snapshot being read; write the labelled copy to another file")
