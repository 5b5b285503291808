"""The interactive page (phasemem analyze -o report.html) in a real browser: headless Chromium, driven
over its DevTools pipe with the standard library only (docs/interactive.md). Skipped where no
Chromium is installed; CI installs it (apt-get install -y chromium)."""
from __future__ import annotations

import base64
import html.parser
import io
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from helpers.paths import ROOT
from phasemem.commands.cli import main
from phasemem.vocab import CATEGORIES

FIXTURE = ROOT / "fixtures" / "gpt_foreach.pkl.xz"
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (apt-get install -y chromium)")
VIEW = (1440, 900)  # the browser window: CSS pixels of the screenshot


class Browser:
    """Headless Chromium over --remote-debugging-pipe: JSON messages ending in NUL on fds 3 and 4."""

    def __init__(self, width: int, height: int):
        to_chrome, self._w = os.pipe()
        self._r, from_chrome = os.pipe()
        self.profile = tempfile.mkdtemp(prefix="phasemem-chromium-")
        args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                "--hide-scrollbars", "--no-first-run", f"--user-data-dir={self.profile}",
                f"--window-size={width},{height}", "about:blank"]
        null = os.open(os.devnull, os.O_RDWR)
        acts = [(os.POSIX_SPAWN_DUP2, null, 0), (os.POSIX_SPAWN_DUP2, null, 1), (os.POSIX_SPAWN_DUP2, null, 2),
                (os.POSIX_SPAWN_DUP2, to_chrome, 3), (os.POSIX_SPAWN_DUP2, from_chrome, 4)]
        self.pid = os.posix_spawn(CHROMIUM, args, os.environ, file_actions=acts)
        for fd in (to_chrome, from_chrome, null):
            os.close(fd)
        self._buf, self._id, self.session = b"", 0, None
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def send(self, method: str, **params):
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if self.session and not method.startswith(("Target.", "Browser.")):
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self._buf:
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed its pipe")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def js(self, expression: str):
        got = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in got:
            raise RuntimeError(got["exceptionDetails"])
        return got["result"].get("value")

    def open(self, url: str, timeout: float = 30) -> None:
        self.send("Page.navigate", url=url)
        end = time.time() + timeout
        while time.time() < end:
            if self.js("document.readyState === 'complete' && document.body && document.body.dataset.ready") == "1":
                return
            time.sleep(0.1)
        raise TimeoutError(f"{url} did not finish loading")

    def mouse(self, x: float, y: float, kind: str = "mouseMoved") -> None:
        self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left" if kind != "mouseMoved" else "none",
                  clickCount=1 if kind != "mouseMoved" else 0)

    def click(self, x: float, y: float) -> None:
        self.mouse(x, y)
        self.mouse(x, y, "mousePressed")
        self.mouse(x, y, "mouseReleased")

    def screenshot(self) -> bytes:
        return base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"])

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (RuntimeError, OSError):
            pass
        os.waitpid(self.pid, 0)
        os.close(self._w)
        os.close(self._r)
        shutil.rmtree(self.profile, ignore_errors=True)


def png_array(data: bytes):
    """The screenshot as an (h, w, 3) array of 0..1 floats (matplotlib reads PNG; it is installed with phasemem)."""
    from matplotlib.image import imread  # a test helper only: phasemem itself reads no picture

    return imread(io.BytesIO(data), format="png")[:, :, :3]


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    out = tmp_path_factory.mktemp("html") / "report.html"
    assert main(["analyze", str(FIXTURE), "-o", str(out), "--size", "1400x700"]) == 0
    return out


@pytest.fixture(scope="module")
def browser(page):
    if CHROMIUM is None:
        pytest.skip("no chromium installed (apt-get install -y chromium)")
    b = Browser(*VIEW)
    yield b
    b.close()


def raw_events() -> list[dict]:
    import lzma
    import pickle

    return pickle.loads(lzma.decompress(FIXTURE.read_bytes()))["device_traces"][0]


