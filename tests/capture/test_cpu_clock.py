"""The CPU trace's ``time_us`` is the host's ``time.time_ns() // 1000``, even where the profiler's own
clock disagrees with the host's (CI's machine, issue 42's run: the truth loop's host spans missed
the profiler's events by more than a forward)."""
from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
from phasemem.capture import cpu  # noqa: E402


@pytest.mark.parametrize("skew_ms", [0, 40, -40])
def test_events_fall_inside_the_host_spans_that_made_them(monkeypatch, skew_ms):
    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() + skew_ms * 1_000_000)  # the host's clock moved
    prof = cpu.start_profiler()
    spans = []
    for i in range(4):
        h0 = time.time_ns() // 1000
        kept = torch.ones(1024 * (i + 1))  # 4 KiB, 8 KiB, ...: each span's own size
        spans.append((h0, time.time_ns() // 1000, kept.untyped_storage().nbytes()))
        time.sleep(0.002)
        del kept
    cpu.stop_profiler(prof)
    snap = cpu.snapshot_from_profiler(prof)
    events = snap["device_traces"][0]
    for t0, t1, nbytes in spans:
        made = [e["time_us"] for e in events if e["action"] == "alloc" and e["size"] == nbytes]
        assert len(made) == 1 and t0 <= made[0] <= t1, (skew_ms, t0, t1, made)
    assert not any(a["name"] == cpu.CLOCK_ANCHOR for a in snap["external_annotations"])
