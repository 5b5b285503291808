"""Stretch a real snapshot to millions of events by repeating its steady-state steps, keeping the
sharing of frame objects that torch writes.

How torch shares frames (read from ``fixtures/plain_gpt_torch_defaults``, ``stacks="all"``, by
``id()`` after loading; ``torch/csrc/cuda/memory_snapshot.cpp`` symbolizes the unique tracebacks
once): every distinct frame is ONE dict, referenced by every list it occurs in (465 dicts for
43,957 references, 446 of them used in more than one step); every captured traceback is ONE list,
shared by the entries that carry it (an ``alloc`` has its own, the ``free_requested`` and
``free_completed`` of a block share the free's, a ``segment_alloc`` shares the ``alloc`` that
caused it: 947 lists for 1,398 entries), and no list is used in two steps: each step captures new
tracebacks. So a faithful copy of a step (``--share torch``, the default) gets new list objects,
one per list of the seed step, shared among its entries as in the seed, holding the seed's frame
dicts; pickle's memo then writes each frame once and each list as a run of references. String
values that are a new object in every seed entry (``compile_context``'s ``'N/A'``) are new in
every copy too. ``--share lists`` reuses the seed's list objects in every copy instead (each list
written once in the whole file: smaller, and what an allocator with one cached traceback per call
site would write).

Times are shifted by the block's duration per copy, the annotations repeated with them;
addresses of each middle copy move to a range of their own, and the frees with which a copy
releases what the copy before it left alive are pointed at those allocations (matched by size), so
allocs and frees pair up as in a real run. The first and last copies keep the seed's addresses
(the ``segments`` describe the end). Segment events are kept in the first copy only.

Run (from the repository root), then analyse the output like any snapshot:

    python3 benchmarks/scale_snapshot.py fixtures/plain_gpt_torch_defaults.pkl.xz /tmp/big.pickle \
        --events 1000000 [--share torch|lists|none] [--python-frames] [--first 1 --last 2] [--marker gt::optimizer]
"""
from __future__ import annotations

import argparse
import bz2
import gzip
import lzma
import os
import pickle
import sys

STRIDE = 1 << 40  # address offset per copy: beyond any real device's address range
_OPEN = {".xz": lzma.open, ".gz": gzip.open, ".bz2": bz2.open}


def read_seed(path: str) -> dict:
    """The snapshot dict of a (compressed) pickle, also inside a ``{"snapshot": ...}`` wrapper."""
    with _OPEN.get(os.path.splitext(path)[1], open)(path, "rb") as f:
        obj = pickle.load(f)
    return obj["snapshot"] if isinstance(obj, dict) and "device_traces" not in obj else obj


def step_ends(snap: dict, marker: str | None = None) -> list[int]:
    """Times where steps end: the END of ``marker`` (default: ``<prefix>optimizer`` for the
    snapshot's marker prefix, else torch's own ``Optimizer.step#...`` range)."""
    anns = snap.get("external_annotations") or []
    names = {a.get("name") for a in anns}
    if marker is None:
        prefix = (snap.get("phasemem") or {}).get("markers") or "phasemem::"
        marker = prefix + "optimizer"
        if marker not in names:
            marker = next((n for n in sorted(names) if str(n).startswith("Optimizer.step#")), marker)
    ends = sorted(a["time_us"] for a in anns if a.get("name") == marker and a.get("stage") == "END")
    if len(ends) < 2:
        raise SystemExit(f"the seed has {len(ends)} END annotations named {marker!r}; pass --marker")
    return ends


def busiest(snap: dict) -> int:
    traces = snap["device_traces"]
    return max(range(len(traces)), key=lambda d: len(traces[d]))


def _hand_over(block: list) -> tuple[set, dict]:
    """Which of the block's frees release what it did not allocate, and, for those addresses, the
    address of the allocation the previous copy left alive in their place (matched by size)."""
    live: dict[int, int] = {}
    inherited: list[tuple[int, int]] = []
    frees_inherited = set()
    for i, e in enumerate(block):
        act = e["action"]
        if act == "alloc":
            live[e["addr"]] = e["size"]
        elif act in ("free_requested", "free_completed") and e["addr"] not in live:
            frees_inherited.add(i)
            if act == "free_completed":
                inherited.append((e["size"], e["addr"]))
        elif act == "free_completed":
            del live[e["addr"]]
    handed, inherited = sorted((s, a) for a, s in live.items()), sorted(inherited)
    if [s for s, _ in handed] != [s for s, _ in inherited]:
        raise SystemExit("the steps chosen do not end in the state they start in; pick others (--first/--last)")
    return frees_inherited, {a_in: a_out for (_, a_in), (_, a_out) in zip(inherited, handed)}


def _own_strings(events: list) -> list[str]:
    """Keys whose string values are a separate object in every entry (as torch writes
    ``compile_context``), so that copies get separate ones too."""
    keys = {k for e in events for k, v in e.items() if isinstance(v, str) and len(v) > 1 and k != "action"}
    return sorted(k for k in keys if len({id(e.get(k)) for e in events}) == len(events))