def page_data(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    start = text.index('<script type="application/json" id="pm-data">') + len('<script type="application/json" id="pm-data">')
    return json.loads(text[start:text.index("</script>", start)].replace("<\\/", "</"))


class _Parts(html.parser.HTMLParser):
    """Every attribute value, and the text of each element, with the element's name."""

    def __init__(self):
        super().__init__()
        self.attrs, self.texts, self.tags, self._open = [], [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(tag, k, v or "") for k, v in attrs]
        self._open.append(tag)

    def handle_endtag(self, tag):
        if tag in self._open:
            del self._open[len(self._open) - 1 - self._open[::-1].index(tag):]

    def handle_data(self, data):
        self.texts.append((self._open[-1] if self._open else "", data))


def test_page_fetches_nothing(page):
    parts = _Parts()
    parts.feed(page.read_text(encoding="utf-8"))
    # no resource from elsewhere: no URL in any attribute, script or style; links only inside the page
    assert not [a for a in parts.attrs if "http:" in a[2] or "https:" in a[2] or "//" in a[2]]
    assert not [t for tag, t in parts.texts if tag in ("script", "style") and ("http:" in t or "https:" in t)]
    assert {a[2][0] for a in parts.attrs if a[1] in ("href", "src")} <= {"#"}
    assert not {"link", "img", "iframe", "object", "embed"} & set(parts.tags)
    assert sum(1 for t in parts.tags if t == "script") == 2 and "svg" in parts.tags


def test_page_holds_the_report_and_its_tables(page):
    import phasemem

    report = phasemem.analyze(str(FIXTURE))
    text = page.read_text(encoding="utf-8")
    pre = text[text.index('<pre id="pm-report">') + len('<pre id="pm-report">'):]
    assert html.unescape(pre[:pre.index("</pre>")]) == str(report)
    data = page_data(page)
    for s in report.steps:  # every step and phase can be zoomed to, over its own events
        assert data["views"][f"s{s.index}"][:2] == [s.start_event, s.end_event + 1]
        assert f'href="#zoom=s{s.index}"' in text
        for name, ph in s.phases.items():
            if ph.n_events:
                assert data["views"][f"s{s.index}.{name}"][:2] == [ph.start_event, ph.end_event + 1]


def _largest_alloc() -> tuple[int, int]:
    """(event, size) of the largest allocation the raw trace records."""
    events = raw_events()
    e = max((i for i, ev in enumerate(events) if ev["action"] == "alloc"), key=lambda i: (events[i]["size"], -i))
    return e, events[e]["size"]


HIT = """((i) => {  // a point where the band of allocation i is what the mouse would touch, and its thickness there
  const p = [...document.querySelectorAll('.pm-layer')].find(g => g.style.display !== 'none')
              .querySelector(`[data-i="${i}"]`);
  const r = p.getBoundingClientRect();
  for (let fx = 0.02; fx < 1; fx += 0.02) {
    const x = r.left + r.width * fx;
    let top = null, bottom = null;
    for (let y = Math.floor(r.top); y <= Math.ceil(r.bottom); y += 0.25) {
      if (document.elementFromPoint(x, y) === p) { top = top === null ? y : top; bottom = y; }
    }
    if (top !== null && bottom - top >= 2) return {x, y: (top + bottom) / 2, thick: bottom - top + 0.25};
  }
  return null;
})"""


def _band_of(data: dict, event: int) -> str:
    """The page's band made at ``event`` (its hover row says so)."""
    hits = [i for i, row in data["bands"].items() if row[1].startswith(f"made at event {event:,} ")]
    assert len(hits) == 1, hits
    return hits[0]


def _hover(browser, band: str) -> tuple[str, dict]:
    hit = browser.js(f"{HIT}({band})")
    assert hit, f"band {band} is hidden everywhere"
    browser.mouse(hit["x"], hit["y"])
    return browser.js("document.getElementById('pm-tip').hidden ? '' : document.getElementById('pm-tip').innerText"), hit


@needs_chromium
def test_screenshot_is_the_window_and_not_blank(browser, page):
    browser.open(page.as_uri())
    shot = browser.screenshot()
    img = png_array(shot)
    assert img.shape[:2] == (VIEW[1], VIEW[0])
    ink = (img.min(axis=2) < 0.9).mean()  # share of pixels that are not (near) white
    colours = len({tuple(c) for c in (img[::7, ::7] * 255).astype(int).reshape(-1, 3).tolist()})
    assert ink > 0.15 and colours > 200, (ink, colours)
    # the bands are there, in the categories' colours: activation blue fills part of the picture
    blue = (abs(img - [0x4c / 255, 0x72 / 255, 0xb0 / 255]).max(axis=2) < 0.02).mean()
    assert blue > 0.01, blue


@needs_chromium
def test_hover_shows_the_bands_size_and_life(browser, page):
    e, size = _largest_alloc()
    data = page_data(page)
    browser.open(page.as_uri())
    band = _band_of(data, e)
    tip, hit = _hover(browser, band)
    assert f"({size:,} bytes)" in tip and f"made at event {e:,}" in tip, tip
    assert tip.splitlines()[1].split(" · ")[0] in CATEGORIES
    # the band hovered is that allocation's: its thickness on screen is its size on the axis
    scale = browser.js("document.getElementById('pm-svg').getScreenCTM().d")
    g = data["geo"]
    want = size / g["unit"] / g["ytop"] * (g["B"] - g["T"]) * scale
    assert abs(hit["thick"] - want) <= 1.0, (hit["thick"], want)
    browser.mouse(2, 2)  # off the picture: the tip goes
    assert browser.js("document.getElementById('pm-tip').hidden")


@needs_chromium
def test_zoom_to_a_step_then_a_phase_and_back(browser, page):
    import phasemem

    report = phasemem.analyze(str(FIXTURE))
    step = report.steps[1]
    browser.open(page.as_uri())
    whole = browser.screenshot()
    view = lambda: [float(v) for v in browser.js("document.getElementById('pm-svg').dataset.view").split()]  # noqa: E731
    assert view() == [0, report.n_events]
    link = browser.js("(() => { const r = document.querySelector('#pm-nav a[href=\"#zoom=s1\"]').getBoundingClientRect();"
                      " return [r.left + r.width / 2, r.top + r.height / 2]; })()")
    browser.click(*link)
    assert _wait(lambda: view() == [step.start_event, step.end_event + 1])
    assert png_array(browser.screenshot()).tolist() != png_array(whole).tolist()
    # the axis drawn for the zoomed range counts only events of that step
    ticks = [int(t.replace(",", "")) for t in browser.js(
        "[...document.querySelectorAll('#pm-over .pm-tickl')].map(t => t.textContent)")]
    assert len(ticks) >= 3 and step.start_event <= ticks[0] and ticks[-1] <= step.end_event + 1
    # a click in the middle of the step's backward zooms to it; Esc goes back out, one level at a time
    bwd = step.phases["backward"]
    x = browser.js(f"""(() => {{ const g = JSON.parse(document.getElementById('pm-data').textContent).geo;
        const m = document.getElementById('pm-svg').getScreenCTM(), k = (g.R - g.L) / ({step.end_event + 1} - {step.start_event});
        const u = g.L + ({(bwd.start_event + bwd.end_event) / 2} - {step.start_event}) * k;
        return [m.a * u + m.e, m.d * (g.T + g.B) / 2 + m.f]; }})()""")
    browser.click(*x)
    assert _wait(lambda: view() == [bwd.start_event, bwd.end_event + 1])
    # hovering in the zoomed phase: its largest allocation, drawn from the step's own sampling
    events = raw_events()
    e = max(range(bwd.start_event, bwd.end_event + 1),
            key=lambda i: (events[i]["size"] if events[i]["action"] == "alloc" else -1, -i))
    tip, _ = _hover(browser, _band_of(page_data(page), e))
    assert f"({events[e]['size']:,} bytes)" in tip and f"step {step.number} backward" in tip, tip
    browser.send("Input.dispatchKeyEvent", type="keyDown", key="Escape", code="Escape", windowsVirtualKeyCode=27)
    assert _wait(lambda: view() == [step.start_event, step.end_event + 1])
    browser.send("Input.dispatchKeyEvent", type="keyDown", key="Escape", code="Escape", windowsVirtualKeyCode=27)
    assert _wait(lambda: view() == [0, report.n_events])


def _wait(check, timeout: float = 5.0) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if check():
            return True
        time.sleep(0.05)
    return check()



def test_page_of_some_steps_zooms_only_into_them(tmp_path):
    import phasemem

    out = tmp_path / "r.html"
    assert main(["analyze", str(FIXTURE), "-o", str(out), "--steps", "1-2"]) == 0
    views = page_data(out)["views"]
    report = phasemem.analyze(str(FIXTURE), steps="1-2")  # the report of those steps alone, as analyze makes it
    assert [s.number for s in report.steps] == [1, 2]
    assert views["all"][:2] == [report.steps[0].start_event, report.steps[1].end_event + 1]
    assert [v[3].split(":")[0] for k, v in views.items() if k.startswith("s") and "." not in k] == ["step 1", "step 2"]


def test_history_less_snapshot_gets_its_live_page(tmp_path):
    import pickle

    src, out = tmp_path / "segments.pickle", tmp_path / "live.html"
    src.write_bytes(pickle.dumps({"segments": [{"device": 0, "address": 0, "total_size": 2048, "stream": 0,
                                                "blocks": [{"size": 2048, "state": "active_allocated"}]}],
                                  "device_traces": [[]]}, protocol=4))
    assert main(["analyze", str(src), "-o", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "holds no allocation history" in text and "<svg" in text and page_data(out)["views"] == {}


@needs_chromium
def test_time_axis_zooms_to_the_steps_microseconds(browser, tmp_path):
    import phasemem

    out = tmp_path / "t.html"
    assert main(["analyze", str(FIXTURE), "-o", str(out), "--by", "time"]) == 0
    events, step = raw_events(), phasemem.analyze(str(FIXTURE)).steps[2]
    t0 = events[0]["time_us"]
    browser.open(out.as_uri() + "#zoom=s2")
    view = [float(v) for v in browser.js("document.getElementById('pm-svg').dataset.view").split()]
    # from the raw trace: the step's first event's time, and the time of the event after its last
    assert view == [events[step.start_event]["time_us"] - t0, events[step.end_event + 1]["time_us"] - t0]
    axis = browser.js("document.querySelector('#pm-over .pm-axl').textContent")
    assert axis == "time since the first event (ms)"

if __name__ == "__main__":
    # The screenshots in docs/interactive.md: python3 tests/reporters/test_html.py docs/img
    import sys

    folder = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.html"
        assert main(["analyze", str(FIXTURE), "-o", str(out), "--size", "1400x700"]) == 0
        b = Browser(1440, 760)
        b.open(out.as_uri())
        (folder / "html_whole.png").write_bytes(b.screenshot())
        b.open(out.as_uri() + "#zoom=s1")
        events = raw_events()
        e = max(range(858, 1692), key=lambda i: (events[i]["size"] if events[i]["action"] == "alloc" else -1, -i))
        _hover(b, _band_of(page_data(out), e))
        (folder / "html_step_hover.png").write_bytes(b.screenshot())
        b.close()
    print(f"wrote {folder / 'html_whole.png'}, {folder / 'html_step_hover.png'}")


def test_the_summed_band_is_one_path_per_category(tmp_path):
    import re

    out = tmp_path / "r.html"
    assert main(["analyze", str(FIXTURE), "-o", str(out), "--max-bands", "30"]) == 0
    text = out.read_text(encoding="utf-8")
    found = re.findall(r'fill="(#[0-9a-f]{6})"[^>]*data-t="[\d,]+ smaller allocations, summed \(([a-z ]+)\)"', text)
    names = [n for _, n in found]
    assert len(names) >= 3 and set(names) <= {c.replace("_", " ") for c in CATEGORIES}
    assert len({f for f, _ in found}) == len(set(names))  # each category its own tint
