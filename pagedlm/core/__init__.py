"""The planner: block pool, KV cache manager with prefix caching, scheduler (pure Python)."""

from __future__ import annotations

from pagedlm.core.block_pool import NULL_BLOCK_ID, BlockPool
from pagedlm.core.kv_cache_manager import KVCacheManager
from pagedlm.core.scheduler import Scheduler, SchedulerStats

__all__ = ["NULL_BLOCK_ID", "BlockPool", "KVCacheManager", "Scheduler", "SchedulerStats"]
