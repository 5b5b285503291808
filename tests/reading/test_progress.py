"""Progress on stderr (issue 40: a 10M-event read was silent for tens of seconds): a line rewritten
in place while a command runs, only where stderr is a terminal (a pty here), cleared before the
report; nothing at all where stderr is a pipe or a file."""
import os
import pty
import subprocess
import sys

from helpers.paths import ROOT
from phasemem import progress
from phasemem.read.batched import read_batched
from phasemem.read.decoder import decode_trace

FIXTURE = ROOT / "fixtures" / "gpt_foreach.pkl.xz"
PLAIN = ROOT / "fixtures" / "plain_gpt_torch_defaults.pkl.xz"


def _run(tmp_path, stderr):
    """phasemem analyze FIXTURE with the line due at once (PHASEMEM_PROGRESS_AFTER=0): (rc, stdout)."""
    env = dict(os.environ, PHASEMEM_PROGRESS_AFTER="0", PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "phasemem", "analyze", str(FIXTURE), "-o", str(tmp_path / "m.png")],
                       stdout=subprocess.PIPE, stderr=stderr, env=env, cwd=ROOT, timeout=300)
    return p.returncode, p.stdout


def _drain(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            data = os.read(fd, 1 << 16)
        except OSError:  # EIO: the other side is closed and everything was read
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


def test_a_terminal_sees_each_stage_then_a_clean_line(tmp_path):
    master, slave = pty.openpty()
    try:
        rc, out = _run(tmp_path, slave)
    finally:
        os.close(slave)
    shown = _drain(master).decode()
    os.close(master)
    assert rc == 0
    lines = [x for x in shown.split("\r") if x.strip()]
    assert lines and all(x.startswith("phasemem: ") for x in lines), lines
    said = " | ".join(lines)
    for stage in (f"reading {FIXTURE.name}", "analysing 2,531 events", "drawing "):
        assert stage in said, said
    assert shown.endswith("\r") and shown.split("\r")[-2].strip() == ""  # cleared at the end
    assert "\n" not in shown  # one line, rewritten: nothing scrolls
    # the report itself is what a pipe gets
    rc2, quiet = _run(tmp_path, subprocess.PIPE)
    assert rc2 == 0 and out == quiet


def test_silent_where_stderr_is_no_terminal(tmp_path):
    p_err = tmp_path / "err.txt"
    with open(p_err, "wb") as f:
        rc, out = _run(tmp_path, f)
    assert rc == 0 and out.startswith("phasemem report".encode())
    assert p_err.read_bytes() == b""


def test_the_readers_count_their_events_as_they_go():
    master, slave = pty.openpty()
    try:
        with open(slave, "w", closefd=False) as tty, progress.shown(tty):
            progress.stage("reading")
            t = read_batched(str(PLAIN), None, False)
            assert progress._line.n == len(t) > 0
            progress.stage("reading")
            assert progress._line.n is None
            t2 = decode_trace(str(PLAIN), always=True)
            # the decoder counts per chunk what it has committed: all but the events still in hand
            assert len(t2) == len(t) and 0.99 * len(t) <= progress._line.n <= len(t)
        assert progress._line is None  # and nothing is left on
    finally:
        os.close(slave)
        os.close(master)
    # with nothing shown, the readers' calls do nothing
    assert read_batched(str(PLAIN), None, False) is not None and progress._line is None
