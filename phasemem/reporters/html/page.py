"""The interactive page: one self-contained HTML file holding the labelled picture as SVG, zoomable to a
step, a phase or a shape, each band telling on hover what it is; the tables and the text below. How
it reuses the picture's scene and zooms: docs/interactive.md.

Example:
    >>> text = page_text(report, figure(report, "html"))   # the HTML reporter (reporters/html) does this
"""
from __future__ import annotations

import html
import io
import math
import xml.etree.ElementTree as ET

import numpy as np
from matplotlib import rc_context
from matplotlib.collections import PathCollection

from ...read.stacks import short_path
from ...units import axis_unit, format_bytes
from ...vocab import CATEGORIES, PHASES
from ..picture import bands as _bands
from ..picture.colours import _CURVE, _RESERVED, _band_colors
from ..picture.draw import CURVE_LW, STRIP_EM
from ..picture.labels import STRIP_PT
from .template import page

#: Band vertices the zoom layers of single steps may add to the page (about 12 bytes each). The whole
#: picture of a 5,000-event GPT trace has 180,000 (fixtures/gpt_big_foreach), its three steps 270,000.
LAYER_BUDGET = 400_000

#: A step wider than this share of the picture gets no layer of its own: zoomed, it would stretch the
#: picture's columns by under 1/0.9 (the one step of ../shared/wild/wedsonlin_medium512_train).
WHOLE_SHARE = 0.9

#: Decimals of the bands' coordinates in the SVG: the whole picture's, and a zoomed step's most (one more for
#: each tenfold zoom, so a step stretched across the page stays as sharp as the whole).
BASE_DIGITS, MAX_DIGITS = 2, 6

#: Frames of an allocation's stack shown on hover (innermost first, as memory_viz lists them).
STACK_FRAMES = 14

#: The page draws the plan grid (reporters/picture/plans.py) for traces up to this many events: ``plan_grid``
#: replays 4 plans x 5 rank counts and solves what fits for each, ~0.1 ms an event on this 2-core machine
#: (fixtures/plans/gpt stretched by benchmarks/scale_snapshot.py: 50k events 4.2 s, 200k 21.6 s;
#: ../shared/wild's 22k-event wedsonlin 0.7 s); above it the page says how to draw it.
PLAN_PAGE_EVENTS = 25_000
#: The card the page's plan grid is solved for (a trace does not say its card's memory): 80 GB.
PLAN_PAGE_BUDGET = 80 << 30
#: The plan picture's size on the page, in pixels (the SVG scales to the page's width).
PLAN_PAGE_SIZE = (1400, 640)

_SVG_NS = "{http://www.w3.org/2000/svg}"
_XLINK_HREF = "{http://www.w3.org/1999/xlink}href"


def page_text(report, fig, **options) -> str:
    """The page of ``report`` whose picture ``fig`` is (``draw.figure(report, "html", **options)``).

    Example:
        >>> page_text(report, figure(report, "html", steps="1-2"), steps="1-2")[:15]
        '<!DOCTYPE html>'
    """
    data: dict
    if report.live is not None:  # no history: the live picture, the text
        svg, data = _svg_text(fig, {}, None), {"views": {}}
    else:
        scene = _Scene(report, fig, options.get("by", "event"), options.get("color", "category"),
                       int(options.get("max_bands", 2000)))
        svg, data = _svg_text(fig, _tag(fig), scene), scene.data()
    return page(report, svg, data, int(round(fig.get_size_inches()[0] * fig.dpi)), plans=plans_section(report))


def plans_section(report) -> str:
    """The page's "Across GPUs" section: the plan picture (reporters/picture/plans.py) as inline SVG under an 80 GB
    budget, for a report with an allocation history of at most PLAN_PAGE_EVENTS events; a note where
    it is skipped or cannot be told.

    Example:
        >>> plans_section(phasemem.analyze("fixtures/plans/gpt__single_fp32__n1_r0__b4.pkl.xz"))[:30]
        '<h2 id=pm-plans-h>Across GPUs:'
    """
    from ...errors import PhasememError
    from ..picture.plan_data import PlanPicture
    from ..picture.plans import svg_text

    if report.live is not None or report.analysis is None:
        return ""
    head = "<h2 id=pm-plans-h>Across GPUs: each rank's peak under DDP, ZeRO and FSDP2</h2>"
    how = ("<code>phasemem plan TRACE -o plan.png --budget 24GiB --batch B</code> draws it for another card, "
           "with the largest batch per rank as a number")
    if report.n_events > PLAN_PAGE_EVENTS:
        return (f"{head}<p class=pm-note>Not drawn here: the trace has {report.n_events:,} events and replaying "
                f"every plan at every rank count takes a while above {PLAN_PAGE_EVENTS:,}; {how}.</p>")
    try:
        pic = PlanPicture.of(report, PLAN_PAGE_BUDGET)
        svg = svg_text(pic, size=PLAN_PAGE_SIZE)
    except PhasememError as e:
        return f"{head}<p class=pm-note>Cannot be told: {html.escape(str(e))}</p>"
    return (f"{head}<p class=pm-note>Replayed on this trace (docs/plans.md), under an 80 GiB card; {how}.</p>"
            f'<div id=pm-plans style="max-width:{PLAN_PAGE_SIZE[0]}px">{svg}</div>')


