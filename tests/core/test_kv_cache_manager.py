from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedlm.core.block_pool import NULL_BLOCK_ID
from pagedlm.core.kv_cache_manager import KVCacheManager, cdiv
from pagedlm.request import Request

from .fakes import make_request

BLOCK_SIZE = 4
PREFIXES = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 9, 9], [5, 5, 5, 5, 5, 5, 5, 5]]


def _slot(block_ids: list[int], pos: int) -> int:
    return block_ids[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE


class KVCacheMachine(RuleBasedStateMachine):
    """Random adds (with prefix hits), chunked computes, placeholder samples, appends, frees and
    re-adds (preemption). A shadow KV cache (slot -> token id, None while the token is a
    placeholder) checks that every prefix hit holds exactly the request's tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.kv: KVCacheManager
        self.reqs: dict[str, Request] = {}
        self.shadow: dict[int, int | None] = {}
        self.num_added = 0

    @initialize(num_blocks=st.integers(3, 12), caching=st.booleans())
    def init(self, num_blocks: int, caching: bool) -> None:
        self.kv = KVCacheManager(num_blocks, BLOCK_SIZE, caching)

    @rule(
        prefix=st.sampled_from(PREFIXES),
        suffix=st.lists(st.integers(0, 9), max_size=5),
        data=st.data(),
    )
    def add(self, prefix: list[int], suffix: list[int], data: st.DataObject) -> None:
        self.num_added += 1
        self._admit(make_request(f"r{self.num_added}", prefix + suffix), data)

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def preempt_and_readd(self, data: st.DataObject) -> None:
        request = self.reqs.pop(data.draw(st.sampled_from(sorted(self.reqs))))
        self.kv.free(request)
        request.num_computed_tokens = 0
        self._admit(request, data)

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def compute(self, data: st.DataObject) -> None:
        """Schedules a chunk; one position past the known tokens is a placeholder (async)."""
        request = self.reqs[data.draw(st.sampled_from(sorted(self.reqs)))]
        limit = request.num_tokens + 1 - request.num_computed_tokens
        if limit <= 0:
            return
        num_new = data.draw(st.integers(1, limit))
        before = self._snapshot()
        if self.kv.allocate_slots(request, num_new) is None:
            assert self._snapshot() == before
            return
        self._write(request, request.num_computed_tokens, request.num_computed_tokens + num_new)
        request.num_computed_tokens += num_new

    @precondition(
        lambda self: any(r.num_computed_tokens >= r.num_tokens for r in self.reqs.values())
    )
    @rule(data=st.data(), token=st.integers(0, 9))
    def append_sampled_token(self, data: st.DataObject, token: int) -> None:
        ready = sorted(i for i, r in self.reqs.items() if r.num_computed_tokens >= r.num_tokens)
        request = self.reqs[data.draw(st.sampled_from(ready))]
        pos = request.num_tokens
        request.append_output_token(token)
        if request.num_computed_tokens > pos:  # the GPU fed the real token into the placeholder
            self.shadow[_slot(self.kv.get_block_ids(request.request_id), pos)] = token

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        self.kv.free(self.reqs.pop(data.draw(st.sampled_from(sorted(self.reqs)))))

    def _admit(self, request: Request, data: st.DataObject) -> None:
        hits, num_hit = self.kv.get_computed_blocks(request)
        assert num_hit == len(hits) * BLOCK_SIZE <= request.num_tokens - 1
        tokens = request.all_token_ids
        assert [self.shadow[_slot(hits, pos)] for pos in range(num_hit)] == tokens[:num_hit]
        num_new = data.draw(st.integers(1, request.num_tokens - num_hit))
        before = self._snapshot()
        if self.kv.allocate_slots(request, num_new, hits) is None:
            assert self._snapshot() == before
            return
        self._write(request, num_hit, num_hit + num_new)
        request.num_computed_tokens = num_hit + num_new
        self.reqs[request.request_id] = request

    def _write(self, request: Request, start: int, end: int) -> None:
        tokens = request.all_token_ids
        block_ids = self.kv.get_block_ids(request.request_id)
        for pos in range(start, end):
            self.shadow[_slot(block_ids, pos)] = tokens[pos] if pos < len(tokens) else None

    def _snapshot(self) -> tuple:
        pool = self.kv.pool
        return (
            list(pool.ref_cnts),
            list(pool.free_queue),
            dict(pool.cached),
            list(pool.block_hashes),
            {k: list(v) for k, v in self.kv.req_to_blocks.items()},
            self.kv.prefix_cache_queries,
            self.kv.prefix_cache_hits,
        )

    @invariant()
    def block_accounting(self) -> None:
        pool = self.kv.pool
        assert set(self.kv.req_to_blocks) == set(self.reqs)
        holders: Counter[int] = Counter()
        for req_id, block_ids in self.kv.req_to_blocks.items():
            assert NULL_BLOCK_ID not in block_ids and len(set(block_ids)) == len(block_ids)
            assert len(block_ids) == cdiv(self.reqs[req_id].num_computed_tokens, BLOCK_SIZE)
            holders.update(block_ids)
        assert pool.ref_cnts[NULL_BLOCK_ID] == 0 and NULL_BLOCK_ID not in pool.free_queue
        for block_id in range(1, pool.num_blocks):
            assert pool.ref_cnts[block_id] == holders[block_id] >= 0
            assert (block_id in pool.free_queue) == (holders[block_id] == 0)
        assert pool.usage == pytest.approx(1 - pool.num_free_blocks / pool.num_usable_blocks)

    @invariant()
    def hashes_match_contents(self) -> None:
        pool = self.kv.pool
        assert all(pool.block_hashes[b] == h for h, b in pool.cached.items())
        assert sum(h is not None for h in pool.block_hashes) == len(pool.cached)
        if not self.kv.enable_prefix_caching:
            assert not pool.cached
        for req_id, block_ids in self.kv.req_to_blocks.items():
            chain = self.reqs[req_id].block_hashes
            for i, block_id in enumerate(block_ids):
                block_hash = pool.block_hashes[block_id]
                assert block_hash is None or (i < len(chain) and chain[i] == block_hash)

    def teardown(self) -> None:
        if not hasattr(self, "kv"):
            return
        for request in self.reqs.values():
            self.kv.free(request)
        pool = self.kv.pool
        assert pool.num_free_blocks == pool.num_usable_blocks and not any(pool.ref_cnts)


TestKVCacheMachine = KVCacheMachine.TestCase
TestKVCacheMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def _computed(kv: KVCacheManager, request: Request, num_new: int | None = None) -> list[int]:
    hits, num_hit = kv.get_computed_blocks(request)
    num_new = request.num_tokens - num_hit if num_new is None else num_new
    assert kv.allocate_slots(request, num_new, hits) is not None
    request.num_computed_tokens = num_hit + num_new
    return hits


def test_repeat_prompt_hits_full_blocks_and_leaves_one_token():
    kv = KVCacheManager(num_blocks=10, block_size=4, enable_prefix_caching=True)
    first = make_request("a", list(range(10)))
    assert _computed(kv, first) == []
    first_blocks = list(kv.get_block_ids("a"))
    kv.free(first)
    assert _computed(kv, make_request("b", list(range(10)))) == first_blocks[:2]
    assert kv.get_block_ids("b")[:2] == first_blocks[:2]
    assert (
        kv.get_computed_blocks(make_request("c", list(range(8))))[1] == 4
    )  # one token left to compute
    assert kv.get_computed_blocks(make_request("d", [0, 1, 2, 3, 9, 9, 9, 9, 9]))[1] == 4
    assert kv.get_computed_blocks(make_request("e", [9, 1, 2, 3, 4, 5, 6, 7, 8]))[1] == 0
    # Lookups count once their allocation succeeds: "a" missed 10 tokens, "b" hit 8 of 10.
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (20, 8)


def test_freed_blocks_are_hit_by_id_and_tail_is_evicted_first():
    kv = KVCacheManager(num_blocks=4, block_size=4, enable_prefix_caching=True)
    first = make_request("a", list(range(12)))
    _computed(kv, first)
    block_ids = list(kv.get_block_ids("a"))
    kv.free(first)
    assert list(kv.pool.free_queue) == block_ids[::-1]
    hits, num_hit = kv.get_computed_blocks(make_request("b", list(range(12))))
    assert hits == block_ids[:2] and num_hit == 8
    other = make_request("c", [7, 7, 7, 7])
    _computed(kv, other)
    assert kv.get_block_ids("c") == [block_ids[2]]  # the tail went first
    assert kv.get_computed_blocks(make_request("d", list(range(12))))[1] == 8


def test_placeholder_tokens_are_not_hashed():
    kv = KVCacheManager(num_blocks=4, block_size=4, enable_prefix_caching=True)
    request = make_request("a", [1, 2, 3])
    _computed(kv, request, num_new=4)  # 3 known tokens + the placeholder of the token in flight
    assert not kv.pool.cached and request.block_hashes == []
    request.append_output_token(4)
    assert kv.allocate_slots(request, 1) is not None
    assert len(kv.pool.cached) == 1 and request.block_hashes
    assert kv.get_computed_blocks(make_request("b", [1, 2, 3, 4, 5]))[1] == 4


def test_short_pool_changes_nothing_and_counts_no_query():
    kv = KVCacheManager(num_blocks=3, block_size=4, enable_prefix_caching=True)
    first = make_request("a", list(range(8)))
    _computed(kv, first)
    kv.free(first)
    holder = make_request("h", [9, 9, 9, 9])
    _computed(kv, holder)  # evicts the tail block of "a"; its first block stays cached and free
    request = make_request("b", list(range(4)) + [5] * 6)
    hits, num_hit = kv.get_computed_blocks(request)
    assert num_hit == 4
    # The hit takes the last free block, nothing is left for the 2 new blocks.
    assert kv.allocate_slots(request, 6, hits) is None
    assert kv.pool.ref_cnts[hits[0]] == 0 and "b" not in kv.req_to_blocks
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (12, 0)


@pytest.mark.parametrize("case", ["disabled", "prompt_embeds"])
def test_no_caching(case: str):
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=case != "disabled")
    embeds = torch.zeros(9, 2) if case == "prompt_embeds" else None
    for req_id in ("a", "b"):
        request = make_request(req_id, list(range(9)))
        request.prompt_embeds = embeds
        assert _computed(kv, request) == []
        kv.free(request)
    assert not kv.pool.cached and kv.prefix_cache_queries == 0
