"""KV cache groups (core/kv_groups.py) for models mixing full and sliding layers: the layer split,
per-group block lists on one pool (the sliding group frees below its window, the full group keeps
every block), all-or-nothing allocation, vLLM's prefix-hit rule per group, and schedules with
chunked prefill, prefix hits, preemption and async steps that give the tokens of a mixed model
run without a scheduler, reading each group's KV through that group's block table."""

from __future__ import annotations

import random

import pytest

from pagedlm.core.block_pool import NULL_BLOCK_ID
from pagedlm.core.kv_cache_manager import KVCacheManager
from pagedlm.core.kv_groups import HybridKVCacheManager, kv_cache_groups, make_kv_cache_manager
from pagedlm.core.sched_output import ModelRunnerOutput, SchedulerOutput
from pagedlm.core.scheduler import Scheduler
from pagedlm.core.sliding_window import cdiv

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
GROUPS = (None, WINDOW)  # a full group, then a sliding one


def mixed_next_token(context: list[int]) -> int:
    """A mixed model: full layers see the whole context, sliding ones the last WINDOW tokens."""
    last = context[-WINDOW:]
    return (31 * last[-1] + 7 * sum(last) + 3 * sum(context) + len(context)) % VOCAB


class MixedRunner(FakeRunner):
    """Keeps one block table per group from the diffs, as the worker must; every group's blocks
    get the step's tokens (a layer of each group writes its KV), the full part of a sample reads
    group 0's table, the windowed part group 1's. A block freed out of group 1's window and taken
    by another request is overwritten in the shadow cache, so a wrong read shows."""

    def __init__(self, block_size: int) -> None:
        super().__init__(block_size, mixed_next_token)
        self.tables: dict[str, list[list[int]]] = {}  # req id -> per group block ids

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        self._apply(so)
        for req_id, num_tokens in so.num_scheduled_tokens.items():
            row, tables = self.rows[req_id], self.tables[req_id]
            first_key = max(row.num_computed - WINDOW + 1, 0)
            assert NULL_BLOCK_ID not in tables[0], f"{req_id}: the full group lost a block"
            assert NULL_BLOCK_ID not in tables[1][first_key // self.block_size :]
            for pos in range(row.num_computed, row.num_computed + num_tokens):
                for table in tables:
                    self.kv[self._slot_in(table, pos)] = row.token_ids[pos]
            row.num_computed += num_tokens
        req_ids = [r for r in so.num_scheduled_tokens if r in so.sampling_req_ids]
        return ModelRunnerOutput(req_ids, [[self._sample(r)] for r in req_ids])

    def _apply(self, so: SchedulerOutput) -> None:
        for req_id in so.finished_req_ids:
            self.rows.pop(req_id, None)
            self.tables.pop(req_id, None)
        for new in so.new_reqs:
            token_ids = new.prompt_token_ids + new.output_token_ids
            self.rows[new.req_id] = _Row(token_ids, [], new.num_computed_tokens)
            self.tables[new.req_id] = [list(new.block_ids), *map(list, new.group_block_ids)]
        for cached in so.cached_reqs:
            tables = self.tables[cached.req_id]
            assert self.rows[cached.req_id].num_computed == cached.num_computed_tokens
            assert cached.num_null_blocks == 0  # group 0 is the full one
            tables[0] += cached.new_block_ids
            (update,) = cached.groups
            table = tables[1]
            del table[update.num_blocks - len(update.new_block_ids) :]
            table += update.new_block_ids
            table[: update.num_null_blocks] = [NULL_BLOCK_ID] * update.num_null_blocks
            assert len(table) == update.num_blocks
        held = [b for tables in self.tables.values() for t in tables for b in t if b]
        shared = sum(len(set(t[0]) & set(t[1])) for t in self.tables.values())
        assert shared == 0, "a block in two groups of one request"
        assert len(held) >= len(set(held))  # (prefix hits share blocks between requests)

    def _sample(self, req_id: str) -> int:
        row, (full, sliding) = self.rows[req_id], self.tables[req_id]
        assert row.num_computed == len(row.token_ids)
        context = [self.kv[self._slot_in(full, pos)] for pos in range(row.num_computed)]
        first = max(row.num_computed - WINDOW, 0)
        window = [self.kv[self._slot_in(sliding, pos)] for pos in range(first, row.num_computed)]
        assert context == row.token_ids and window == row.token_ids[first:], f"{req_id}: bad KV"
        token = mixed_next_token(row.token_ids)
        row.token_ids.append(token)
        return token

    def _slot_in(self, table: list[int], pos: int) -> int:
        return table[pos // self.block_size] * self.block_size + pos % self.block_size


def mixed_scheduler(
    num_blocks: int,
    max_num_batched_tokens: int,
    max_model_len: int,
    max_num_seqs: int = 16,
    group_windows: tuple[int | None, ...] = GROUPS,
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
        group_windows=group_windows,
    )


def test_layers_split_into_groups_of_equal_size() -> None:
    w = 4096
    assert kv_cache_groups([w] * 4) == [(w, [0, 1, 2, 3])]
    assert kv_cache_groups([None, w, w, None, w, w]) == [(None, [0, 3]), (w, [1, 2]), (w, [4, 5])]
    assert kv_cache_groups([w, w, w, None]) == [(None, [3]), (w, [0]), (w, [1]), (w, [2])]
    assert kv_cache_groups([None, None, w, w, w]) == [(None, [0, 1]), (w, [2, 3]), (w, [4])]
    assert isinstance(make_kv_cache_manager(8, 4, True, (w,)), KVCacheManager)
    assert isinstance(make_kv_cache_manager(8, 4, True, (None, w)), HybridKVCacheManager)


def test_sliding_group_frees_and_full_group_keeps() -> None:
    """A request prefilled in chunks, then decoding: the full group holds a block per B tokens,
    the sliding one at most its window's; the pool counts both."""
    kv = HybridKVCacheManager(64, BLOCK_SIZE, False, GROUPS)
    full, sliding = kv.groups
    request = make_request("a", list(range(2, 92)), 100)
    for chunk in (32, 32, 26):
        assert kv.allocate_slots(request, chunk) is not None
        request.num_computed_tokens += chunk
    for token in range(60):
        request.append_output_token(token % VOCAB)
        assert kv.allocate_slots(request, 1) is not None
        request.num_computed_tokens += 1
        num_tokens = request.num_computed_tokens
        assert full.num_held_blocks("a") == cdiv(num_tokens, BLOCK_SIZE)
        assert sliding.num_held_blocks("a") <= cdiv(WINDOW - 1, BLOCK_SIZE) + 1
        assert kv.num_held_blocks("a") == kv.pool.num_usable_blocks - kv.pool.num_free_blocks
    assert sliding.get_num_null_blocks("a") > 0 and kv.get_num_null_blocks("a") == 0
    kv.free(request)
    assert kv.pool.num_free_blocks == kv.pool.num_usable_blocks


def test_allocation_takes_every_group_or_none() -> None:
    """5 free blocks: a 24-token prompt (3 blocks a group) does not fit, and nothing is taken;
    a 16-token one takes 2 + 2."""
    kv = HybridKVCacheManager(6, BLOCK_SIZE, False, GROUPS)
    assert kv.allocate_slots(make_request("a", list(range(24))), 24) is None
    assert kv.pool.num_free_blocks == 5 and not kv.all_block_ids("a")
    new = kv.allocate_slots(make_request("b", list(range(16))), 16)
    assert new == kv.get_block_ids("b") and len(new) == 2
    assert len(kv.all_block_ids("b")) == 4 and kv.pool.num_free_blocks == 1
    assert kv.allocate_slots(make_request("c", list(range(4))), 4, num_reserved_blocks=0) is None


def test_prefix_hit_every_group_accepts() -> None:
    """Full group: every block from the first; sliding group: the last cdiv(W - 1, B) of the hit
    (vLLM's rule). Evicting the sliding group's blocks at the end of the prefix shortens the hit
    of both groups to where the sliding group has its window again."""
    block_size, window = 4, 6  # two blocks before a query's own are in reach
    prompt = list(range(41))  # 10 full blocks
    kv = HybridKVCacheManager(40, block_size, True, (None, window))
    first = make_request("a", prompt)
    kv.allocate_slots(first, len(prompt))
    full_blocks, sliding_blocks = (list(g.get_block_ids("a")) for g in kv.groups)
    hit, num_tokens = kv.get_computed_blocks(make_request("b", prompt))
    assert num_tokens == 40
    assert hit == full_blocks[:10] + [NULL_BLOCK_ID] * 8 + sliding_blocks[8:10]
    kv.groups[1]._free_skipped_blocks("a", 40)  # as a later step does
    kv.pool._evict(sliding_blocks[9])  # as if reused
    hit, num_tokens = kv.get_computed_blocks(make_request("c", prompt))
    assert num_tokens == 36
    assert hit == full_blocks[:9] + [NULL_BLOCK_ID] * 7 + sliding_blocks[7:9]
    request = make_request("c", prompt)
    free_before = kv.pool.num_free_blocks
    assert kv.allocate_slots(request, 5, hit) is not None
    assert kv.num_held_blocks("c") == 9 + 2 + 2 * 2  # the hits and two new blocks a group
    assert free_before - kv.pool.num_free_blocks == 4 + 1  # new blocks, the free hit (block 7)
    kv.pool._evict(full_blocks[3])
    hit, num_tokens = kv.get_computed_blocks(make_request("d", prompt))
    assert num_tokens == 12 and hit == full_blocks[:3] + [NULL_BLOCK_ID] + sliding_blocks[1:3]


def test_updates_carry_each_groups_table() -> None:
    kv = HybridKVCacheManager(64, BLOCK_SIZE, False, GROUPS)
    request = make_request("a", list(range(40)), 60)
    kv.allocate_slots(request, 40)
    request.num_computed_tokens = 40
    (sent,) = kv.other_group_block_ids("a")
    assert sent == kv.groups[1].get_block_ids("a") and len(sent) == 5
    request.append_output_token(1)
    kv.allocate_slots(request, 1)  # a new block; the window frees blocks 0..1
    (update,) = kv.group_updates("a")
    assert update.num_blocks == 6 and update.num_null_blocks == 2
    assert update.new_block_ids == kv.groups[1].get_block_ids("a")[5:]
    (update,) = kv.group_updates("a")
    assert update.new_block_ids == [] and update.num_blocks == 6


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("async_depth", [0, 1])
def test_schedules_match_the_mixed_model(seed: int, async_depth: int, policy: str) -> None:
    """Random prompts several windows long, many sharing prefixes, a small pool (preemption), a
    small token budget (chunked prefill), the growth reserve on for odd seeds: every request gets
    the tokens of the mixed model run alone, the runner's checks hold every step, and the pool
    ends empty."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(VOCAB) for _ in range(rng.randint(30, 60))] for _ in range(3)]
    requests = []
    for i in range(12):
        suffix = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 40))]
        prompt = (rng.choice(prefixes) if rng.random() < 0.7 else []) + suffix
        max_tokens, priority = rng.randint(20, 60), rng.randint(0, 3)
        requests.append(make_request(f"r{i}", prompt, max_tokens, priority=priority))
    sched = mixed_scheduler(
        41, max_num_batched_tokens=40, max_model_len=256, max_num_seqs=8, policy=policy
    )
    sched.growth.enabled = seed % 2 == 1
    for request in requests:
        sched.add_request(request)
    results = run_engine(sched, MixedRunner(BLOCK_SIZE), depth=async_depth)
    for request in requests:
        want = reference_output(request, 256, mixed_next_token)[0]
        assert results[request.request_id].token_ids == want
    kv = sched.kv_cache_manager
    assert (sched.num_preemptions > 0 or sched.growth.enabled) and kv.prefix_cache_hits > 0
    assert kv.pool.num_free_blocks == kv.pool.num_usable_blocks


def test_trim_and_free_reach_every_group() -> None:
    """A speculative step's rejected tail goes back in every group; the update says so."""
    kv = HybridKVCacheManager(64, BLOCK_SIZE, False, GROUPS)
    request = make_request("a", list(range(30)), 60)
    kv.allocate_slots(request, 30)
    kv.other_group_block_ids("a")
    kv.allocate_slots(request, 30 + 12 - request.num_computed_tokens)  # 30 tokens + drafts
    kv.trim(request, 33)
    assert [len(g.get_block_ids("a")) for g in kv.groups] == [5, 5]
    (update,) = kv.group_updates("a")
    assert update.num_blocks == 5 and update.new_block_ids == kv.groups[1].get_block_ids("a")[4:]
    kv.free(request)
    assert kv.pool.num_free_blocks == kv.pool.num_usable_blocks and not kv.all_block_ids("a")


def test_groups_admit_more_long_requests() -> None:
    """The point of it: with one full layer in four, a block of the 4-group cache costs a
    quarter of the layers, so the same memory holds four times the blocks; long requests then
    decode side by side that one group must take one at a time."""
    peaks = {}
    for group_windows, num_blocks in (((None,), 61), ((None, WINDOW, WINDOW, WINDOW), 241)):
        sched = mixed_scheduler(
            num_blocks, 32, 512, group_windows=group_windows, enable_prefix_caching=False
        )
        for i in range(8):
            sched.add_request(make_request(f"r{i}", list(range(2, 302)), max_tokens=100))
        peak = 0
        for _ in range(3000):
            if not sched.has_unfinished_requests():
                break
            so = sched.schedule()
            decoding = [r for r in sched.running if r.num_computed_tokens >= r.num_prompt_tokens]
            peak = max(peak, len(decoding))
            ids = sorted(so.sampling_req_ids)
            sched.update_from_output(so, ModelRunnerOutput(ids, [[3] for _ in ids]))
        assert not sched.has_unfinished_requests()
        peaks[len(group_windows)] = peak
    # 400 tokens: 50 blocks of the full group and 3 (4 at a block's turn) of each sliding one
    assert peaks == {1: 1, 4: 4}, peaks


def test_a_hit_for_a_request_holding_blocks_changes_nothing() -> None:
    kv = HybridKVCacheManager(16, BLOCK_SIZE, True, GROUPS)
    prompt = list(range(17))
    kv.allocate_slots(make_request("a", prompt), 17)
    hit, _ = kv.get_computed_blocks(make_request("b", prompt))
    request = make_request("b", prompt)
    kv.allocate_slots(request, 1)
    ref_cnts = list(kv.pool.ref_cnts)
    with pytest.raises(ValueError, match="computed_blocks"):
        kv.allocate_slots(request, 1, hit)
    assert kv.pool.ref_cnts == ref_cnts