class _Scene:
    """The figure's geometry (data → SVG user units, which are points), its band layers and what each
    band is."""

    def __init__(self, report, fig, by, color, max_bands):
        self.r, self.by, self.color, self.max_bands = report, by, color, max_bands
        ax = fig.axes[0]
        (x0, y0), (x1, y1) = ax.get_position().get_points()
        w, h = fig.get_size_inches() * 72
        self.L, self.R, self.T, self.B = x0 * w, x1 * w, (1 - y1) * h, (1 - y0) * h
        self.X0, self.X1 = ax.get_xlim()
        self.ytop = ax.get_ylim()[1]
        self.dpi = fig.dpi
        self.X = _bands.x_values(report, by)
        st = fig.phasemem_stack
        self.ncols = len(st.columns)
        # the events drawn, [a, b): X ties (events at one µs, by="time") only add events of no width
        self.a, self.b = int(np.searchsorted(self.X, self.X0)), int(np.searchsorted(self.X, self.X1))
        cols = st.columns
        self.unit = axis_unit(int(max(cols.level.max(), cols.reserved.max() if report.reserved_peak_bytes else 0, 1)))[0]
        self.codes = _bands.category_codes(report)
        self.lines = {"curve": any(str(ln.get_color()) == _CURVE for ln in ax.lines),
                      "reserved": report.reserved_peak_bytes > 0}
        self.layers = [self._layer(st, BASE_DIGITS)]  # the whole picture: the very stack plot() drew
        self.step_layer = self._step_layers()
        self.base = st
        self.drawn = sorted({int(i) for _, paths, _ in self.layers for i in paths})

    # -- geometry ---------------------------------------------------------------------------------
    def ux(self, x):
        return self.L + (np.asarray(x, float) - self.X0) * (self.R - self.L) / (self.X1 - self.X0)

    def vy(self, y_units):
        return self.B - np.asarray(y_units, float) * (self.B - self.T) / self.ytop

    # -- layers -----------------------------------------------------------------------------------
    def _layer(self, st, nd):
        """(vertex count, {lifetime index: path}, extra elements) of one stack, in SVG user units."""
        (rgb, _, (folded_rgb, _)), _ = _band_colors(self.r, st, self.color, self.codes, CATEGORIES)
        polys = _bands.polygons(st, self.unit)
        ds = _paths([self.ux(p[:, 0]) for p in polys], [self.vy(p[:, 1]) for p in polys], nd)
        hexes = ["#%02x%02x%02x" % tuple(c) for c in np.round(np.asarray(rgb).reshape(-1, 3) * 255).astype(int).tolist()]
        paths = {i: ("path", {"d": d, "fill": h, "data-i": str(i), "class": "pm-band"})
                 for i, d, h in zip(st.index.tolist(), ds, hexes)}
        extra = []
        edges = st.columns.edges
        if st.folded.any():
            # One path per category summed (as in the PNG; lighter tints there are dotted too).
            lo = st.drawn_top()
            label = _bands.folded_label(st)
            for key, part, c in zip(st.folded_keys.tolist(), st.folded_parts, folded_rgb):
                if not part.any():
                    continue
                xs, yb = _bands.step_outline(edges, lo, self.unit)
                lo = lo + part
                _, yt = _bands.step_outline(edges, lo, self.unit)
                d = _paths([self.ux(np.concatenate([xs, xs[::-1]]))], [self.vy(np.concatenate([yb, yt[::-1]]))], nd)[0]
                name = f" ({CATEGORIES[key].replace('_', ' ')})" if self.color == "category" else ""
                extra.append(("path", {"d": d, "fill": "#%02x%02x%02x" % tuple(round(v * 255) for v in c),
                                       "class": "pm-band", "data-t": label + name}))
        for name, values, ink in (("curve", st.columns.level, _CURVE), ("reserved", st.columns.reserved, _RESERVED)):
            if self.lines[name]:
                xs, ys = _bands.step_outline(edges, values, self.unit)
                extra.append(("path", {"d": _paths([self.ux(xs)], [self.vy(ys)], nd, close=False)[0], "fill": "none",
                                       "stroke": ink, "stroke-width": f"{CURVE_LW * self.dpi / 72:.2f}", "class": "pm-line"}))
        return sum(len(p) for p in polys), paths, extra

    def _step_layers(self) -> dict[int, int]:
        """Step position → its layer, for the steps shown, the peak's step first, while within budget."""
        r, tl = self.r, self.r.analysis.timeline
        shown = [s for s in r.steps if s.start_event < self.b and s.end_event >= self.a]
        peak = int(r.analysis.step_of[r.peak_event]) if r.analysis is not None and r.peak_event >= 0 else -1
        shown.sort(key=lambda s: (s.index != peak, s.index))
        out, spent = {}, 0
        for s in shown:
            a, b = max(s.start_event, self.a), min(s.end_event + 1, self.b)
            # a step drawn over most of the picture is as fine in it already (and too short a one has no bands)
            if b - a < 2 or self.X[b] - self.X[a] > WHOLE_SHARE * (self.X1 - self.X0):
                continue
            cols = _bands.columns(self.X, tl.level, tl.active_after, tl.reserved_after, tl.delta, a, b, self.ncols)
            st = _bands.stack(tl.lifetimes, cols, r.n_events, self.max_bands,
                              base_key=self.codes if self.color == "category" else None)
            zoom = (self.X1 - self.X0) / max(self.X[b] - self.X[a], 1e-9)
            layer = self._layer(st, min(BASE_DIGITS + math.ceil(math.log10(max(zoom, 1))), MAX_DIGITS))
            if spent + layer[0] > LAYER_BUDGET:
                break
            spent += layer[0]
            out[s.index] = len(self.layers)
            self.layers.append(layer)
        return out

    # -- what the script reads ----------------------------------------------------------------------
    def data(self) -> dict:
        r, X = self.r, self.X
        geo = {"L": self.L, "R": self.R, "T": self.T, "B": self.B, "X0": self.X0, "X1": self.X1,
               "strip": STRIP_PT * STRIP_EM, "by": self.by, "ytop": self.ytop, "unit": self.unit}
        views = {"all": [self.X0, self.X1, 0, "the whole picture", None]}
        steps = []
        for s in r.steps:
            a, b = max(s.start_event, self.a), min(s.end_event + 1, self.b)
            if b <= a:
                continue
            layer = self.step_layer.get(s.index, 0)
            key = f"s{s.index}"
            views[key] = [X[a], X[b], layer, f"step {s.number}: events {a:,}–{b - 1:,}", "all"]
            for name, ph in s.phases.items():
                if ph.n_events and ph.start_event < b and ph.end_event >= a:
                    pa, pb = max(ph.start_event, a), min(ph.end_event + 1, b)
                    views[f"{key}.{name}"] = [X[pa], X[pb], layer, f"step {s.number} {name}: events {pa:,}–{pb - 1:,}", key]
            runs = [[PHASES[c], X[max(f, a)], X[min(e + 1, b)]] for f, e, c, k in zip(*_runs(r)) if k == s.index]
            steps.append({"key": key, "n": s.number, "a": X[a], "b": X[b], "runs": runs})
        for j, p in enumerate(r.patterns):
            a, b = max(p.start_event, self.a), min(p.end_event + 1, self.b)
            if b > a:
                inside = [lay for k, lay in self.step_layer.items() if r.steps[k].start_event <= a and b <= r.steps[k].end_event + 1]
                views[f"k{j}"] = [X[a], X[b], inside[0] if inside else 0,
                                  f"{p.kind} of step {r.steps[p.step].number}: events {a:,}–{b - 1:,}", "all"]
        bands_meta, stacks = _band_meta(r, self.drawn)
        return {"geo": geo, "views": views, "steps": steps, "bands": bands_meta, "stacks": stacks,
                "axis": "event (position in the allocator trace)" if self.by == "event" else "time since the first event"}


