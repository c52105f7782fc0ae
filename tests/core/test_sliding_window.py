"""Sliding-window KV freeing in the planner: blocks below the window go back to the pool as it
slides, a request holds at most about W / block_size + 1 blocks, prefix hits follow vLLM's rule,
and schedules with chunked prefill, prefix hits, preemption and async steps give the tokens of a
windowed model run without a scheduler."""

from __future__ import annotations

import random

import pytest

from pagedlm.core.block_pool import NULL_BLOCK_ID
from pagedlm.core.growth import GrowthEstimate
from pagedlm.core.kv_cache_manager import KVCacheManager
from pagedlm.core.sched_output import ModelRunnerOutput, SchedulerOutput
from pagedlm.core.scheduler import Scheduler
from pagedlm.core.sliding_window import (
    cdiv,
    num_held_blocks,
    num_skipped_blocks,
    uniform_window,
)

from .fakes import (
    VOCAB,
    FakeRunner,
    _Row,
    make_request,
    make_scheduler,
    reference_output,
    run_engine,
)

WINDOW = 20
BLOCK_SIZE = 8


def windowed_next_token(context: list[int]) -> int:
    """A windowed model: the next token depends on the last WINDOW tokens and the position."""
    last = context[-WINDOW:]
    return (31 * last[-1] + 7 * sum(last) + len(context)) % VOCAB


