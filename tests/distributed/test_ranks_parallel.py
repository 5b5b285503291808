"""The folder report analysed in parallel (issue 41): on local processes (``workers``) and on a Dask
cluster (``scheduler``), the same report as one rank after another, the same one-line errors.

The ranks are real recordings of one model that differ as ranks of an uneven job would (fixtures/pairs:
the base run, half the batch, checkpointing, chunked cross-entropy; steps 0-4 in each), copied into a
folder as ``rank<r>.pickle.xz``. Each rank's peak is checked against tests/helpers/reference.py's naive replay of
its raw trace, so the equal reports are not equal by being empty. The Dask tests run on a
``distributed.LocalCluster`` of two worker processes and skip where dask is not installed.
"""
from __future__ import annotations

import json
import lzma
import pickle
import shutil
import sys
from pathlib import Path

import pytest

import phasemem
from helpers import reference  # noqa: E402  (a naive replay sharing no code with phasemem)
from helpers.paths import FIXTURES, ROOT
from phasemem.commands.cli import main
from phasemem.distributed import pool as ranks_mod

PAIRS = FIXTURES / "pairs"
RANKS = ["base", "half_batch", "ckpt", "chunked_ce"]  # rank r is RANKS[r]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "mem"
    out.mkdir()
    for r, name in enumerate(RANKS):
        shutil.copy(PAIRS / f"{name}.pkl.xz", out / f"rank{r}.pickle.xz")
    return out


def _replayed_peak(path: Path) -> int:
    snap = pickle.loads(lzma.decompress(path.read_bytes()))
    dev = max(range(len(snap["device_traces"])), key=lambda d: len(snap["device_traces"][d]))
    _, after, _ = reference.replay(snap["device_traces"][dev], snap["segments"], dev)
    return max(after)


def _with_garbage(folder: Path, tmp_path: Path, *bad: int) -> Path:
    """The folder with the ranks in ``bad`` replaced by files that are not snapshots."""
    out = tmp_path / "bad"
    shutil.copytree(folder, out)
    for r in bad:
        (out / f"rank{r}.pickle.xz").write_bytes(lzma.compress(b"not a pickle"))
    return out


