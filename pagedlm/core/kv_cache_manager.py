"""Per-request block lists on top of the block pool, with prefix caching.

A request's `block_hashes` is a hash chain over its FULL blocks of known tokens:
    hash_i = hash_block(hash_{i-1}, tokens of block i)   (sha256, core/block_hash.py; hash_{-1} = root)
with the request's `cache_salt` as block 0's extra keys, so equal hashes mean equal prefixes of
requests with equal salts. A block is registered in the prefix cache once it is full
of known tokens and its KV is scheduled (KV writes run in step order, so a later step, or a
later sequence in the same step, may read it). Requests with `prompt_embeds` are never cached
or looked up; requests with `prompt_logprobs` are cached but never look up.

One exception to "a later sequence in the same step may read it": the split decode reads a
sequence's earlier keys before its PDL wait (attention/triton_decode.py), i.e. possibly before this
step's KV writes, and it runs in decode-only steps (one query token per sequence). So a request
that will compute one token takes no hit on a block registered in the same step by an allocation
of one token (`get_computed_blocks` with the step's token budget; the scheduler calls `begin_step`
at each step's start): it recomputes from there. A block filled by a longer query is safe to hit:
its step is not decode-only.

Sliding windows (every layer windowed, window W: core/sliding_window.py): before each allocation
that takes new blocks, the blocks no query of the step or a later one reads (wholly below
num_computed_tokens - W + 1) go back to the pool, and their entries in the request's block list
become NULL_BLOCK_ID (the request's first `num_null_blocks` entries; the worker points them to
the null block). An allocation that takes no new block frees only where the request holds more
than a decode's peak, cdiv(W - 1, B) + 1 blocks (the surplus a prefill chunk leaves): a decoding
request's skipped block waits for its next new block, so its block table changes once a block of
tokens, as under full attention (a steady decode reuses the table on the device), and it never
holds more than that peak. The attention kernels never read keys below a query's window, so a
freed block that another request takes is never read for this one. A step in flight may still
read a block this step frees: the block is only written again by a later step, which runs after
it on the device's stream. A prefix hit of k blocks is usable iff the blocks its first query's
window reaches are cached (the last num_window_blocks of them); the ones below are null in it.

One manager is one KV cache group; core/kv_groups.py puts one per group of a model mixing full
and sliding layers on a shared pool (`pool`, `cache_key_suffix`).
"""

from __future__ import annotations

