"""Many GPUs: which files hold a run's ranks, the report over them (what the distributed wrapper holds in
each rank's trace is told by analysis/roles.py), and the pool that reads many ranks at once."""
