"""Bad input: one clear PhasememError, never a traceback from deep inside, never code run from a pickle."""
import gzip
import lzma
import os
import pickle

import pytest

import phasemem
from helpers.paths import shared_paths
from phasemem import PhasememError


def _one_line(err: PhasememError) -> str:
    msg = str(err)
    assert "\n" not in msg and len(msg) < 400
    return msg


def test_missing_file(tmp_path):
    with pytest.raises(PhasememError) as e:
        phasemem.analyze(tmp_path / "nope.pickle")
    assert "no such file" in _one_line(e.value) and "_record_memory_history" in str(e.value)


def test_directory(tmp_path):
    with pytest.raises(PhasememError, match="directory"):
        phasemem.analyze(tmp_path)


def test_empty_and_text_files(tmp_path):
    (tmp_path / "empty.pickle").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("hello, not a snapshot\n")
    with pytest.raises(PhasememError, match="empty"):
        phasemem.analyze(tmp_path / "empty.pickle")
    with pytest.raises(PhasememError, match="not a pickle"):
        phasemem.analyze(tmp_path / "notes.txt")


@pytest.mark.parametrize("path", shared_paths()[:1], ids=lambda p: p.stem)
def test_truncated_pickle_and_truncated_stream_shared(tmp_path, path):
    raw = lzma.decompress(path.read_bytes())
    (tmp_path / "cut.pickle").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(PhasememError, match="truncated or corrupt") as e:
        phasemem.analyze(tmp_path / "cut.pickle")
    _one_line(e.value)
    xz = path.read_bytes()
    (tmp_path / "cut.pkl.xz").write_bytes(xz[: len(xz) // 2])
    with pytest.raises(PhasememError, match="compressed stream is truncated"):
        phasemem.analyze(tmp_path / "cut.pkl.xz")


@pytest.mark.parametrize("path", shared_paths()[:1], ids=lambda p: p.stem)
def test_compressions_are_sniffed_not_trusted_by_extension_shared(tmp_path, path):
    raw = lzma.decompress(path.read_bytes())
    (tmp_path / "snap.bin").write_bytes(gzip.compress(raw))
    (tmp_path / "snap.pickle").write_bytes(raw)
    a = phasemem.analyze(tmp_path / "snap.bin", marker_prefix="gt::")
    b = phasemem.analyze(tmp_path / "snap.pickle", marker_prefix="gt::")
    assert a.peak_bytes == b.peak_bytes and len(a.steps) == len(b.steps) == 3


def test_pickle_of_something_else(tmp_path):
    (tmp_path / "list.pickle").write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(PhasememError, match="holds a list, not a memory snapshot"):
        phasemem.analyze(tmp_path / "list.pickle")


def test_snapshot_without_trace():
    with pytest.raises(PhasememError, match="no allocator trace"):
        phasemem.analyze({"segments": [], "device_traces": [[]]})
    with pytest.raises(PhasememError, match="no allocator trace"):
        phasemem.analyze({"segments": []})


@pytest.mark.parametrize("path", shared_paths()[:1], ids=lambda p: p.stem)
def test_unknown_device_shared(path):
    from helpers.snapshots import load_snapshot

    with pytest.raises(PhasememError, match="device 7 is not in this snapshot"):
        phasemem.analyze(load_snapshot(path), device=7)


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/phasemem-pwned",))


def test_untrusted_pickle_runs_no_code(tmp_path):
    marker = "/tmp/phasemem-pwned"
    if os.path.exists(marker):
        os.unlink(marker)
    (tmp_path / "evil.pickle").write_bytes(pickle.dumps({"device_traces": [[_Evil()]]}))
    with pytest.raises(PhasememError, match="names posix.system|names os.system") as e:
        phasemem.analyze(tmp_path / "evil.pickle")
    assert "trusted=True" in _one_line(e.value)
    assert not os.path.exists(marker)


def test_malformed_entries():
    with pytest.raises(PhasememError, match="malformed"):
        phasemem.analyze({"device_traces": [[{"addr": 1}]], "segments": []})