from pagedlm.core.block_hash import BlockHash, cache_salt_keys, hash_block
from pagedlm.core.block_pool import NULL_BLOCK_ID, BlockPool
from pagedlm.core.sched_output import GroupBlockUpdate
from pagedlm.core.sliding_window import cdiv, num_skipped_blocks, num_window_blocks
from pagedlm.request import Request


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool,
        sliding_window: int | None = None,
        pool: BlockPool | None = None,
        cache_key_suffix: bytes = b"",
    ) -> None:
        """sliding_window: the window of every layer (None: some layer attends to all keys);
        pool and cache_key_suffix: a KV cache group's share of a pool (core/kv_groups.py), its
        prefix-cache entries keyed by block hash + suffix."""
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be None or >= 1, got {sliding_window}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.sliding_window = sliding_window
        if sliding_window is not None:  # what a decoding request holds at most (module notes)
            self._max_decode_blocks = num_window_blocks(sliding_window, block_size) + 1
        self.pool = BlockPool(num_blocks) if pool is None else pool
        self._key_suffix = cache_key_suffix
        # per request, one entry per block of its tokens; the first num_null_blocks are NULL_BLOCK_ID
        self.req_to_blocks: dict[str, list[int]] = {}
        self.num_null_blocks: dict[str, int] = {}
        self.num_cached_blocks: dict[str, int] = {}  # leading blocks of a request registered so far
        self.prefix_cache_queries = 0  # tokens looked up, counted when the lookup is allocated
        self.prefix_cache_hits = 0  # tokens found
        self.registered_this_step: set[int] = set()  # block ids

    @property
    def usage(self) -> float:
        return self.pool.usage

    @property
    def capacity_tokens(self) -> int:
        return self.pool.num_usable_blocks * self.block_size

    def get_block_ids(self, req_id: str) -> list[int]:
        """The request's block list, NULL_BLOCK_ID where the window no longer needs a block."""
        return self.req_to_blocks.get(req_id, [])

    def get_num_null_blocks(self, req_id: str) -> int:
        return self.num_null_blocks.get(req_id, 0)

    def num_held_blocks(self, req_id: str) -> int:
        """Blocks of the pool the request holds."""
        return len(self.get_block_ids(req_id)) - self.get_num_null_blocks(req_id)

    # One KV cache group: what the scheduler asks of every manager (core/kv_groups.py has more)
    @property
    def group_windows(self) -> tuple[int | None, ...]:
        return (self.sliding_window,)

    def all_block_ids(self, req_id: str) -> list[int]:
        """The request's block ids in every group."""
        return self.get_block_ids(req_id)

    def other_group_block_ids(self, req_id: str) -> tuple[list[int], ...]:
        return ()

    def group_updates(self, req_id: str) -> tuple[GroupBlockUpdate, ...]:
        return ()

    def get_computed_blocks(
        self, request: Request, token_budget: int | None = None
    ) -> tuple[list[int], int]:
        """Longest cached prefix of full blocks, leaving at least one token to compute; with the step's
        token_budget, none from a block this step writes if the request would then compute one token
        (module notes). Returns (block ids, number of tokens they hold). Nothing is taken yet."""
        if not self.cacheable(request) or request.sampling_params.prompt_logprobs is not None:
            return [], 0  # prompt logprobs need every prompt position computed
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        self.hash_full_blocks(request, max_hit_blocks)
        hashes = request.block_hashes[:max_hit_blocks]
        hit_blocks = self.longest_hit(hashes, frozenset())
        num_new = request.num_tokens - len(hit_blocks) * self.block_size
        if token_budget is not None and min(num_new, token_budget) == 1:
            hit_blocks = self.longest_hit(hashes, self.registered_this_step)
        return hit_blocks, len(hit_blocks) * self.block_size

    def reset_prefix_cache(self) -> bool:
        """See BlockPool.reset_prefix_cache."""
        if not self.pool.reset_prefix_cache():
            return False
        self.registered_this_step.clear()
        return True

    def begin_step(self) -> None:
        """A new step's scheduling starts: blocks registered so far have their KV written by now."""
        self.registered_this_step.clear()

    def longest_hit(
        self, hashes: list[BlockHash], excluded: set[int] | frozenset[int]
    ) -> list[int]:
        """The block ids of the longest usable prefix of `hashes` whose blocks are cached and not
        in `excluded` (NULL_BLOCK_ID below a window's reach: module notes)."""

        def cached(block_hash: BlockHash) -> int | None:
            block_id = self.pool.lookup(block_hash + self._key_suffix)
            return None if block_id in excluded else block_id

        if self.sliding_window is None:
            hit_blocks = []
            for block_hash in hashes:
                block_id = cached(block_hash)
                if block_id is None:
                    break
                hit_blocks.append(block_id)
            return hit_blocks
        num_needed = max(num_window_blocks(self.sliding_window, self.block_size), 1)
        run: list[int] = []  # cached blocks i, i + 1, ... in reverse order, found going down
        for i in reversed(range(len(hashes))):
            block_id = cached(hashes[i])
            if block_id is None:
                run = []
                continue
            run.append(block_id)
            if len(run) == num_needed or i == 0:
                return [NULL_BLOCK_ID] * i + run[::-1]
        return []

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        computed_blocks: list[int] | None = None,
        num_reserved_blocks: int = 0,
    ) -> list[int] | None:
        """Makes room for `num_computed_tokens` (+ the prefix hit in `computed_blocks`, for a request
        holding no blocks yet) + `num_new_tokens` tokens. Returns the newly taken block ids (hits
        excluded), or None, changing nothing, when the pool is short or would be left with fewer
        than `num_reserved_blocks` free blocks."""
        req_id = request.request_id
        held = self.req_to_blocks.get(req_id)
        self.free_out_of_window(request, num_new_tokens)
        if held is not None and not computed_blocks:  # the common decode step: often no new block
            num_total_tokens = request.num_computed_tokens + num_new_tokens
            if num_total_tokens <= len(held) * self.block_size:
                self._cache_full_blocks(request, num_total_tokens, num_new_tokens == 1)
                return []
        computed_blocks = computed_blocks or []
        is_first = held is None
        if computed_blocks and not is_first:
            raise ValueError(
                "computed_blocks: only a request that holds no blocks takes prefix hits"
            )
        num_total_tokens = self._num_total_tokens(request, num_new_tokens, computed_blocks)
        num_new_blocks = self.num_blocks_to_take(request, num_new_tokens, computed_blocks)
        # Hits on free (evictable) blocks take them out of the free queue too.
        num_free_hits = self.num_free_hits(computed_blocks)
        if num_new_blocks + num_free_hits + num_reserved_blocks > self.pool.num_free_blocks:
            return None
        self.pool.touch(computed_blocks)
        new_blocks = self.pool.allocate(num_new_blocks)
        if is_first:
            self._count_lookup(request, len(computed_blocks))
            self.num_cached_blocks[req_id] = len(computed_blocks)
            self.num_null_blocks[req_id] = computed_blocks.count(NULL_BLOCK_ID)
        self.req_to_blocks.setdefault(req_id, []).extend(computed_blocks + new_blocks)
        self._cache_full_blocks(request, num_total_tokens, num_new_tokens == 1)
        return new_blocks

    def num_held_after_admission(self, computed_blocks: list[int], num_total_tokens: int) -> int:
        """The blocks a request holding none holds once allocate_slots gave it num_total_tokens
        after the prefix hit computed_blocks."""
        return cdiv(num_total_tokens, self.block_size) - computed_blocks.count(NULL_BLOCK_ID)

    def num_free_hits(self, computed_blocks: list[int]) -> int:
        """Blocks of a prefix hit that nobody holds (taking them shrinks the free queue)."""
        ref_cnts = self.pool.ref_cnts
        return sum(
            1
            for block_id in computed_blocks
            if block_id != NULL_BLOCK_ID and ref_cnts[block_id] == 0
        )

    def free_out_of_window(self, request: Request, num_new_tokens: int) -> None:
        """What allocate_slots frees before taking blocks for num_new_tokens more (module notes):
        below the window when new blocks are needed or the request holds a decode's peak."""
        req_id = request.request_id
        held = self.req_to_blocks.get(req_id)
        if held is None or self.sliding_window is None:
            return
        num_total_tokens = request.num_computed_tokens + num_new_tokens
        takes_blocks = num_total_tokens > len(held) * self.block_size
        if takes_blocks or self.num_held_blocks(req_id) > self._max_decode_blocks:
            self._free_skipped_blocks(req_id, request.num_computed_tokens)

    def _free_skipped_blocks(self, req_id: str, first_query_pos: int) -> None:
        """Frees the blocks below the window of a step whose queries start at first_query_pos."""
        num_skipped = num_skipped_blocks(first_query_pos, self.sliding_window, self.block_size)
        start = self.num_null_blocks[req_id]
        if num_skipped <= start:
            return
        block_ids = self.req_to_blocks[req_id]
        skipped = block_ids[start:num_skipped]
        block_ids[start:num_skipped] = [NULL_BLOCK_ID] * len(skipped)
        self.num_null_blocks[req_id] = num_skipped
        self.pool.free(skipped)

    def num_blocks_to_take(
        self, request: Request, num_new_tokens: int, computed_blocks: list[int]
    ) -> int:
        """The new blocks (prefix hits excluded) allocate_slots takes to hold `num_computed_tokens`, the
        hit in `computed_blocks` and `num_new_tokens` more tokens."""
        num_held = len(self.req_to_blocks.get(request.request_id, ()))
        num_total_tokens = self._num_total_tokens(request, num_new_tokens, computed_blocks)
        return max(cdiv(num_total_tokens, self.block_size) - num_held - len(computed_blocks), 0)

    def _num_total_tokens(
        self, request: Request, num_new_tokens: int, computed_blocks: list[int]
    ) -> int:
        """The request's tokens once num_new_tokens more are scheduled after its prefix hit."""
        return request.num_computed_tokens + len(computed_blocks) * self.block_size + num_new_tokens

    def trim(self, request: Request, num_tokens: int) -> None:
        """Frees the request's blocks past those holding its first num_tokens tokens (the tail a
        speculative step's rejected drafts took; never registered: they hold no known token)."""
        block_ids = self.req_to_blocks.get(request.request_id)
        if not block_ids:
            return
        keep = max(cdiv(num_tokens, self.block_size), self.num_null_blocks[request.request_id])
        tail = block_ids[keep:]
        if tail:
            del block_ids[keep:]
            self.pool.free(reversed(tail))

    def free(self, request: Request) -> None:
        """Releases the request's blocks, tail first, so the tail is evicted first."""
        self.num_cached_blocks.pop(request.request_id, None)
        self.num_null_blocks.pop(request.request_id, None)
        block_ids = self.req_to_blocks.pop(request.request_id, None)
        if block_ids:
            self.pool.free(reversed(block_ids))  # the pool skips NULL_BLOCK_ID

    def cacheable(self, request: Request) -> bool:
        return self.enable_prefix_caching and request.prompt_embeds is None

    def _count_lookup(self, request: Request, num_hit_blocks: int) -> None:
        if self.cacheable(request):
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += num_hit_blocks * self.block_size

    def _cache_full_blocks(self, request: Request, num_total_tokens: int, one_token: bool) -> None:
        """Registers blocks that are full of known tokens once this allocation is computed; with
        one_token (the allocation computes a single token, so its step may be decode-only), also
        as registered in this step."""
        if not self.cacheable(request):
            return
        req_id = request.request_id
        num_full = min(num_total_tokens, request.num_tokens) // self.block_size
        start = self.num_cached_blocks[req_id]
        if num_full <= start:
            return
        self.hash_full_blocks(request, num_full)
        block_ids = self.req_to_blocks[req_id]
        for i in range(start, num_full):
            # a block freed out of the window before its tokens were known stays unregistered
            if block_ids[i] == NULL_BLOCK_ID:
                continue
            self.pool.cache_block(block_ids[i], request.block_hashes[i] + self._key_suffix)
            if one_token:
                self.registered_this_step.add(block_ids[i])
        self.num_cached_blocks[req_id] = num_full

    def hash_full_blocks(self, request: Request, num_blocks: int) -> None:
        """Extends the request's hash chain to its first `num_blocks` blocks (all of known tokens)."""
        hashes = request.block_hashes
        if len(hashes) >= num_blocks:
            return
        token_ids = request.all_token_ids
        parent = hashes[-1] if hashes else None
        for i in range(len(hashes), num_blocks):
            extra_keys = cache_salt_keys(request.cache_salt) if i == 0 else b""
            parent = hash_block(
                parent, token_ids[i * self.block_size : (i + 1) * self.block_size], extra_keys
            )
            hashes.append(parent)