def replicate(snap: dict, copies: int, *, first: int = 1, last: int = 2, marker: str | None = None,
              share: str = "torch") -> dict:
    """A new snapshot whose steps ``first..last`` are repeated ``copies`` times in a row."""
    device = busiest(snap)
    events, anns = snap["device_traces"][device], snap.get("external_annotations") or []
    ends = step_ends(snap, marker)
    t_a = ends[first - 1] if first > 0 else min(e["time_us"] for e in events) - 1
    t_b = ends[last]
    span = t_b - t_a

    def split(items):
        return ([x for x in items if x["time_us"] <= t_a], [x for x in items if t_a < x["time_us"] <= t_b],
                [x for x in items if x["time_us"] > t_b])

    ev_head, ev_block, ev_tail = split(events)
    an_head, an_block, an_tail = split(anns)
    frees_inherited, takes = _hand_over(ev_block)
    own = _own_strings(ev_block)

    def offset(k):
        return 0 if k == 0 or (k == copies - 1 and copies > 2) else k * STRIDE

    out_events, out_anns = list(ev_head), list(an_head)
    for k in range(copies):
        dt, off, prev = k * span, offset(k), offset(k - 1)
        if k == 0:
            out_events += ev_block
            out_anns += an_block
            continue
        lists: dict[int, list] = {}  # this copy's traceback lists, one per seed list

        def fresh(e):  # the string values torch makes anew for every entry ('N/A' compile_context)
            return {k: e[k].encode().decode() for k in own} if own and share == "torch" else {}

        def frames(fr):
            if share == "lists" or not isinstance(fr, list):
                return fr
            new = lists.get(id(fr))
            if new is None:
                new = lists[id(fr)] = list(fr)  # the same frame dicts, in a list of this step's own
            return new

        for i, e in enumerate(ev_block):
            if e["action"].startswith("segment_"):
                continue
            addr = takes[e["addr"]] + prev if i in frees_inherited else e["addr"] + off
            out_events.append({**e, **fresh(e), "time_us": e["time_us"] + dt, "addr": addr,
                               "frames": frames(e.get("frames"))})
        out_anns += [{**a, "time_us": a["time_us"] + dt} for a in an_block]
    shift = (copies - 1) * span
    out_events += [{**e, "time_us": e["time_us"] + shift} for e in ev_tail]
    out_anns += [{**a, "time_us": a["time_us"] + shift} for a in an_tail]
    traces = list(snap["device_traces"])
    traces[device] = out_events
    return {**snap, "device_traces": traces, "external_annotations": out_anns}


def unshare(snap: dict) -> dict:
    """Every event with a frames list of its own, holding frame dicts of its own (copies): the form
    of a snapshot that went through JSON, or was built entry by entry by another tool. Pickle's memo
    then shares nothing between events: each one spells out its whole traceback."""
    traces = [[{**e, "frames": [dict(f) for f in e["frames"]]} if isinstance(e.get("frames"), list) else e
               for e in t] for t in snap["device_traces"]]
    return {**snap, "device_traces": traces}


def python_frames(snap: dict) -> dict:
    """The snapshot as ``stacks="python"`` records it: only the Python frames (``*.py``), the
    sharing of lists and frame dicts kept (one new list per list object)."""
    lists: dict[int, list] = {}

    def keep(fr):
        if not isinstance(fr, list):
            return fr
        new = lists.get(id(fr))
        if new is None:
            new = lists[id(fr)] = [f for f in fr if str(f.get("filename", "")).endswith(".py")]
        return new

    traces = [[{**e, "frames": keep(e.get("frames"))} for e in t] for t in snap["device_traces"]]
    return {**snap, "device_traces": traces}


def copies_for(snap: dict, events: int, **kw) -> int:
    """How many copies give about ``events`` events."""
    n0 = len(snap["device_traces"][busiest(snap)])
    per_copy = len(replicate(snap, 2, **kw)["device_traces"][busiest(snap)]) - n0
    return max(1, round((events - n0) / per_copy) + 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("seed", help="a snapshot pickle (.pickle, .pkl.xz, .gz)")
    ap.add_argument("out", help="where to write the stretched pickle (plain, as _dump_snapshot writes)")
    ap.add_argument("--events", type=int, default=1_000_000, help="about how many events (default 1,000,000)")
    ap.add_argument("--bytes", type=float, help="instead of --events: about this many bytes on disk (e.g. 1e9)")
    ap.add_argument("--first", type=int, default=1, help="first step repeated (default 1)")
    ap.add_argument("--last", type=int, default=2, help="last step repeated (default 2)")
    ap.add_argument("--marker", help="annotation whose END closes a step (default: the optimizer's)")
    ap.add_argument("--share", choices=("torch", "lists", "none"), default="torch",
                    help="torch: new lists per step, shared frame dicts (default); lists: the seed's lists reused; "
                         "none: every event its own list of its own frame dicts (a snapshot rebuilt by other tools)")
    ap.add_argument("--python-frames", action="store_true", help="keep only Python frames (stacks='python')")
    args = ap.parse_args(argv)
    snap = read_seed(args.seed)
    if args.python_frames:
        snap = python_frames(snap)
    kw = dict(first=args.first, last=args.last, marker=args.marker,
              share="lists" if args.share == "none" else args.share)
    events = args.events
    if args.bytes:  # bytes per event measured on a small stretch, then scaled
        probe = replicate(snap, 20, **kw)
        events = int(args.bytes / (len(pickle.dumps(probe)) / len(probe["device_traces"][busiest(snap)])))
    copies = copies_for(snap, events, **kw)
    big = replicate(snap, copies, **kw)
    if args.share == "none":
        big = unshare(big)
    with open(args.out + ".tmp", "wb") as f:
        pickle.dump(big, f)  # as torch.cuda.memory._dump_snapshot: the default protocol
    os.replace(args.out + ".tmp", args.out)
    n = len(big["device_traces"][busiest(snap)])
    print(f"{args.out}: {n:,} events ({copies} copies of steps {args.first}-{args.last}, share={args.share}), "
          f"{os.path.getsize(args.out) / 2**20:,.1f} MiB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
