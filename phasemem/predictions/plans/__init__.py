"""Parallel plans as what-ifs: what rank r of an N-rank job would hold under DDP, ZeRO-1/2 or FSDP2,
replayed on a one-GPU trace (docs/plans.md).

Example:
    >>> p = plan(report.analysis, report.patterns, "fsdp2", ranks=8, param_dtype="bf16")
    >>> p.applies, p.predicted_peak_bytes, p.categories
"""
from .blocks import ROLE_CATEGORY, ROLES
from .params import dtype_bytes, period_of, shard_bytes, zero_owner
from .plan import GRID_RANKS, PLANS, Plan, PlanBar, PlanChange, format_plan, parse_plan, plan, plan_change, plan_grid

__all__ = ["GRID_RANKS", "PLANS", "ROLE_CATEGORY", "ROLES", "Plan", "PlanBar", "PlanChange", "dtype_bytes", "format_plan", "parse_plan",
           "period_of", "plan", "plan_change", "plan_grid", "shard_bytes", "zero_owner"]
