"""A fixed pool of KV-cache blocks: ref counts, an LRU free queue and the prefix cache.

Block 0 is the null block: it is never handed out, so the worker may pad block tables with it,
and it is never counted (touch and free skip it: a sliding-window request's block list holds it
where a block is no longer needed).
Invariants (blocks 1..num_blocks-1):
- a block is in the free queue iff its ref count is 0; the queue is ordered least recently
  freed first, and allocation takes from the front;
- `block_hashes[b] == h` iff `cached[h] == b`: a hashed block stays findable while it is in use
  and after it is freed (evictable), until allocation reuses it and drops the hash.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from pagedlm.core.block_hash import BlockHash

NULL_BLOCK_ID = 0


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(
                f"num_blocks must be at least 2 (block 0 is reserved), got {num_blocks}"
            )
        self.num_blocks = num_blocks
        self.ref_cnts = [0] * num_blocks
        self.block_hashes: list[BlockHash | None] = [None] * num_blocks
        # OrderedDict as a doubly linked list: O(1) pop from the front and removal from the middle.
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        self.cached: dict[BlockHash, int] = {}  # block hash -> block id

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks nobody holds, cached (evictable) ones included."""
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_usable_blocks

    def allocate(self, num_blocks: int) -> list[int]:
        """Takes blocks from the front of the free queue (ref count 1), evicting their hashes."""
        if num_blocks > self.num_free_blocks:
            raise ValueError(
                f"num_blocks: asked for {num_blocks}, only {self.num_free_blocks} free"
            )
        block_ids = []
        for _ in range(num_blocks):
            block_id, _ = self.free_queue.popitem(last=False)
            self._evict(block_id)
            self.ref_cnts[block_id] = 1
            block_ids.append(block_id)
        return block_ids

    def touch(self, block_ids: Iterable[int]) -> None:
        """One more holder per block; a cached free block leaves the free queue."""
        for block_id in block_ids:
            if block_id == NULL_BLOCK_ID:
                continue
            if self.ref_cnts[block_id] == 0:
                del self.free_queue[block_id]
            self.ref_cnts[block_id] += 1

    def free(self, block_ids: Iterable[int]) -> None:
        """One holder less per block; a block nobody holds goes to the back of the free queue,
        in the order given (pass the tail of a sequence first to have it evicted first)."""
        for block_id in block_ids:
            if block_id == NULL_BLOCK_ID:
                continue
            if self.ref_cnts[block_id] <= 0:
                raise ValueError(
                    f"block_ids: block {block_id} is freed more often than it was taken"
                )
            self.ref_cnts[block_id] -= 1
            if self.ref_cnts[block_id] == 0:
                self.free_queue[block_id] = None

    def lookup(self, block_hash: BlockHash) -> int | None:
        return self.cached.get(block_hash)

    def cache_block(self, block_id: int, block_hash: BlockHash) -> None:
        """Registers a full block. A hash already cached keeps its first block (this one stays
        unregistered and is recycled as a plain block)."""
        if block_hash in self.cached or self.block_hashes[block_id] is not None:
            return
        self.block_hashes[block_id] = block_hash
        self.cached[block_hash] = block_id

    def reset_prefix_cache(self) -> bool:
        """Forgets every cached hash, only when no block is held (vLLM's rule: a running request's
        blocks stay registered); False, and nothing changed, otherwise."""
        if self.num_free_blocks != self.num_usable_blocks:
            return False
        self.cached.clear()
        self.block_hashes = [None] * self.num_blocks
        return True

    def _evict(self, block_id: int) -> None:
        block_hash = self.block_hashes[block_id]
        if block_hash is not None:
            self.block_hashes[block_id] = None
            del self.cached[block_hash]
