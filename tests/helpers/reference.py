"""A deliberately naive, per-event re-implementation of the numbers phasemem computes.

It shares no code with phasemem: tests compare the two on real traces.
"""


def replay(events, segments, device=0):
    """Active bytes after each event, replaying the raw trace as memory_viz does."""
    live = {}
    preexisting = 0
    deltas = []
    for e in events:
        a = e["action"]
        if a == "alloc":
            if e["addr"] in live:  # lost free
                deltas.append(e["size"] - live[e["addr"]])
            else:
                deltas.append(e["size"])
            live[e["addr"]] = e["size"]
        elif a in ("free_completed", "free"):
            if e["addr"] in live:
                deltas.append(-live.pop(e["addr"]))
            else:
                preexisting += e["size"]
                deltas.append(-e["size"])
        else:
            deltas.append(0)
    for seg in segments:
        if seg.get("device", device) not in (device, -1):
            continue
        for b in seg["blocks"]:
            if b["state"] in ("active_allocated", "active_pending_free") and b["address"] not in live:
                preexisting += b.get("requested_size", b["size"])
    out, cur = [], preexisting
    for d in deltas:
        cur += d
        out.append(cur)
    return preexisting, out, deltas


def intervals(annotations, prefix):
    """{phase: [(t0, t1), ...]} from START/END annotations with the given name prefix."""
    opened, out = {}, {}
    for a in sorted(annotations, key=lambda a: a["time_us"]):
        if not a["name"].startswith(prefix):
            continue
        ph = a["name"][len(prefix):]
        if a["stage"] == "START":
            opened.setdefault(ph, []).append(a["time_us"])
        else:
            out.setdefault(ph, []).append((opened[ph].pop(), a["time_us"]))
    return out


def label_events(events, ivs, phases=("forward", "zero_grad", "backward", "optimizer"), starts=None):
    """Innermost marked phase of each event by time ('other' outside all).

    ``starts``, if given, receives the START time of the innermost interval (None outside all).
    """
    labels = []
    for e in events:
        t = e["time_us"]
        best, best_t0 = "other", None
        for ph in phases:
            for t0, t1 in ivs.get(ph, []):
                if t0 <= t <= t1 and (best_t0 is None or t0 > best_t0):
                    best, best_t0 = ph, t0
        labels.append(best)
        if starts is not None:
            starts.append(best_t0)
    return labels


def add_loss(events, labels, ivs):
    """Events after a forward ends and before the next backward begins are the loss, unless a phase
    that began inside that gap holds them (zero_grad), and only where one of them allocates (a loss
    computed inside the model leaves only frees there). The gap nests inside a phase that began
    before it (Lightning's optimizer.step(closure)), so the loss wins there."""
    starts = []
    label_events(events, ivs, starts=starts)
    fwd_ends = sorted(t1 for _, t1 in ivs.get("forward", []))
    prev_bwd_end = None
    out = list(labels)
    for b0, b1 in sorted(ivs.get("backward", [])):
        before = [fe for fe in fwd_ends if fe < b0]
        if before and (prev_bwd_end is None or before[-1] > prev_bwd_end):
            fe = before[-1]
            gap = [i for i, e in enumerate(events)
                   if fe < e["time_us"] < b0 and (starts[i] is None or starts[i] < fe)]
            if any(events[i]["action"] == "alloc" for i in gap):  # frees alone compute no loss
                for i in gap:
                    out[i] = "loss"
        prev_bwd_end = b1 if prev_bwd_end is None else max(prev_bwd_end, b1)
    return out


def steps_from_optimizer(events, ivs):
    """Step k = events up to and including the last one inside the k-th optimizer interval."""
    ends = sorted(t1 for _, t1 in ivs.get("optimizer", []))
    step_of = []
    for e in events:
        k = next((i for i, t1 in enumerate(ends) if e["time_us"] <= t1), -1)
        step_of.append(k)
    return step_of
