"""pytest plugin (entry point ``pytest11``): memory budgets on a test, by phase and by shape.

    @pytest.mark.phasemem_limit(peak="2 GiB", backward="1.5 GiB", logits="512 MiB")
    def test_train_step(): ...

records the test's body (CUDA when available, else the CPU profiler path of ``instrument()``),
analyses it, and fails the test when a budget is broken, saying which phase and which shape broke
it; the picture, the report's JSON and the snapshot are written next to the test's report
(``--phasemem-dir``, else beside ``--junitxml``, else ``.phasemem/`` in the rootdir). Keywords:
``peak``, a phase (its peak), a category (at the peak) or a shape kind (its size); positional
arguments are ``--fail-if`` expressions (``"optimizer.peak>6GiB"``). Only absolute budgets: a test
has no base run.

It nests with a test's own ``instrument()``; it imports nothing heavy until a marked test runs
(docs/compare.md, "pytest").
"""
from __future__ import annotations

import lzma
import os
import pickle
import re

import pytest

MARKER = "phasemem_limit"
#: Output files are named after the test's node id, cut to this many characters (file systems
#: allow 255 bytes a name; the suffixes need the rest).
MAX_STEM = 160


def pytest_addoption(parser) -> None:
    group = parser.getgroup("phasemem")
    group.addoption("--phasemem-dir", default=None, metavar="DIR",
                    help="where a test over its phasemem_limit budget gets its picture, report JSON and snapshot "
                         "(default: beside --junitxml, else .phasemem/ in the rootdir)")


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}(*budgets, peak=SIZE, <phase>=SIZE, <category>=SIZE, <shape>=SIZE): record the "
        "test's memory with phasemem and fail it when a budget is broken (e.g. peak='2 GiB', backward='1.5 GiB')")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return (yield)
    from ..errors import PhasememError  # phasemem is loaded only for marked tests

    try:
        budgets = marker_budgets(marker)
        recording = _Recording().start()
    except PhasememError as e:
        raise pytest.fail.Exception(f"{MARKER}: {e}", pytrace=False) from None
    try:
        result = yield
    finally:
        snapshot = recording.stop()
    _check(item, budgets, snapshot, recording.note)
    return result


def marker_budgets(marker) -> list:
    """The marker's budgets: positional ``--fail-if`` texts, and keyword sizes.

    Example:
        >>> [b.text for b in marker_budgets(pytest.mark.phasemem_limit("peak>2GiB", backward="1 GiB").mark)]
        ['peak>2GiB', 'backward=1 GiB']
    """
    from ..errors import PhasememError
    from ..report.budgets import budget_for, parse_budgets

    budgets = parse_budgets(marker.args, absolute=True) + [budget_for(k, v) for k, v in marker.kwargs.items()]
    if not budgets:
        raise PhasememError("give at least one budget, e.g. @pytest.mark.phasemem_limit(peak='2 GiB')")
    return budgets


class _Recording:
    """This test's recording: instrument() without a model (backward still marked), on CUDA when
    there is one. On the CPU it gives way to the test's own instrument() block (see the module doc)."""

    def __init__(self):
        self.run = None
        self.inner: list = []
        self.note = ""
        self._restore = None

    def start(self) -> "_Recording":
        import torch  # torch only once a marked test runs

        from ..capture.instrument import Recording

        self.run = Recording(None, device="cuda" if torch.cuda.is_available() else "cpu").start()
        if self.run.source == "cpu-profiler":
            original, outer = Recording.start, self

            def start(run):
                # torch's CPU profiler does not nest: the test's own block takes over the recording.
                if run is not outer.run and outer.run._state == "running":
                    outer.run.stop()
                    outer.inner.append(run)
                return original(run)

            Recording.start = start  # type: ignore[method-assign]  # until _restore()
            self._restore = lambda: setattr(Recording, "start", original)
        return self

    def stop(self) -> dict | None:
        try:
            self.run.stop()
        finally:
            if self._restore is not None:
                self._restore()
        done = [r.snapshot for r in self.inner if r.snapshot is not None]
        if done:
            self.note = "on the CPU, the test's own instrument() block was measured (profilers do not nest)"
            return max(done, key=lambda s: sum(len(t) for t in s["device_traces"]))
        return self.run.snapshot


def _check(item, budgets, snapshot, note: str) -> None:
    from ..errors import PhasememError
    from ..report.budgets import check_report
    from ..report.pipeline import analyze

    if snapshot is None:
        raise pytest.fail.Exception(f"{MARKER}: the recording could not be finished, so no budget was checked",
                                    pytrace=False)
    try:
        report = analyze(snapshot)
        broken = check_report(budgets, report)
    except PhasememError as e:
        raise pytest.fail.Exception(f"{MARKER}: {e}", pytrace=False) from None
    if not broken:
        return
    paths = _write(item, report, snapshot)
    item.user_properties.append(("phasemem_picture", paths[0]))
    item.add_report_section("call", "phasemem", str(report))
    lines = [f"{MARKER}: {line}" for line in broken] + ([f"{MARKER}: {note}"] if note else [])
    lines.append(f"{MARKER}: picture {paths[0]}; report {paths[1]}; snapshot {paths[2]} (phasemem analyze it)")
    raise pytest.fail.Exception("\n".join(lines), pytrace=False)


def _write(item, report, snapshot) -> list[str]:
    from ..output import write_all

    folder = _folder(item.config)
    os.makedirs(folder, exist_ok=True)
    stem = os.path.join(folder, re.sub(r"[^A-Za-z0-9_.-]+", "_", item.nodeid).strip("_")[-MAX_STEM:])
    paths = [stem + ".png", stem + ".json", stem + ".pkl.xz"]
    data = lzma.compress(pickle.dumps(snapshot, protocol=4))

    def dump(tmp):
        with open(tmp, "wb") as f:
            f.write(data)

    write_all([(paths[0], report.picture_writer(paths[0])), (paths[1], report.json_writer()), (paths[2], dump)])
    return paths


def _folder(config) -> str:
    chosen = config.getoption("phasemem_dir")
    if chosen:
        return os.path.abspath(chosen)
    xml = getattr(config.option, "xmlpath", None)
    if xml:
        return os.path.dirname(os.path.abspath(xml))
    return os.path.join(str(config.rootpath), ".phasemem")
