"""Predictions: remedies and scalings replayed on the trace (what-ifs), what fits in a budget, the
caching allocator under a cap, and the parallel plans."""
