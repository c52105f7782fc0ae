"""KV cache groups for models that mix full and sliding-window layers (vLLM's hybrid manager).

Layers are split into groups of equal size, each of one attention kind (full, or window W):
`kv_cache_groups`. Every group keeps its own block list per request, on one shared BlockPool: a
token costs a block in every group, and a sliding group frees its blocks below the window as a
uniformly windowed model does (kv_cache_manager.py), while a full group keeps them all. The
worker gives each group one block table; layer i of every group reads and writes the same KV
tensor (so a block id is one block of one layer in each position), which is where the memory
goes back: a block costs group-size layers, not all of them.

Prefix caching per group: each group registers its blocks under the block hash tagged with the
group index, and a hit of k blocks needs what every group needs for k: the full groups all k
blocks, a sliding group the last cdiv(W - 1, B) of them (vLLM's rule). The hit is the longest k
every group accepts, found by shrinking k until all agree.

HybridKVCacheManager answers the scheduler as KVCacheManager does; a prefix hit is one flat list,
the k hit blocks of group 0, then of group 1, and so on; get_block_ids is group 0's list, the other
groups reach the worker through other_group_block_ids / group_updates (diffs since the last).
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedlm.core.block_hash import BlockHash
from pagedlm.core.block_pool import NULL_BLOCK_ID, BlockPool
from pagedlm.core.kv_cache_manager import KVCacheManager
from pagedlm.core.sched_output import GroupBlockUpdate
from pagedlm.core.sliding_window import cdiv, uniform_window
from pagedlm.request import Request

Window = int | None  # None: full attention


def kv_cache_groups(layer_windows: Sequence[Window]) -> list[tuple[Window, list[int]]]:
    """(window, layers) per group: layers of one window in groups of the smallest kind's layer
    count (the last group of a kind may be short: its missing layers are padding). Full first."""
    kinds: dict[Window, list[int]] = {}
    for layer, window in enumerate(layer_windows):
        kinds.setdefault(window, []).append(layer)
    group_size = min(len(layers) for layers in kinds.values())
    order = sorted(kinds, key=lambda window: -1 if window is None else window)
    return [
        (window, kinds[window][start : start + group_size])
        for window in order
        for start in range(0, len(kinds[window]), group_size)
    ]


def engine_kv_groups(
    layer_windows: Sequence[Window], free_sliding_window: bool = True
) -> list[tuple[Window, list[int]]]:
    """The groups an engine runs: kv_cache_groups where layers mix windows; else one group of
    every layer, with their window (None, every block kept, when not free_sliding_window)."""
    if len(set(layer_windows)) == 1 or not free_sliding_window:
        window = uniform_window(layer_windows) if free_sliding_window else None
        return [(window, list(range(len(layer_windows))))]
    return kv_cache_groups(layer_windows)


def make_kv_cache_manager(
    num_blocks: int,
    block_size: int,
    enable_prefix_caching: bool,
    group_windows: Sequence[Window],
) -> KVCacheManager | HybridKVCacheManager:
    """One group: today's manager (a uniform window or none); several: the hybrid one."""
    if len(group_windows) == 1:
        return KVCacheManager(num_blocks, block_size, enable_prefix_caching, group_windows[0])
    return HybridKVCacheManager(num_blocks, block_size, enable_prefix_caching, group_windows)


class HybridKVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool,
        group_windows: Sequence[Window],
    ) -> None:
        if len(group_windows) < 2:
            raise ValueError("group_windows: a hybrid cache has at least two groups")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks)
        self.group_windows = tuple(group_windows)
        self.groups = [
            KVCacheManager(
                num_blocks,
                block_size,
                enable_prefix_caching,
                window,
                pool=self.pool,
                cache_key_suffix=b"" if g == 0 else g.to_bytes(2, "little"),
            )
            for g, window in enumerate(group_windows)
        ]
        # per group >= 1: the request's entries the worker has (group_updates' diffs)
        self._num_sent: list[dict[str, int]] = [{} for _ in group_windows]

    @property
    def usage(self) -> float:
        return self.pool.usage

    @property
    def capacity_tokens(self) -> int:
        """Tokens one request can hold for sure: as if every group kept all its blocks (a prefill
        chunk holds its whole length in a sliding group too)."""
        return self.pool.num_usable_blocks // len(self.groups) * self.block_size

    @property
    def prefix_cache_queries(self) -> int:
        return self.groups[0].prefix_cache_queries

    @property
    def prefix_cache_hits(self) -> int:
        return self.groups[0].prefix_cache_hits

    def get_block_ids(self, req_id: str) -> list[int]:
        return self.groups[0].get_block_ids(req_id)

    def get_num_null_blocks(self, req_id: str) -> int:
        return self.groups[0].get_num_null_blocks(req_id)

    def all_block_ids(self, req_id: str) -> list[int]:
        return [b for group in self.groups for b in group.get_block_ids(req_id)]

    def num_held_blocks(self, req_id: str) -> int:
        return sum(group.num_held_blocks(req_id) for group in self.groups)

    def other_group_block_ids(self, req_id: str) -> tuple[list[int], ...]:
        """Groups 1..'s block lists, as the worker receives them with a new request."""
        block_lists = tuple(list(group.get_block_ids(req_id)) for group in self.groups[1:])
        for num_sent, block_ids in zip(self._num_sent[1:], block_lists, strict=True):
            num_sent[req_id] = len(block_ids)
        return block_lists

    def group_updates(self, req_id: str) -> tuple[GroupBlockUpdate, ...]:
        """Groups 1..'s changes since the request's last update (new blocks, nulls, trims)."""
        updates = []
        for group, num_sent in zip(self.groups[1:], self._num_sent[1:], strict=True):
            block_ids = group.get_block_ids(req_id)
            num_kept = min(num_sent.get(req_id, 0), len(block_ids))
            updates.append(
                GroupBlockUpdate(
                    block_ids[num_kept:], group.get_num_null_blocks(req_id), len(block_ids)
                )
            )
            num_sent[req_id] = len(block_ids)
        return tuple(updates)

    def get_computed_blocks(
        self, request: Request, token_budget: int | None = None
    ) -> tuple[list[int], int]:
        """The longest prefix hit every group accepts (module notes), flat: k blocks a group."""
        first = self.groups[0]
        if not first.cacheable(request) or request.sampling_params.prompt_logprobs is not None:
            return [], 0
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        first.hash_full_blocks(request, max_hit_blocks)
        hashes = request.block_hashes[:max_hit_blocks]
        hits = self._agreed_hit(hashes, frozenset())
        num_new = request.num_tokens - len(hits[0]) * self.block_size
        if token_budget is not None and min(num_new, token_budget) == 1:
            excluded = set().union(*(group.registered_this_step for group in self.groups))
            hits = self._agreed_hit(hashes, excluded)
        return [b for hit in hits for b in hit], len(hits[0]) * self.block_size

    def _agreed_hit(
        self, hashes: list[BlockHash], excluded: set[int] | frozenset[int]
    ) -> list[list[int]]:
        """Per group, the hit of the longest k every group accepts (0 if none)."""
        num_blocks = len(hashes)
        while True:
            hits = [group.longest_hit(hashes[:num_blocks], excluded) for group in self.groups]
            shortest = min(len(hit) for hit in hits)
            if all(len(hit) == shortest for hit in hits):
                return hits
            num_blocks = shortest

    def _split(self, computed_blocks: list[int] | None) -> list[list[int]]:
        """A flat prefix hit, per group."""
        if not computed_blocks:
            return [[] for _ in self.groups]
        k = len(computed_blocks) // len(self.groups)
        return [computed_blocks[g * k : (g + 1) * k] for g in range(len(self.groups))]

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        computed_blocks: list[int] | None = None,
        num_reserved_blocks: int = 0,
    ) -> list[int] | None:
        """KVCacheManager.allocate_slots in every group, or in none: the pool must hold what all
        groups take. Returns group 0's new block ids (None: nothing taken)."""
        if computed_blocks and request.request_id in self.groups[0].req_to_blocks:
            raise ValueError("computed_blocks: only a request that holds no blocks takes hits")
        hits = self._split(computed_blocks)
        for group in self.groups:
            group.free_out_of_window(request, num_new_tokens)
        num_needed = num_reserved_blocks + self.num_blocks_to_take(
            request, num_new_tokens, computed_blocks or []
        )
        if num_needed + self.num_free_hits(computed_blocks or []) > self.pool.num_free_blocks:
            return None
        # Every group's hits leave the free queue before any group takes new blocks (a free hit
        # of one group must not become another's new block); each group holds its hits itself,
        # so this extra hold is dropped after.
        all_hits = computed_blocks or []
        self.pool.touch(all_hits)
        new_blocks = [
            group.allocate_slots(request, num_new_tokens, hit)
            for group, hit in zip(self.groups, hits, strict=True)
        ]
        self.pool.free(all_hits)
        assert all(blocks is not None for blocks in new_blocks), "the pool check was short"
        return new_blocks[0]

    def num_blocks_to_take(
        self, request: Request, num_new_tokens: int, computed_blocks: list[int]
    ) -> int:
        hits = self._split(computed_blocks)
        return sum(
            group.num_blocks_to_take(request, num_new_tokens, hit)
            for group, hit in zip(self.groups, hits, strict=True)
        )

    def num_held_after_admission(self, computed_blocks: list[int], num_total_tokens: int) -> int:
        num_blocks = cdiv(num_total_tokens, self.block_size) * len(self.groups)
        return num_blocks - computed_blocks.count(NULL_BLOCK_ID)

    def num_free_hits(self, computed_blocks: list[int]) -> int:
        return self.groups[0].num_free_hits(computed_blocks)  # block ids are pool-wide

    def trim(self, request: Request, num_tokens: int) -> None:
        for group in self.groups:
            group.trim(request, num_tokens)

    def free(self, request: Request) -> None:
        for group, num_sent in zip(self.groups, self._num_sent, strict=True):
            group.free(request)
            num_sent.pop(request.request_id, None)

    def begin_step(self) -> None:
        for group in self.groups:
            group.begin_step()

    def reset_prefix_cache(self) -> bool:
        if not self.pool.reset_prefix_cache():
            return False
        for group in self.groups:
            group.begin_step()  # forgets the blocks registered this step
        return True
