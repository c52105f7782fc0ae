from __future__ import annotations

import pytest

from pagedlm.core.block_pool import NULL_BLOCK_ID, BlockPool


def test_null_block_is_never_handed_out():
    pool = BlockPool(5)
    assert pool.num_usable_blocks == 4
    assert sorted(pool.allocate(4)) == [1, 2, 3, 4]
    assert pool.num_free_blocks == 0 and pool.usage == 1.0
    with pytest.raises(ValueError, match="num_blocks"):
        pool.allocate(1)
    with pytest.raises(ValueError, match="num_blocks must be at least 2"):
        BlockPool(1)


def test_free_queue_is_lru_and_allocation_evicts_the_hash():
    pool = BlockPool(5)
    a, b, c, d = pool.allocate(4)
    pool.cache_block(b, block_hash=111)
    pool.free([c, b])  # c is freed first, so it is reused first
    assert pool.lookup(111) == b  # a freed hashed block stays findable
    assert pool.allocate(1) == [c]
    assert pool.lookup(111) == b
    assert pool.allocate(1) == [b]
    assert pool.lookup(111) is None and pool.block_hashes[b] is None
    assert NULL_BLOCK_ID not in (a, b, c, d)


def test_touch_takes_a_cached_free_block_out_of_the_queue():
    pool = BlockPool(4)
    x, y, _ = pool.allocate(3)
    pool.cache_block(x, block_hash=7)
    pool.free([x, y])
    assert pool.num_free_blocks == 2
    pool.touch([x])
    assert pool.ref_cnts[x] == 1 and x not in pool.free_queue
    pool.touch([x])
    assert pool.ref_cnts[x] == 2
    assert pool.allocate(1) == [y]
    pool.free([x])
    assert x not in pool.free_queue  # one holder left
    pool.free([x])
    assert list(pool.free_queue) == [x] and pool.lookup(7) == x


def test_double_free_and_duplicate_hash():
    pool = BlockPool(4)
    x, y = pool.allocate(2)
    pool.cache_block(x, block_hash=5)
    pool.cache_block(y, block_hash=5)  # same content computed twice: the first block stays
    assert pool.lookup(5) == x and pool.block_hashes[y] is None
    pool.free([x])
    with pytest.raises(ValueError, match="block_ids: block"):
        pool.free([x])
