"""The page around the picture (reporters/html/page.py): its style, its script (zoom and hover, no library),
the tables and the text report. Nothing here fetches anything: the page works from a file, offline."""
from __future__ import annotations

import html
import json

from ...units import format_bytes
from ...vocab import CATEGORY_NAMES

STYLE = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:16px;color:#1b1b1b}
#pm-nav{display:flex;flex-wrap:wrap;gap:6px 8px;align-items:baseline;margin-bottom:6px}
#pm-nav a,#pm-nav button{font:inherit;font-size:13px;color:#0b5cad;background:none;text-decoration:none;
 padding:1px 7px;border:1px solid #c9d7e8;border-radius:4px;cursor:pointer}
#pm-showing{font-weight:600;margin-left:6px}
.pm-hint{color:#777;font-size:12px}
#pm-fig svg,#pm-plans svg{width:100%;height:auto;display:block}
.pm-band{shape-rendering:crispEdges}
.pm-hot{stroke:#000;stroke-width:1.3;vector-effect:non-scaling-stroke}
.pm-line{vector-effect:non-scaling-stroke}
svg.pm-zoomed .pm-lbl{display:none}
svg.pm-zoomed .pm-zx path,svg.pm-zoomed .pm-zx line{vector-effect:non-scaling-stroke}
#pm-over{pointer-events:none;font-family:"DejaVu Sans",Verdana,sans-serif}
.pm-tick{stroke:#1b1b1b;stroke-width:.8}
.pm-tickl,.pm-stepl,.pm-axl,.pm-phl{text-anchor:middle;fill:#1b1b1b;font-size:8.5px}
.pm-axl{font-size:9.5px}
.pm-phl{font-size:7.5px;font-weight:700;fill:#fff}
#pm-tip{position:fixed;z-index:10;max-width:600px;background:#fffffb;border:1px solid #888;border-radius:4px;
 padding:6px 9px;box-shadow:0 2px 8px rgba(0,0,0,.2);font-size:12.5px;pointer-events:none}
#pm-tip .pm-size{font-weight:700;font-size:14px}
#pm-tip pre{margin:4px 0 0;font-size:11px;white-space:pre-wrap}
.pm-note{color:#666}
h2{font-size:17px;margin:20px 0 4px}
table{border-collapse:collapse;margin:6px 0 14px;font-size:13px}
th,td{padding:2px 9px;text-align:right;border-bottom:1px solid #e6e6e6;vertical-align:top}
th{background:#f3f3f3}td.l,th.l{text-align:left}td.x{text-align:left;max-width:640px;color:#444;font-size:12px}
tr.pm-step td{font-weight:600;border-top:1px solid #bbb}
#pm-report{background:#fafafa;border:1px solid #e6e6e6;padding:10px;overflow-x:auto;font-size:12px}
"""

SCRIPT = r"""
(() => {
"use strict";
const D = JSON.parse(document.getElementById("pm-data").textContent);
const svg = document.getElementById("pm-svg"), tip = document.getElementById("pm-tip");
const showing = document.getElementById("pm-showing");
if (!svg || !D.geo) { document.body.dataset.ready = "1"; return; }
const G = D.geo, NS = svg.namespaceURI;  // the SVG namespace, read from the page rather than spelt here
const layers = [...svg.querySelectorAll(".pm-layer")], zx = [...svg.querySelectorAll(".pm-zx")];
// markers keep their shape: each is moved to where its centre goes (a <use> at x, or a lone <path>)
const marks = [...svg.querySelectorAll(".pm-mk use, .pm-mk path")].filter(m => !m.closest("defs"));
for (const m of marks) {
  const b = m.tagName === "use" ? null : m.getBBox();
  m.dataset.cx = b ? b.x + b.width / 2 : m.getAttribute("x");
}
const over = document.createElementNS(NS, "g");
over.setAttribute("id", "pm-over");
svg.appendChild(over);
let cur = "all", u0 = G.L, k = 1;
const ux = x => G.L + (x - G.X0) * (G.R - G.L) / (G.X1 - G.X0);  // data x -> SVG x of the whole picture
const X = x => G.L + (ux(x) - u0) * k;  // data x -> SVG x as zoomed
const dataAt = u => G.X0 + (u0 + (u - G.L) / k - G.L) * (G.X1 - G.X0) / (G.R - G.L);
function zoom(key) {
  const v = D.views[key];
  if (!v) return;
  cur = key; u0 = ux(v[0]); k = (G.R - G.L) / Math.max(ux(v[1]) - u0, 1e-9);
  const m = key === "all" ? null : `matrix(${k} 0 0 1 ${G.L - k * u0} 0)`;
  for (const g of zx) m ? g.setAttribute("transform", m) : g.removeAttribute("transform");
  for (const m of marks) {
    const cx = +m.dataset.cx;
    m.setAttribute("transform", `translate(${G.L + (cx - u0) * k - cx} 0)`);
  }
  layers.forEach((g, i) => { g.style.display = i === v[2] ? "" : "none"; });
  svg.classList.toggle("pm-zoomed", key !== "all");
  svg.dataset.view = `${v[0]} ${v[1]}`;
  svg.dataset.zoom = key;
  showing.textContent = v[3];
  hide();
  drawOver(v[0], v[1]);
}
function el(tag, attrs, text) {
  const e = document.createElementNS(NS, tag);
  for (const [a, b] of Object.entries(attrs)) e.setAttribute(a, b);
  if (text !== undefined) e.textContent = text;
  return over.appendChild(e);
}
function ticksOf(a, b, n) {
  const raw = (b - a) / n, p = Math.pow(10, Math.floor(Math.log10(raw)));
  let step = [1, 2, 5, 10].map(m => m * p).find(s => s >= raw);
  if (G.by === "event") step = Math.max(1, Math.round(step));
  const out = [];
  for (let t = Math.ceil(a / step) * step; t <= b + 1e-9 && out.length < 40; t += step) out.push(t);
  return out;
}
function drawOver(a, b) {  // what the hidden texts said, for the zoomed range: ticks, steps, phases
  over.replaceChildren();
  if (cur === "all") return;
  const span = b - a;
  const [div, unit] = G.by === "event" ? [1, ""] : span >= 2e6 ? [1e6, "s"] : span >= 2e3 ? [1e3, "ms"] : [1, "µs"];
  for (const t of ticksOf(a, b, Math.max(2, Math.round((G.R - G.L) / 95)))) {
    const x = X(t);
    el("line", {x1: x, x2: x, y1: G.B, y2: G.B + 3.5, class: "pm-tick"});
    el("text", {x, y: G.B + 13, class: "pm-tickl"},
       (t / div).toLocaleString("en-US", {maximumFractionDigits: G.by === "event" ? 0 : 3}));
  }
  el("text", {x: (G.L + G.R) / 2, y: G.B + 27, class: "pm-axl"}, D.axis + (unit ? ` (${unit})` : ""));
  for (const s of D.steps) {
    const x0 = Math.max(X(s.a), G.L), x1 = Math.min(X(s.b), G.R);
    if (x1 - x0 > 34) el("text", {x: (x0 + x1) / 2, y: G.T - 4, class: "pm-stepl"}, `step ${s.n}`);
    for (const [ph, ra, rb] of s.runs) {
      const r0 = Math.max(X(ra), G.L), r1 = Math.min(X(rb), G.R);
      if (ph !== "other" && r1 - r0 > ph.length * 4.6 + 6)
        el("text", {x: (r0 + r1) / 2, y: G.T + G.strip / 2 + 2.6, class: "pm-phl"}, ph);
    }
  }
}
let hot = null;
function hide() { tip.hidden = true; if (hot) hot.classList.remove("pm-hot"); hot = null; }
function line(cls, text) {
  const d = document.createElement(cls === "pre" ? "pre" : "div");
  d.className = cls; d.textContent = text; tip.appendChild(d);
}
function show(p, e) {
  if (hot !== p) {
    hide(); hot = p; p.classList.add("pm-hot"); tip.replaceChildren();
    const r = D.bands[p.dataset.i];
    if (!r) line("pm-size", p.dataset.t || "");
    else {
      line("pm-size", r[0]);
      line("", r[3] + (r[4] ? ` · shape: ${r[4]}` : ""));
      line("", r[1]); line("", r[2]);
      if (r[7]) line("", `labelled by the program: ${r[7]}`);
      if (r[5] < 0) line("pm-note", "no stack recorded (the autograd thread, or recorded without stacks)");
      else { if (r[6]) line("pm-note", r[6]); line("pre", D.stacks[r[5]]); }
    }
    tip.dataset.band = p.dataset.i || "";
    tip.hidden = false;
  }
  const w = tip.offsetWidth, h = tip.offsetHeight;
  let x = e.clientX + 14, y = e.clientY + 14;
  if (x + w > innerWidth - 4) x = Math.max(4, e.clientX - w - 14);
  if (y + h > innerHeight - 4) y = Math.max(4, e.clientY - h - 14);
  tip.style.left = `${x}px`; tip.style.top = `${y}px`;
}
svg.addEventListener("mousemove", e => { const p = e.target.closest(".pm-band"); p ? show(p, e) : hide(); });
svg.addEventListener("mouseleave", hide);
function keyAt(x) {  // the view one level in, at data x: a step, then a phase of it
  if (cur === "all") { const s = D.steps.find(s => s.a <= x && x < s.b); return s ? s.key : null; }
  const s = D.steps.find(s => s.key === cur);
  const run = s ? s.runs.find(r => r[1] <= x && x < r[2]) : null;
  return run && D.views[`${cur}.${run[0]}`] ? `${cur}.${run[0]}` : null;
}
svg.addEventListener("click", e => {
  const m = svg.getScreenCTM();
  if (!m) return;
  const p = new DOMPoint(e.clientX, e.clientY).matrixTransform(m.inverse());
  if (p.x < G.L || p.x > G.R || p.y < G.T || p.y > G.B) return;
  const key = keyAt(dataAt(p.x));
  if (key) location.hash = `zoom=${key}`;
});
const out = () => { const v = D.views[cur]; if (v && v[4]) location.hash = `zoom=${v[4]}`; };
document.getElementById("pm-out").addEventListener("click", out);
document.addEventListener("keydown", e => { if (e.key === "Escape") out(); });
function fromHash() {
  const m = /zoom=([^&]+)/.exec(location.hash), key = m ? decodeURIComponent(m[1]) : "all";
  zoom(D.views[key] ? key : "all");
}
addEventListener("hashchange", fromHash);
fromHash();
document.body.dataset.ready = "1";  // for scripts driving the page (tests/reporters/test_html.py)
})();
"""


def page(report, svg: str, data: dict, width_px: int, plans: str = "") -> str:
    """The whole page: navigation, the picture, the tables, the plan picture (``plans``: its section,
    page.py ``plans_section``), the text report, the data and the script.

    Example:
        >>> text = page(report, svg_text, {"views": {}}, 1600)   # page.py builds svg_text and the data
    """
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    views = data.get("views", {})
    nav = "".join(f'<a href="#zoom={k}">{html.escape(v[3].split(":")[0])}</a>' for k, v in views.items()
                  if k.startswith("s") and "." not in k)
    zoom = ('<a href="#zoom=all">whole picture</a>' + nav + '<button id="pm-out" type="button">zoom out</button>'
            '<span id="pm-showing">the whole picture</span><span class="pm-hint">click the picture: a step, '
            'then a phase; Esc zooms out; hover a band for what it is</span>') if views else (
            '<span id="pm-showing"></span><button id="pm-out" type="button" hidden></button>')
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(f"phasemem — {report.device}")}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{STYLE}</style></head>
<body>
<nav id="pm-nav">{zoom}</nav>
<div id="pm-fig" style="max-width:{width_px}px">{svg}</div>
<div id="pm-tip" hidden></div>
{tables(report, views)}
{plans}
<h2>Report</h2>
<pre id="pm-report">{html.escape(str(report))}</pre>
<script type="application/json" id="pm-data">{payload}</script>
<script>{SCRIPT}</script>
</body></html>
"""


def tables(report, views: dict) -> str:
    """The steps and their phases, the shapes, and what the peak holds, as HTML tables (a name links to
    its zoom where ``views`` has it).

    Example:
        >>> tables(report, {})[:25]
        '<h2>Steps and phases</h2>'
    """
    if report.live is not None:
        return ""
    return _steps_table(report, views) + _shapes_table(report, views) + _peak_table(report)


def _zoom(key: str, views: dict, text: str) -> str:
    return f'<a href="#zoom={key}">{html.escape(text)}</a>' if key in views else html.escape(text)


def _steps_table(report, views: dict) -> str:
    rows = []
    for s in report.steps:
        for name, ph in s.phases.items():
            if not ph.ran:  # kept for its key only: the step did not run it
                continue
            ev = f"{ph.start_event:,}–{ph.end_event:,}" if ph.n_events else "—"
            sure = ph.source if ph.source != "inferred" else f"inferred, {ph.confidence:.0%} sure"
            rows.append(f"<tr><td>{s.number}</td><td class=l>{_zoom(f's{s.index}.{name}', views, name)}</td>"
                        f"<td>{format_bytes(ph.start_bytes)}</td><td>{format_bytes(ph.peak_bytes)}</td>"
                        f"<td>{format_bytes(ph.end_bytes)}</td><td>{ev}</td><td class=l>{html.escape(sure)}</td></tr>")
        tag = "" if s.complete else " (partial)"
        rows.append(f"<tr class=pm-step><td>{s.number}</td><td class=l>{_zoom(f's{s.index}', views, 'step' + tag)}</td>"
                    f"<td>{format_bytes(s.start_bytes)}</td><td>{format_bytes(s.peak_bytes)}</td>"
                    f"<td>{format_bytes(s.end_bytes)}</td><td>{s.start_event:,}–{s.end_event:,}</td><td></td></tr>")
    head = ("<tr><th>step</th><th class=l>phase</th><th>start</th><th>peak</th><th>end</th><th>events</th>"
            "<th class=l>from</th></tr>")
    return f"<h2>Steps and phases</h2><table id=pm-steps>{head}{''.join(rows)}</table>"


def _shapes_table(report, views: dict) -> str:
    if not report.patterns:
        return ""
    seen, rows = set(), []
    for j, p in enumerate(report.patterns):
        why = "" if p.kind in seen else html.escape(p.explanation)
        seen.add(p.kind)
        sure = "" if p.confidence >= 1 else f"{p.confidence:.0%} sure"
        rows.append(f"<tr><td class=l>{_zoom(f'k{j}', views, p.kind)}</td><td>{format_bytes(p.bytes)}</td>"
                    f"<td class=l>step {report.steps[p.step].number} {html.escape(p.phase)}</td>"
                    f"<td>{p.start_event:,}–{p.end_event:,}</td><td>{sure}</td><td class=x>{why}</td></tr>")
    head = "<tr><th class=l>shape</th><th>size</th><th class=l>where</th><th>events</th><th></th><th class=l></th></tr>"
    return f"<h2>Shapes</h2><table id=pm-shapes>{head}{''.join(rows)}</table>"


def _peak_table(report) -> str:
    cats = {k: v for k, v in report.by_category.items() if v}
    if not cats:
        return ""
    peak = getattr(report, "peak", None)
    by_shape = dict(getattr(peak, "by_shape", None) or {})
    rows = [f"<tr><td class=l>{html.escape(CATEGORY_NAMES.get(k, k))}</td><td>{format_bytes(v)}</td></tr>"
            for k, v in cats.items()]
    rows += [f"<tr><td class=l>in the shape {html.escape(k)}</td><td>{format_bytes(v)}</td></tr>" for k, v in by_shape.items()]
    return (f"<h2>At the peak: {format_bytes(report.peak_bytes)} at event {report.peak_event:,}</h2>"
            f"<table id=pm-peak><tr><th class=l>what</th><th>bytes</th></tr>{''.join(rows)}</table>")
