"""``phasemem convert``: a snapshot's trace as a columnar .npz, to analyse it again without unpickling."""
from __future__ import annotations

from .. import progress
from ..errors import PhasememError
from ..vocab import MARKER_PREFIX
from .options import check_outputs


def register(sub) -> None:
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
    v.set_defaults(run=run)


def run(args) -> int:
    from ..analysis.step_index import build_index
    from ..read import trace as read_trace
    from ..read.columnar import save_trace
    from ..read.trace import no_gc

    if not args.output.endswith(".npz"):
        raise PhasememError(f"{args.output}: name the columnar file .npz")
    check_outputs(args.output)
    with no_gc():
        trace = read_trace(args.snapshot, args.device, trusted=args.trust)
        prefix = args.markers if args.markers is not None else str(trace.meta.get("markers") or MARKER_PREFIX)
        progress.stage(f"indexing the steps of {len(trace):,} events")
        index = build_index(trace, prefix)
    save_trace(trace, args.output, index)
    steps = (f"{len(index)} step(s) indexed, so --steps reads only its steps" if index.exact
             else f"--steps will analyse every step ({index.reason})")
    print(f"wrote {args.output}: device {trace.device}, {len(trace):,} events; {steps}; "
          f"analyse it with: phasemem analyze {args.output}")
    return 0