def _runs(r):
    """(first, last, phase code, step position) arrays of the report's label runs."""
    runs = r.label_runs()
    return ([x[0] for x in runs], [x[1] for x in runs], [PHASES.index(x[2]) for x in runs], [x[3] for x in runs])


def _paths(xs: list, ys: list, nd: int, close: bool = True) -> list[str]:
    """SVG paths through each outline's points (x to ``nd`` decimals), H and V where a side is flat
    (band outlines are rectilinear): one template and one % for all of them, not one per number."""
    if not xs:
        return []
    lens = np.array([len(x) for x in xs], dtype=np.int64)
    X = np.round(np.concatenate(xs).astype(float), nd)
    Y = np.round(np.concatenate(ys).astype(float), 2)
    first = np.zeros(len(X), bool)
    first[np.cumsum(lens) - lens] = True
    same_x = np.concatenate(([False], X[1:] == X[:-1])) & ~first
    same_y = np.concatenate(([False], Y[1:] == Y[:-1])) & ~first
    kind = np.where(first, 0, np.where(same_x & same_y, 4, np.where(same_y, 2, np.where(same_x, 3, 1))))
    fx, fy = f"%.{nd}f", "%.2f"
    tmpl = np.array([f"M{fx} {fy}", f"L{fx} {fy}", f"H{fx}", f"V{fy}", ""], dtype=object)[kind]
    last = np.cumsum(lens) - 1
    tmpl[last] = tmpl[last] + (("Z" if close else "") + "\n")
    keep = np.stack([np.isin(kind, (0, 1, 2)), np.isin(kind, (0, 1, 3))], axis=1)
    text = "".join(tmpl.tolist()) % tuple(np.stack([X, Y], axis=1)[keep].tolist())
    return text.split("\n")[:-1]