def _cli(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


# ---- local processes ---------------------------------------------------------------------------------

def test_same_report_one_after_another_and_on_two_processes(folder):
    one = phasemem.analyze_ranks(folder, workers=1)
    two = phasemem.analyze_ranks(folder, workers=2)
    assert [s.peak_bytes for s in one.ranks] == [_replayed_peak(folder / f"rank{r}.pickle.xz") for r in range(4)]
    assert len({s.peak_bytes for s in one.ranks}) == 4 and one.peak.rank == 0  # the base run holds the most
    assert two.to_dict() == one.to_dict()
    assert str(two) == str(one)


def test_run_text_folds_alike_steps(folder, tmp_path, capsys):
    """The run's text shows the typical step and each kind of step that differs (alike: every rank's peak in
    every phase within ALIKE of the typical step's peak, as the one-trace report's rule), then all steps;
    ``--full`` every step's rows."""
    import re

    from phasemem.analysis.typical import ALIKE

    run = phasemem.analyze_ranks(folder, workers=1)
    rows = lambda text: [ln for ln in text.splitlines() if re.match(r"\s+\d+ [a-z_]+ ", ln)]  # noqa: E731
    full = run.text(full=True)
    assert len(rows(full)) == len(run.rows)
    # independently of the reporter: each step against step 1, rank by rank and phase by phase
    of = {(r.step, r.phase): r.peaks for r in run.rows}
    ref = {ph: p for (st, ph), p in of.items() if st == 1}
    top = max(v for p in ref.values() for v in p.values())
    alike = [s for s in run.steps if {ph for (st, ph) in of if st == s} == set(ref)
             and all(abs(of[s, ph][k] - ref[ph][k]) <= ALIKE * top for ph in ref for k in ref[ph])]
    assert alike == [1, 2, 3, 4]  # step 0 differs: no optimizer state before its update
    short = str(run)
    assert sorted({int(ln.split()[0]) for ln in rows(short)}) == [0, 1]
    assert f"4 of 5 steps within {ALIKE:.0%}" in short and len(short.splitlines()) < len(full.splitlines())
    code, out, err = _cli(["analyze", str(folder), "--full", "-o", str(tmp_path / "r.png"), "--workers", "1"], capsys)
    assert code == 0 and rows(out) == rows(full)


def test_run_text_names_the_ranks_at_the_ends_past_many(folder, monkeypatch):
    """Past RANK_LINES ranks, the wrapper's lines are the first rank's, the highest's and the lowest's;
    ``full`` keeps every rank's."""
    from phasemem.reporters.text import ranks as text_ranks

    run = phasemem.analyze_ranks(folder, workers=1)
    monkeypatch.setattr(text_ranks, "RANK_LINES", 2)
    import re

    wrapper = re.compile(r"  rank (\d+) \S+ peak ")
    said = [int(m.group(1)) for m in map(wrapper.match, str(run).splitlines()) if m]
    peaks = {s.rank: s.peak_bytes for s in run.ranks}
    want = sorted({0, max(peaks, key=peaks.get), min(peaks, key=peaks.get)})
    assert said == want and f"… {len(peaks) - len(want)} more ranks" in str(run)
    assert len([ln for ln in run.text(full=True).splitlines() if wrapper.match(ln)]) == 4


def test_default_is_every_core_and_says_the_same(folder, monkeypatch):
    used = []
    real = ranks_mod._on_processes
    monkeypatch.setattr(ranks_mod, "local_cores", lambda: 3)
    monkeypatch.setattr(ranks_mod, "_on_processes", lambda paths, workers, *a: used.append(workers) or real(paths, workers, *a))
    small = phasemem.analyze_ranks(folder)  # 4 x 45 KB: less than starting workers costs, so none
    assert used == [] and sum(p.stat().st_size for p in folder.iterdir()) < ranks_mod.MIN_POOL_BYTES
    monkeypatch.setattr(ranks_mod, "MIN_POOL_BYTES", 0)
    assert phasemem.analyze_ranks(folder).to_dict() == small.to_dict() == phasemem.analyze_ranks(folder, workers=1).to_dict()
    assert used == [3]  # every core, and no pool for workers=1


def test_one_file_or_one_worker_starts_no_pool(folder, tmp_path, monkeypatch):
    def no_pool(*a, **k):
        raise AssertionError("a pool was started")

    monkeypatch.setattr(ranks_mod, "_on_processes", no_pool)
    single = tmp_path / "single"
    single.mkdir()
    shutil.copy(folder / "rank2.pickle.xz", single / "rank2.pickle.xz")
    assert phasemem.analyze_ranks(single, workers=8).peak.bytes == _replayed_peak(single / "rank2.pickle.xz")
    assert len(phasemem.analyze_ranks(folder, workers=1).ranks) == 4


def test_only_the_summary_comes_back(folder):
    """What a worker returns is the rank's summary (and its broken budgets), a small part of the trace."""
    path = folder / "rank0.pickle.xz"
    got = ranks_mod.summarize_file(str(path), "mem/rank0.pickle.xz")
    assert isinstance(got[0], ranks_mod.RankSummary) and got[1] == [] and got[0].name == "mem/rank0.pickle.xz"
    trace = len(lzma.decompress(path.read_bytes()))
    assert len(pickle.dumps(got)) < trace / 20, (len(pickle.dumps(got)), trace)


def test_workers_start_clean_processes():
    # Not fork: a caller that imported torch (threads, a CUDA context) must not hand its locks to a child.
    assert ranks_mod._start_method().get_start_method() in ("forkserver", "spawn")


def test_script_without_main_guard(folder, tmp_path):
    """A plain script (no ``if __name__ == "__main__":``) that asks for the ranks on processes: its body
    runs once, in its own process, not again in each worker (spawn and forkserver would re-run it)."""
    import os
    import subprocess

    script = tmp_path / "plain.py"
    script.write_text("import phasemem\nprint('body ran')\n"
                      f"run = phasemem.analyze_ranks({str(folder)!r}, workers=2)\nprint('peak rank', run.peak.rank)\n")
    root = str(ROOT)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300)
    assert (done.returncode, done.stdout) == (0, "body ran\npeak rank 0\n"), done.stderr


def test_cli_same_output_every_way(folder, tmp_path, capsys):
    outs = {}
    for w in ("1", "2"):
        png, js = tmp_path / f"w{w}.png", tmp_path / f"w{w}.json"
        code, out, err = _cli(["analyze", str(folder), "-o", str(png), "--json", str(js), "--workers", w], capsys)
        assert (code, err) == (0, "")
        outs[w] = (out.replace(str(png), "PNG").replace(str(js), "JSON"), json.loads(js.read_text()), png.read_bytes())
    assert outs["1"] == outs["2"]
    assert outs["1"][0].startswith("phasemem run report — 4 rank(s) (cuda), step(s) 0-4 on every rank")


@pytest.mark.parametrize("workers", ["1", "2"])
def test_cli_bad_file_is_one_line_naming_it(folder, tmp_path, capsys, workers):
    bad = _with_garbage(folder, tmp_path, 2, 3)
    png = tmp_path / "x.png"
    code, out, err = _cli(["analyze", str(bad), "-o", str(png), "--workers", workers], capsys)
    # The first bad file in rank order, as one after another would meet it; nothing written.
    assert code == 2 and not png.exists()
    assert err.count("\n") == 1 and err.startswith(f"phasemem: error: {bad / 'rank2.pickle.xz'}: not a pickle"), err


