"""Regenerate the **After** screens of docs/first-screen.md with this checkout's phasemem.

    python3 docs/make_first_screen.py            # rewrites the After blocks in place (the Before blocks stay)

The demo is ``phasemem demo --device cpu`` (its report, without the lines about the picture); the
published snapshots are ``str(phasemem.analyze(path))`` of ../shared/wild (skipped where absent).
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's phasemem, whatever is installed

import phasemem  # noqa: E402

DOC = ROOT / "docs" / "first-screen.md"
WILD = ROOT.parent / "shared" / "wild"
#: section heading's first words -> how its screen is made
SECTIONS = {"the demo": None, "`silmont_mem_snapshot`": "silmont_mem_snapshot.pickle",
            "`cranberrii_ftcourse`": "cranberrii_ftcourse.pickle", "`bcrafton_cs336`": "bcrafton_cs336.pickle"}


def demo_screen() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([sys.executable, "-m", "phasemem", "demo", "--device", "cpu", "-o", f"{tmp}/d.png"],
                             cwd=ROOT, capture_output=True, text=True, check=True,
                             env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}).stdout
    start = out.index("phasemem report")
    end = out.index("(every step and every shape", start)
    return out[start:out.index("\n", end)]


def screen(name: str | None) -> str | None:
    if name is None:
        return demo_screen()
    path = WILD / name
    return str(phasemem.analyze(str(path))) if path.exists() else None


def main() -> None:
    text = DOC.read_text()
    for head, name in SECTIONS.items():
        got = screen(name)
        if got is None:
            print(f"skipped {head}: {WILD / str(name)} is absent")
            continue
        got = got.rstrip("\n")
        pat = re.compile(r"(## " + re.escape(head) + r".*?\*\*After\*\* \()\d+( lines\):\n\n```\n)(.*?)(\n```)", re.S)
        text, n = pat.subn(lambda m: m.group(1) + str(got.count("\n") + 1) + m.group(2) + got + m.group(4), text, count=1)
        assert n == 1, head
    DOC.write_text(text)


if __name__ == "__main__":
    main()