def _band_meta(r, drawn: list[int]) -> tuple[dict, list]:
    """Hover texts of every drawn allocation (Lifetimes index → size, when made, when freed, category,
    shapes, stack id, a note, the program's label) and the stacks they name."""
    life, tr = r.analysis.timeline.lifetimes, r.analysis.trace
    n, numbers = r.n_events, [s.number for s in r.steps]
    n_pre = int(life.preexisting.sum())
    shapes: dict[int, list[str]] = {}
    for p in r.patterns:
        for m in p.members:
            kinds = shapes.setdefault(n_pre + m, [])
            if p.kind not in kinds:
                kinds.append(p.kind)

    def where(e: int) -> str:
        ph = PHASES[int(r.analysis.labels[e])]
        return f"step {numbers[int(r.analysis.step_of[e])]} {ph}" if r.analysis.step_of[e] >= 0 else ph

    cats = _bands.category_codes(r)
    stack_ids: dict[int, int] = {}
    meta = {}
    # the program's label of each (torch's user_metadata on its alloc: phasemem.read.torch_labels)
    said = dict(zip(drawn, tr.torch_labels.text_at(life.alloc_event[drawn]))) if tr.torch_labels is not None else {}
    for i in drawn:
        a, f, size = int(life.alloc_event[i]), int(life.free_event[i]), int(life.size[i])
        made = f"made at event {a:,} ({where(a)})" if a >= 0 else "made before recording"
        freed = f"freed at event {f:,} ({where(f)})" if f < n else "still alive when the snapshot was taken"
        if a >= 0 and f < n:
            freed += f": alive {f - a:,} events, {_duration(int(tr.time_us[f] - tr.time_us[a]))}"
        sid = int(tr.stack[a]) if a >= 0 else (int(tr.stack[f]) if f < n else -1)
        meta[i] = [f"{format_bytes(size)} ({size:,} bytes)", made, freed, CATEGORIES[int(cats[i])],
                   ", ".join(shapes.get(i, [])), stack_ids.setdefault(sid, len(stack_ids)) if sid >= 0 else -1,
                   "" if a >= 0 else "the stack of its free (its alloc was not recorded)", said.get(i, "")]
    stacks = [""] * len(stack_ids)
    for sid, k in stack_ids.items():
        frames = [tr.frames[f] for f in tr.stacks[sid]]
        py = [fr for fr in frames if str(fr[0]).endswith(".py")] or frames
        lines = [f"{name} ({short_path(str(fn))}:{line})" for fn, line, name in py[:STACK_FRAMES]]
        stacks[k] = "\n".join(lines + ([f"… {len(py) - STACK_FRAMES} more"] if len(py) > STACK_FRAMES else []))
    return meta, stacks