def test_error_names_the_file_as_given(folder, tmp_path, monkeypatch):
    bad = _with_garbage(folder, tmp_path, 1)
    monkeypatch.chdir(bad.parent)  # relative names: the workers read absolute paths, the message says these
    said = set()
    for w in (1, 2):
        with pytest.raises(phasemem.PhasememError) as e:
            phasemem.analyze_ranks("bad", workers=w)
        said.add(str(e.value))
    assert len(said) == 1 and said.pop().startswith("bad/rank1.pickle.xz: not a pickle")


def test_cli_budgets_checked_in_the_workers(folder, tmp_path, capsys):
    got = {}
    for w in ("1", "2"):
        code, out, err = _cli(["analyze", str(folder), "-o", str(tmp_path / f"b{w}.png"), "--workers", w,
                               "--fail-if", "peak>10GiB"], capsys)
        got[w] = (code, err)
    assert got["1"] == got["2"]
    code, err = got["2"]
    # base (14.92 GiB) and ckpt (12.58 GiB) break it, half_batch and chunked_ce do not
    assert code == 1 and [line.split(": ")[1] for line in err.splitlines()] == [
        str(folder / "rank0.pickle.xz"), str(folder / "rank2.pickle.xz")], err


def test_bad_worker_counts(folder, tmp_path, capsys):
    code, _, err = _cli(["analyze", str(folder), "-o", str(tmp_path / "x.png"), "--workers", "0"], capsys)
    assert code == 2 and "--workers" in err and "1 or more" in err
    for bad in (0, -1, 1.5, True):
        with pytest.raises(phasemem.PhasememError, match="1 or more"):
            phasemem.analyze_ranks(folder, workers=bad)
    with pytest.raises(phasemem.PhasememError, match="not both"):
        phasemem.analyze_ranks(folder, workers=2, scheduler="tcp://127.0.0.1:1")


def test_no_dask_says_what_to_install(folder, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    with pytest.raises(phasemem.PhasememError, match=r"pip install 'phasemem\[dask\]'"):
        phasemem.analyze_ranks(folder, scheduler="tcp://127.0.0.1:8786")


# ---- a Dask cluster ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed")
    import logging

    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                  silence_logs=logging.ERROR) as c:
        yield c


def test_dask_same_report(folder, cluster):
    one = phasemem.analyze_ranks(folder, workers=1)
    on_dask = phasemem.analyze_ranks(folder, scheduler=cluster.scheduler_address)
    assert on_dask.to_dict() == one.to_dict() and str(on_dask) == str(one)
    from distributed import Client

    with Client(cluster.scheduler_address, set_as_default=False) as client:  # a client of the caller's own
        assert phasemem.analyze_ranks(folder, scheduler=client).to_dict() == one.to_dict()
        assert client.status == "running"  # left open: it is the caller's


def test_dask_cli_and_its_errors(folder, cluster, tmp_path, capsys, monkeypatch):
    png, js = tmp_path / "d.png", tmp_path / "d.json"
    code, out, err = _cli(["analyze", str(folder), "-o", str(png), "--json", str(js),
                           "--scheduler", cluster.scheduler_address], capsys)
    assert (code, err) == (0, "")
    assert json.loads(js.read_text()) == json.loads(json.dumps(phasemem.analyze_ranks(folder, workers=1).to_dict()))
    bad = _with_garbage(folder, tmp_path, 3)
    monkeypatch.chdir(bad.parent)  # a relative name: the cluster's workers have another working directory
    code, _, err = _cli(["analyze", "bad", "-o", str(tmp_path / "x.png"), "--scheduler", cluster.scheduler_address], capsys)
    code1, _, err1 = _cli(["analyze", "bad", "-o", str(tmp_path / "x.png"), "--workers", "1"], capsys)
    assert (code, err) == (code1, err1) == (2, err1) and err.startswith("phasemem: error: bad/rank3.pickle.xz: not a pickle")
    assert err.count("\n") == 1 and not (tmp_path / "x.png").exists()


def test_dask_scheduler_not_there(folder, monkeypatch, capsys, tmp_path):
    pytest.importorskip("distributed")
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(ranks_mod, "SCHEDULER_CONNECT_S", 1)
    code, _, err = _cli(["analyze", str(folder), "-o", str(tmp_path / "x.png"), "--scheduler", f"tcp://127.0.0.1:{port}"],
                        capsys)
    assert code == 2 and err.count("\n") == 1 and f"no Dask scheduler answered at tcp://127.0.0.1:{port}" in err
