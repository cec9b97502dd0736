"""Orchestration: which scheduler runs the work and how row blocks are mapped and reduced."""

from daskkrr.parallel.blocks import RowBlockPasses, tree_sum
from daskkrr.parallel.client import (
    cluster_client,
    current_client,
    local_cluster_kwargs,
    resolve_client,
    scheduler_context,
)

__all__ = [
    "RowBlockPasses",
    "cluster_client",
    "current_client",
    "local_cluster_kwargs",
    "resolve_client",
    "scheduler_context",
    "tree_sum",
]