def _duration(us: int) -> str:
    return f"{us / 1e6:.2f} s" if us >= 1e6 else f"{us / 1e3:.1f} ms" if us >= 1e3 else f"{us} µs"


def _tag(fig) -> dict[str, str]:
    """Name each artist of the axes by what zooming does to it (gid → role); empty the bands, the folded
    band and the memory curves, which the scene's layers draw instead."""
    ax = fig.axes[0]
    roles = {}
    for k, c in enumerate(ax.collections):
        old = c.get_gid()
        role = {"band": "layers", "band-folded": "gone", "band-base": "base"}.get(old) or (
            "mark" if isinstance(c, PathCollection) else "zx")
        if role in ("layers", "gone"):
            c.set_paths([])
        c.set_gid(f"pm-c{k}")
        roles[f"pm-c{k}"] = role
    for k, ln in enumerate(ax.lines):
        if str(ln.get_color()) in (_CURVE, _RESERVED) and ln.get_gid() is None:
            ln.set_data([], [])
        ln.set_gid(f"pm-l{k}")
        roles[f"pm-l{k}"] = "zx"
    for k, t in enumerate(ax.texts):
        t.set_gid(f"pm-t{k}")
        roles[f"pm-t{k}"] = "label"
        if getattr(t, "arrow_patch", None) is not None:  # a callout's arrow is drawn apart from its text
            t.arrow_patch.set_gid(f"pm-a{k}")
            roles[f"pm-a{k}"] = "label"
    ax.xaxis.set_gid("pm-xaxis")
    roles["pm-xaxis"] = "label"
    return roles


def _svg_text(fig, roles: dict, scene) -> str:
    """The figure as inline SVG: no XML prolog, namespaces or metadata (nothing that names a URL), the
    artists classed by role, the scene's layers in place of the bands."""
    buf = io.BytesIO()
    with rc_context({"svg.hashsalt": "phasemem", "svg.fonttype": "path"}):  # ids the same every run; text as drawn
        fig.savefig(buf, format="svg", dpi=fig.dpi, facecolor="white", metadata={"Date": None})
    root = ET.fromstring(buf.getvalue())
    parents = {c: p for p in root.iter() for c in p}
    for el in root.iter():
        el.tag = el.tag.replace(_SVG_NS, "")
        if _XLINK_HREF in el.attrib:
            el.set("href", el.attrib.pop(_XLINK_HREF))
    for meta in root.findall("metadata"):
        root.remove(meta)
    if scene is not None:
        _wire(root, parents, roles, scene)
    root.set("id", "pm-svg")
    return ET.tostring(root, encoding="unicode")


def _wire(root, parents, roles, scene) -> None:
    clip = ET.SubElement(ET.SubElement(root, "defs"), "clipPath", {"id": "pm-clip"})
    ET.SubElement(clip, "rect", {"x": f"{scene.L:.2f}", "y": f"{scene.T:.2f}", "width": f"{scene.R - scene.L:.2f}",
                                 "height": f"{scene.B - scene.T:.2f}"})
    for g in list(root.iter("g")):
        role = roles.get(g.get("id"))
        if role is None:
            continue
        if role == "label":
            g.set("class", "pm-lbl")
            continue
        if role == "layers":
            _fill_layers(g, scene)
        if role == "base":
            for path, k in zip(g.findall("path"), [k for k, v in zip(scene.base.base_keys, scene.base.base) if v > 0]):
                size = int(scene.base.base[list(scene.base.base_keys).index(k)])
                kind = f"{CATEGORIES[int(k)]}, " if scene.color == "category" else ""
                path.set("data-t", f"alive from before recording to the end: {kind}{format_bytes(size)} ({size:,} bytes)")
                path.set("class", "pm-band")
        # the base spans the whole picture at any zoom: left as drawn, its hatching is not stretched
        g.set("class", {"mark": "pm-mk", "base": "pm-base"}.get(role, "pm-zx"))
        parent = parents[g]
        wrap = ET.Element("g", {"clip-path": "url(#pm-clip)"})
        parent.insert(list(parent).index(g), wrap)
        parent.remove(g)
        wrap.append(g)
        parents[g] = wrap


def _fill_layers(g, scene) -> None:
    for k, (_, paths, extra) in enumerate(scene.layers):
        layer = ET.SubElement(g, "g", {"class": "pm-layer", "data-layer": str(k)})
        if k:
            layer.set("style", "display:none")
        for tag, attrs in list(paths.values()) + extra:
            ET.SubElement(layer, tag, attrs)
