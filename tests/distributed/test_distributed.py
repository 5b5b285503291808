"""A distributed run recorded through instrument() on every rank and read as one report.

The module fixture spawns a real 2-process torch.distributed job on CPU (gloo, loopback only, a hard
timeout): DDP, then FSDP2 (fully_shard), each rank recording itself with ``instrument()`` and writing
``run.save(folder)``, then ``run.report(gather=True)``. Rank r trains on a batch (r + 1) times rank 0's,
so the ranks' peaks differ. Expected values come from the raw snapshots (tests/helpers/reference.py replays
them), the model's own parameter sizes, and each rank analysed alone.

Run as a script it records such a folder (the lead's GPU recording)::

    python3 tests/distributed/test_distributed.py OUT [--ranks 2] [--device cpu|cuda]
"""
from __future__ import annotations

import argparse
import json
import lzma
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for helpers: also run as a script
from helpers import reference  # noqa: E402  (a naive replay sharing no code with phasemem)
from helpers.paths import ROOT  # noqa: E402

HELDOUT4 = ROOT / "fixtures" / "heldout4"

WORLD = 2
#: The whole 2-rank recording (two interpreters importing torch on 2 cores, two profiled runs each)
#: took 26 s here; past this it is killed and the tests fail rather than hang.
RECORD_TIMEOUT_S = 150
KINDS = ("ddp", "fsdp2")


# ---- the job (runs in the spawned processes) ----------------------------------------------------

def _model(torch):
    # Small weights, wide activations: the batch decides each rank's peak.
    return torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))