class WindowRunner(FakeRunner):
    """FakeRunner for a windowed model: applies num_null_blocks as the worker does, checks every
    query finds the blocks of its window (never a null one) and samples from the last WINDOW
    tokens read back through the block table. A block freed and taken by another request is
    overwritten in the shadow cache, so a read of it would show."""

    def _apply(self, so: SchedulerOutput) -> None:
        for req_id in so.finished_req_ids:
            self.rows.pop(req_id, None)
        for new in so.new_reqs:
            token_ids = new.prompt_token_ids + new.output_token_ids
            self.rows[new.req_id] = _Row(token_ids, list(new.block_ids), new.num_computed_tokens)
        for cached in so.cached_reqs:
            row = self.rows[cached.req_id]
            assert row.num_computed == cached.num_computed_tokens
            num_null = cached.num_null_blocks
            assert num_null >= _leading_nulls(row.block_ids), "null blocks never come back"
            row.block_ids[:num_null] = [NULL_BLOCK_ID] * num_null
            row.block_ids += cached.new_block_ids
        for row in self.rows.values():  # (prefix hits share blocks between rows)
            held = [b for b in row.block_ids if b != NULL_BLOCK_ID]
            assert len(set(held)) == len(held), "a block held twice"
        for req_id in so.num_scheduled_tokens:
            row = self.rows[req_id]
            first_key = max(row.num_computed - WINDOW + 1, 0)  # of the step's first query
            needed = row.block_ids[first_key // self.block_size :]
            assert NULL_BLOCK_ID not in needed, f"{req_id}: a block its window reads is gone"
            assert _leading_nulls(row.block_ids) == row.block_ids.count(NULL_BLOCK_ID)

    def _sample(self, req_id: str) -> int:
        row = self.rows[req_id]
        assert row.num_computed == len(row.token_ids)
        first = max(row.num_computed - WINDOW, 0)
        window = [self.kv[self._slot(row, pos)] for pos in range(first, row.num_computed)]
        assert window == row.token_ids[first:], f"{req_id}: KV cache holds the wrong tokens"
        token = windowed_next_token(row.token_ids)
        row.token_ids.append(token)
        return token


def _leading_nulls(block_ids: list[int]) -> int:
    return next((i for i, b in enumerate(block_ids) if b != NULL_BLOCK_ID), len(block_ids))


def windowed_scheduler(
    num_blocks: int,
    max_num_batched_tokens: int,
    max_model_len: int,
    max_num_seqs: int = 16,
    window: int | None = WINDOW,
    enable_prefix_caching: bool = True,
    policy: str = "fcfs",
) -> Scheduler:
    """Admission by the prompt alone (no growth reserve), so small pools preempt."""
    return make_scheduler(
        num_blocks,
        BLOCK_SIZE,
        max_model_len,
        max_num_seqs,
        max_num_batched_tokens,
        policy,
        enable_prefix_caching,
        group_windows=(window,),
    )


def test_block_counts() -> None:
    # W = 20, B = 8: a query at position 27 sees keys 8..27, so block 0 is skipped
    assert [num_skipped_blocks(p, WINDOW, BLOCK_SIZE) for p in (19, 26, 27, 34, 35)] == [
        0,
        0,
        1,
        1,
        2,
    ]
    assert num_skipped_blocks(1000, None, BLOCK_SIZE) == 0
    held = [num_held_blocks(n, WINDOW, BLOCK_SIZE) for n in range(1, 500)]
    assert max(held) == cdiv(WINDOW - 1, BLOCK_SIZE) + 1
    assert num_held_blocks(500, None, BLOCK_SIZE) == cdiv(500, BLOCK_SIZE)
    assert uniform_window([32, 32]) == 32
    assert uniform_window([None, 32]) is None  # mixed full and sliding layers: no freeing
    assert uniform_window([None, None]) is None


def test_growth_reserve_is_capped_by_the_window() -> None:
    request = make_request("r", list(range(100)), max_tokens=1000)
    full = GrowthEstimate(4096)
    windowed = GrowthEstimate(4096, sliding_window=32)
    assert full.blocks(request, 100, 16) == cdiv(1100, 16) - cdiv(100, 16)
    assert windowed.blocks(request, 100, 16) == 0  # 100 tokens already fill the window
    short = make_request("short", list(range(10)), max_tokens=1000)
    assert windowed.blocks(short, 10, 16) == 2  # 1 block now, 3 once the window is full
    # a prompt prefilled in chunks: the rest of it in one chunk holds the window and the chunk
    long = make_request("long", list(range(1000)), max_tokens=10)
    assert windowed.blocks(long, 512, 16, num_held=32) == cdiv(1000, 16) - (512 - 31) // 16 - 32
    assert windowed.blocks(long, 1000, 16, num_held=33) == 0  # decoding it holds 3


@pytest.mark.parametrize("async_depth", [0, 1])
def test_long_generation_holds_at_most_the_window(async_depth: int) -> None:
    """A request several windows long, prefilled in chunks, then decoding: the blocks below its
    window return to the pool as it goes, and it never holds more than W / B + 2 (decode) or
    the window and the chunk (prefill)."""
    chunk = 16
    sched = windowed_scheduler(num_blocks=64, max_num_batched_tokens=chunk, max_model_len=512)
    request = make_request("long", [random.Random(0).randrange(VOCAB) for _ in range(90)], 300)
    sched.add_request(request)
    kv = sched.kv_cache_manager
    decode_held, table_changes = [], []
    nulls = [0]  # the last num_null_blocks sent

    def check(sched: Scheduler, so: SchedulerOutput) -> None:
        num_new = so.num_scheduled_tokens.get("long")
        if num_new is None:
            return
        held = kv.num_held_blocks("long")
        assert kv.pool.num_free_blocks == kv.pool.num_usable_blocks - held  # freed, not leaked
        if num_new == 1:
            (cached,) = so.cached_reqs or [None]
            if cached is not None and (cached.new_block_ids or cached.num_null_blocks > nulls[0]):
                table_changes.append(len(decode_held))
            nulls[0] = cached.num_null_blocks if cached is not None else nulls[0]
            decode_held.append(held)
            assert held <= WINDOW // BLOCK_SIZE + 2
        else:
            assert held <= cdiv(WINDOW - 1 + num_new, BLOCK_SIZE) + 1

    runner = WindowRunner(BLOCK_SIZE)
    results = run_engine(sched, runner, depth=async_depth, on_step=check)
    assert results["long"].token_ids == reference_output(request, 512, windowed_next_token)[0]
    assert len(decode_held) >= 290 and max(decode_held) >= 3
    # the block table changes once a block of tokens (a new block and a freed one together)
    assert len(table_changes) <= len(decode_held) // BLOCK_SIZE + 2
    assert kv.pool.num_free_blocks == kv.pool.num_usable_blocks


def test_prefix_hit_needs_only_the_window_blocks() -> None:
    """vLLM's rule: a hit of k blocks is usable iff its last cdiv(W - 1, B) blocks are cached;
    the ones below are null. Full attention needs every block from the first."""
    block_size, window = 4, 6  # two blocks before a query's own are in reach
    prompt = list(range(41))  # 10 full blocks
    for sliding_window in (window, None):
        kv = KVCacheManager(12, block_size, True, sliding_window)
        first = make_request("a", prompt)
        kv.allocate_slots(first, len(prompt))
        blocks = list(kv.get_block_ids("a"))
        kv.free(first)  # the tail first into the free queue: evicted first
        hit, num_tokens = kv.get_computed_blocks(make_request("b", prompt))
        assert num_tokens == 40
        if sliding_window is None:
            assert hit == blocks[:10]
        else:
            assert hit == [NULL_BLOCK_ID] * 8 + blocks[8:10]
        kv.pool.free(kv.pool.allocate(2))  # evicts blocks 10 and 9
        hit, num_tokens = kv.get_computed_blocks(make_request("c", prompt))
        assert num_tokens == 36
        want = blocks[:9] if sliding_window is None else [NULL_BLOCK_ID] * 7 + blocks[7:9]
        assert hit == want
        request = make_request("c", prompt)
        assert kv.allocate_slots(request, 5, hit) is not None
        assert kv.num_held_blocks("c") == len(hit) - hit.count(NULL_BLOCK_ID) + 2


def test_hit_with_a_gap_falls_back_below_it() -> None:
    """A block missing inside the window's reach: the hit ends below the gap."""
    block_size, window = 4, 6
    prompt = list(range(41))
    kv = KVCacheManager(12, block_size, True, window)
    first = make_request("a", prompt)
    kv.allocate_slots(first, len(prompt))
    blocks = list(kv.get_block_ids("a"))
    kv.pool._evict(blocks[8])  # as if reused: block 8 is no longer findable
    kv.free(first)
    hit, num_tokens = kv.get_computed_blocks(make_request("b", prompt))
    assert num_tokens == 32 and hit == [NULL_BLOCK_ID] * 6 + blocks[6:8]


SEEDS = [0, 1, 2]


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("async_depth", [0, 1])
def test_schedules_match_the_windowed_model(seed: int, async_depth: int, policy: str) -> None:
    """Random prompts several windows long, many sharing prefixes, a small pool (preemption;
    under the priority policy also for a waiting request that outranks running ones), a small
    token budget (chunked prefill): every request gets the tokens of the model run alone, the
    runner's checks hold every step, and the pool ends empty."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(VOCAB) for _ in range(rng.randint(30, 60))] for _ in range(3)]
    requests = []
    for i in range(12):
        suffix = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 40))]
        prompt = (rng.choice(prefixes) if rng.random() < 0.7 else []) + suffix
        max_tokens, priority = rng.randint(20, 60), rng.randint(0, 3)
        requests.append(make_request(f"r{i}", prompt, max_tokens, priority=priority))
    sched = windowed_scheduler(
        21, max_num_batched_tokens=40, max_model_len=256, max_num_seqs=8, policy=policy
    )
    for request in requests:
        sched.add_request(request)
    results = run_engine(sched, WindowRunner(BLOCK_SIZE), depth=async_depth)
    for request in requests:
        want = reference_output(request, 256, windowed_next_token)[0]
        assert results[request.request_id].token_ids == want
    kv = sched.kv_cache_manager
    assert sched.num_preemptions > 0 and kv.prefix_cache_hits > 0
    assert kv.pool.num_free_blocks == kv.pool.num_usable_blocks


def test_freed_blocks_admit_more_requests() -> None:
    """The point of it: long requests that fill a pool with full attention run side by side."""
    counts = {}
    for window in (None, WINDOW):
        sched = windowed_scheduler(41, 32, 512, window=window, enable_prefix_caching=False)
        for i in range(8):
            sched.add_request(make_request(f"r{i}", list(range(2, 202)), max_tokens=100))
        most = 0
        for _ in range(400):
            if not sched.has_unfinished_requests():
                break
            so = sched.schedule()
            most = max(most, len(so.num_scheduled_tokens))
            ids = sorted(so.sampling_req_ids)
            sched.update_from_output(so, ModelRunnerOutput(ids, [[3] for _ in ids]))
        counts[window] = most
    assert counts[None] <= 2 and counts[WINDOW] == 8  # full attention: the second is preempted
