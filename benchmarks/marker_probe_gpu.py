"""Does torch._C._profiler._RecordFunctionFast land in the allocator trace's annotations, and what
does a marker cost? (H200 probe; results in benchmarks/results/marker_probe_h200.txt.)

    PYTHONPATH=. python3 benchmarks/marker_probe_gpu.py
"""
import time

import torch

fast = getattr(torch._C._profiler, "_RecordFunctionFast", None)
print("torch", torch.__version__, "_RecordFunctionFast:", fast is not None)
for glob in (True, False):
    torch.cuda.memory._record_memory_history("all", context="all", stacks="python", max_entries=100000,
                                             clear_history=True, global_record_annotations=glob)
    with torch.profiler.record_function("probe::slow"):
        a = torch.empty(1 << 20, device="cuda")
    if fast is not None:
        with fast("probe::fast"):
            b = torch.empty(1 << 20, device="cuda")
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(None)
    names = sorted({x["name"] for x in snap.get("external_annotations", []) if x["name"].startswith("probe::")})
    print(f"global_record_annotations={glob}: annotations seen {names}")

torch.cuda.memory._record_memory_history("all", context="all", stacks="python", max_entries=1_000_000,
                                         clear_history=True, global_record_annotations=True)
N = 20000
for label, ctx in (("record_function", lambda: torch.profiler.record_function("phasemem::forward")),
                   ("_RecordFunctionFast", (lambda: fast("phasemem::forward")) if fast else None)):
    if ctx is None:
        continue
    t = time.perf_counter()
    for _ in range(N):
        with ctx():
            pass
    print(f"{label}: {(time.perf_counter() - t) / N * 1e6:.2f} us per range while recording")
torch.cuda.memory._record_memory_history(None)
