"""PyTorch's CUDA caching allocator replayed over a trace: what a capped card runs out of is the
allocator's segments at the new size, not the allocated peak (its rules: docs/what-if.md, "What fits").

``rules.py``: the sizes it rounds to and the settings a replay follows; ``pools.py``: the allocator
itself (``CachingAllocator``: pools, blocks, segments); ``layout.py``: its state at an event, from the
snapshot and the trace; ``over_events.py``: a trace's allocations and frees driven through it
(``replay``, ``replay_trace``).
"""
