"""Many GPUs: what a distributed wrapper holds in one rank's trace, which files hold a run's ranks, and the
report over them."""