def _wrap(kind, model, world, device, torch):
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _worker(rank: int, world: int, port: int, out: str, device_kind: str) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from phasemem import instrument

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    device = torch.device("cuda", rank) if device_kind == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    meta = {"world": world, "device": str(device)}
    for kind in KINDS:
        torch.manual_seed(0)
        model = _model(torch).to(device)
        meta[kind] = {"param_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}
        try:
            wrapped = _wrap(kind, model, world, device, torch)
        except Exception as e:  # noqa: BLE001 - said in the results, so the test can tell why
            meta[kind]["error"] = f"{type(e).__name__}: {e}"
            continue
        opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
        x = torch.randn(512 * (rank + 1), 64, device=device)
        with instrument(wrapped, opt) as run:
            for _ in range(3):
                loss = wrapped(x).square().mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        run.save(os.path.join(out, kind) + "/")
        gathered = run.report(gather=True)
        if rank == 0:
            gathered.to_json(os.path.join(out, f"{kind}_gathered.json"))
    if rank == 0:
        with open(os.path.join(out, "meta.json"), "w") as f:
            json.dump(meta, f)
    dist.destroy_process_group()


def record(out: str, world: int = WORLD, device_kind: str = "cpu") -> None:
    """Spawn the job: ``out/ddp/rank{r}.*``, ``out/fsdp2/rank{r}.*``, the gathered reports, meta.json."""
    import torch.multiprocessing as mp

    with socket.socket() as s:  # a free loopback port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(world, port, out, device_kind), nprocs=world, join=True)


# ---- the tests ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    pytest.importorskip("torch")  # the job trains on torch: the tests that read its folder skip without it
    out = tmp_path_factory.mktemp("distributed")
    proc = subprocess.Popen([sys.executable, __file__, str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True, text=True)
    try:
        log, _ = proc.communicate(timeout=RECORD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the job's own process group: the recorder and its ranks
        log, _ = proc.communicate()
        pytest.fail(f"the {WORLD}-rank recording did not finish in {RECORD_TIMEOUT_S} s:\n{log[-3000:]}")
    assert proc.returncode == 0, log[-3000:]
    return out


def _meta(job: Path) -> dict:
    return json.loads((job / "meta.json").read_text())


def _folder(job: Path, kind: str) -> Path:
    err = _meta(job)[kind].get("error")
    if err:
        pytest.fail(f"{kind} could not be set up on CPU with gloo: {err}")
    return job / kind


def _raw(path: Path) -> dict:
    return pickle.loads(lzma.decompress(path.read_bytes()))


def _replayed_peak(path: Path) -> int:
    snap = _raw(path)
    pre, after, _ = reference.replay(snap["device_traces"][0], snap["segments"], device=-1)
    return max([pre] + after)


@pytest.mark.parametrize("kind", KINDS)
def test_every_rank_saved_itself(job, kind):
    folder = _folder(job, kind)
    assert sorted(p.name for p in folder.iterdir()) == [f"rank{r}.{ext}" for r in range(WORLD) for ext in
                                                        ("json", "pickle.xz")]
    for r in range(WORLD):
        meta = _raw(folder / f"rank{r}.pickle.xz")["phasemem"]
        assert (meta["rank"], meta["world_size"], meta["backend"], meta["device"]) == (r, WORLD, "gloo", "cpu")
        assert json.loads((folder / f"rank{r}.json").read_text())["device"] == "cpu"


@pytest.mark.parametrize("kind", KINDS)
def test_per_rank_numbers_are_each_rank_alone(job, kind):
    import phasemem

    run = phasemem.analyze_ranks(_folder(job, kind))
    assert [s.rank for s in run.ranks] == list(range(WORLD)) and run.steps == [0, 1, 2]
    for s in run.ranks:
        alone = phasemem.analyze(str(_folder(job, kind) / f"rank{s.rank}.pickle.xz"))
        assert s.peak_bytes == alone.peak_bytes
        assert {n: d["peak"] for n, d in s.steps.items()} == {st.number: st.peak_bytes for st in alone.steps}
        for row in run.rows:
            step = next(st for st in alone.steps if st.number == row.step)
            assert row.peaks[s.rank] == step.phases[row.phase].peak_bytes
        for row in run.phases:
            assert row.peaks[s.rank] == alone.phases[row.phase].peak_bytes
    assert run.rows and all(r.spread == max(r.peaks.values()) - min(r.peaks.values()) for r in run.rows)


@pytest.mark.parametrize("kind", KINDS)
def test_imbalance_from_the_raw_trace(job, kind):
    import phasemem

    folder = _folder(job, kind)
    peaks = [_replayed_peak(folder / f"rank{r}.pickle.xz") for r in range(WORLD)]
    run = phasemem.analyze_ranks(str(folder / "rank*.pickle.xz"))  # the glob form
    assert [s.peak_bytes for s in run.ranks] == peaks
    assert run.spread == max(peaks) - min(peaks) > 0  # rank 1's batch is twice rank 0's
    assert run.peak.rank == int(np.argmax(peaks)) and run.peak.bytes == max(peaks)


@pytest.mark.parametrize("kind", KINDS)
def test_gathered_report_is_the_folder_report(job, kind):
    import phasemem

    gathered = json.loads((job / f"{kind}_gathered.json").read_text())
    folder = phasemem.analyze_ranks(_folder(job, kind)).to_dict()
    for key in ("steps", "rows", "phases", "peak", "spread"):
        assert gathered[key] == folder[key], key


def test_fsdp2_roles_on_cpu_from_its_ranges(job):
    import phasemem

    run = phasemem.analyze_ranks(_folder(job, "fsdp2"))
    shard = _meta(job)["fsdp2"]["param_bytes"] // WORLD  # every dim here splits evenly: no padding
    for s in run.ranks:
        assert (s.wrapper, s.evidence) == ("fsdp2", "FSDP2's ranges")  # the CPU recording has no frames
        assert s.parallel["sharded_parameters"] == s.by_category["parameter"] == shard
        assert s.parallel_max["sharded_gradients"] == shard  # the reduce-scatter's outputs, kept as .grad
        assert s.parallel_max["unsharded_parameters"] > 0 and s.parallel_max["all_gather_buffers"] > 0


def _naive_range_roles(snap: dict) -> tuple[dict, dict]:
    """From the raw CPU snapshot alone: bytes made inside each kind of FSDP2 range (by time, START <= t
    <= END), alive at the first event of the naive replay's peak level (an alloc counts from its event,
    a free until its event), and the most alive at once."""
    import re

    events = snap["device_traces"][0]
    kinds = {"all_gather": re.compile(r"FSDP::all_gather( |$)"), "copy_out": re.compile(r"FSDP::all_gather_copy_out\b"),
             "reduce": re.compile(r"FSDP::post_backward_reduce\b")}
    spans = {k: [] for k in kinds}
    opened: dict = {}
    for a in snap["external_annotations"]:
        if a["stage"] == "START":
            opened.setdefault(a["name"], []).append(a["time_us"])
        elif opened.get(a["name"]):
            t0 = opened[a["name"]].pop()
            for k, pat in kinds.items():
                if pat.match(a["name"]):
                    spans[k].append((t0, a["time_us"]))
    blocks, live = [], {}  # (kind, size, alloc event, free event)
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            if e["addr"] in live:  # its free was not recorded (another thread's): it ends where the address is reused
                kind, size, i0 = live.pop(e["addr"])
                blocks.append((kind, size, i0, i - 1))
            kind = next((k for k, sp in spans.items() if any(t0 <= e["time_us"] <= t1 for t0, t1 in sp)), None)
            live[e["addr"]] = (kind, e["size"], i)
        elif e["action"] == "free_completed" and e["addr"] in live:
            kind, size, i0 = live.pop(e["addr"])
            blocks.append((kind, size, i0, i))
    blocks += [(kind, size, i0, len(events)) for kind, size, i0 in live.values()]
    _, after, deltas = reference.replay(events, snap["segments"], device=-1)
    level = [max(a, a - d) for a, d in zip(after, deltas)]
    peak = level.index(max(level))
    at = {k: sum(s for kk, s, i0, i1 in blocks if kk == k and i0 <= peak <= i1) for k in kinds}
    most = {}
    for k in kinds:
        d = [0] * (len(events) + 2)
        for kk, s, i0, i1 in blocks:
            if kk == k:
                d[i0] += s
                d[i1 + 1] -= s
        run, best = 0, 0
        for x in d:
            run += x
            best = max(best, run)
        most[k] = best
    return at, most


def test_fsdp2_range_roles_from_the_raw_trace(job):
    """What the report says FSDP2 holds on each rank, against that rank's raw snapshot: the unsharded
    parameters are what was made inside the copy-out ranges, the all-gather buffers inside the
    all-gather ranges, and the reduce-scatter buffers with the sharded gradients (carved out of them by
    lifetime) inside the reduce ranges: at the rank's peak and at most."""
    import phasemem

    run = phasemem.analyze_ranks(_folder(job, "fsdp2"))
    for s in run.ranks:
        at, most = _naive_range_roles(_raw(_folder(job, "fsdp2") / f"rank{s.rank}.pickle.xz"))
        assert s.parallel["unsharded_parameters"] == at["copy_out"]
        assert s.parallel_max["unsharded_parameters"] == most["copy_out"] > 0
        assert s.parallel["all_gather_buffers"] == at["all_gather"]
        assert s.parallel_max["all_gather_buffers"] == most["all_gather"] > 0
        assert s.parallel["reduce_scatter_buffers"] + s.parallel["sharded_gradients"] == at["reduce"]
        assert s.parallel_max["sharded_gradients"] <= most["reduce"]


def test_ddp_buckets_unknown_without_frames(job):
    import phasemem

    run = phasemem.analyze_ranks(_folder(job, "ddp"))
    for s in run.ranks:
        assert (s.wrapper, s.parallel) == ("ddp", {"ddp_buckets": None})
    assert "DDP buckets unknown (no stack frames)" in str(run)


def test_cli_folder_writes_report_picture_json(job, tmp_path, capsys):
    from phasemem.commands.cli import main

    png, js = tmp_path / "ranks.png", tmp_path / "ranks.json"
    assert main(["analyze", str(_folder(job, "fsdp2")), "-o", str(png), "--json", str(js), "--size", "1200x700"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"phasemem run report — {WORLD} rank(s) (cpu), step(s) 0-2 on every rank"), out
    assert png.read_bytes()[16:24] == (1200).to_bytes(4, "big") + (700).to_bytes(4, "big")
    assert [r["rank"] for r in json.loads(js.read_text())["ranks"]] == list(range(WORLD))


def test_cli_folder_errors_are_one_line(job, tmp_path, capsys):
    from phasemem.commands.cli import main

    (tmp_path / "empty").mkdir()
    assert main(["analyze", str(tmp_path / "empty"), "-o", str(tmp_path / "x.png")]) == 2
    mixed = tmp_path / "mixed"  # two recordings' rank 0: not one run
    mixed.mkdir()
    for kind in KINDS:
        shutil.copy(_folder(job, kind) / "rank0.pickle.xz", mixed / f"{kind}_rank0.pickle.xz")
    assert main(["analyze", str(mixed), "-o", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.startswith("phasemem: error: ") for line in err)
    assert "no snapshot in this folder" in err[0] and "both rank 0" in err[1]
    assert not (tmp_path / "x.png").exists()


def test_folder_leaves_out_oom_dumps(job, tmp_path):
    import phasemem

    folder = tmp_path / "with_oom"
    shutil.copytree(_folder(job, "ddp"), folder)
    shutil.copy(folder / "rank0.pickle.xz", folder / "oom_rank0.pickle.xz")  # as the trainer callbacks name it
    assert [s.rank for s in phasemem.analyze_ranks(folder).ranks] == list(range(WORLD))


def test_ranks_with_different_steps_say_so(job):
    import phasemem
    from phasemem.distributed.run_report import RunReport, summarize

    folder = _folder(job, "ddp")
    a, b = (summarize(phasemem.analyze(str(folder / f"rank{r}.pickle.xz"))) for r in range(WORLD))
    b.steps = {n + 10: v for n, v in b.steps.items()}  # rank 1 as if it had recorded steps 10-12
    with pytest.raises(phasemem.PhasememError, match=r"recorded different steps \(rank 0: 0-2; rank 1: 10-12\)"):
        RunReport.of([a, b])
    b.steps = {n + 1: v for n, v in a.steps.items()}  # 1-3 against 0-2: aligned on 1-2, and said
    run = RunReport.of([a, b])
    assert run.steps == [1, 2] and "rank 0 also has step(s) 0, rank 1 also has step(s) 3" in run.notes[0]


# ---- the one-GPU fixtures (H200, one-rank groups), through the folder path ----------------------

def _as_rank_folder(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    shutil.copy(HELDOUT4 / f"{name}.pkl.xz", folder / "rank0.pickle.xz")
    return folder


@pytest.mark.parametrize("name", ["heldout4_gpt_ddp", "heldout4_gpt_ddp_bucket_view"])
def test_h200_ddp_buckets_from_frames(tmp_path, name):
    import phasemem

    run = phasemem.analyze_ranks(_as_rank_folder(tmp_path, name))
    (s,) = run.ranks
    param_bytes = _raw(HELDOUT4 / f"{name}.pkl.xz")["phasemem"]["meta"]["param_bytes"]
    # The reducer's rebuilt buckets hold a flat copy of every gradient: all the parameters' bytes.
    assert (s.wrapper, s.evidence, s.parallel) == ("ddp", "stack frames", {"ddp_buckets": param_bytes})
    assert s.peak_bytes == phasemem.analyze(str(HELDOUT4 / f"{name}.pkl.xz")).peak_bytes


def test_h200_fsdp2_roles_from_frames(tmp_path):
    import phasemem

    name = "heldout4_gpt_fsdp2_bf16"
    run = phasemem.analyze_ranks(_as_rank_folder(tmp_path, name))
    (s,) = run.ranks
    param_bytes = _raw(HELDOUT4 / f"{name}.pkl.xz")["phasemem"]["meta"]["param_bytes"]
    assert s.wrapper == "fsdp2" and s.evidence.startswith("stack frames")
    # One rank: the shard is the whole fp32 model, and so is the gradient the reduce-scatter leaves.
    assert s.parallel["sharded_parameters"] == s.parallel_max["sharded_gradients"] == param_bytes
    # bf16 unsharded copies of a block at a time (and the root's), never the whole fp32 model.
    assert 0 < s.parallel_max["unsharded_parameters"] < param_bytes // 2


def test_no_wrapper_no_claim(tmp_path):
    import phasemem

    run = phasemem.analyze_ranks(_as_rank_folder(tmp_path, "heldout4_llama_hf_trainer"))
    assert (run.ranks[0].wrapper, run.ranks[0].parallel) == (None, {})


def test_pictures_lanes_and_heat(job):
    import phasemem
    from phasemem.reporters.picture.ranks import plot_ranks

    run = phasemem.analyze_ranks(_folder(job, "ddp"))
    assert plot_ranks(run).phasemem_mode == "lanes"
    fig = plot_ranks(run, size=(800, 480), heat=True)
    assert fig.phasemem_mode == "heat" and tuple(fig.get_size_inches() * fig.dpi) == (800, 480)
    with pytest.raises(ValueError, match="at least"):
        plot_ranks(run, size=(100, 100))


def test_the_lanes_slot_grid_is_drawn_thin_under_everything(tmp_path):
    """The slots' boundaries are one collection of thin lines under the lanes (a comment once swallowed
    its width and order, and the grid was drawn at matplotlib's defaults, over the lanes)."""
    from matplotlib.collections import LineCollection

    import phasemem
    from phasemem.reporters.picture.ranks import plot_ranks

    run = phasemem.analyze_ranks(_as_rank_folder(tmp_path, "heldout4_llama_hf_trainer"))
    fig = plot_ranks(run)
    grids = [c for ax in fig.axes for c in ax.collections
             if isinstance(c, LineCollection) and c.get_transform() is not None and c.get_zorder() == 0]
    assert grids, "a slot grid under the lanes"
    assert all(float(np.max(g.get_linewidths())) == 0.6 for g in grids)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="record a distributed run through instrument(), a folder per wrapper")
    p.add_argument("out")
    p.add_argument("--ranks", type=int, default=WORLD)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    a = p.parse_args()
    record(a.out, a.ranks, a.device)
