"""Scheduler, KV-cache manager and request isolation: past bugs pinned (CPU only).

The first tests pin bugs, each failing before its fix: a reused
request id took the ended request's token still in flight (and could poison the prefix cache), a
priority that cannot be ordered left a request in no queue, zero scheduler limits were replaced by
the defaults, mistyped sampling parameters failed without naming them. The fuzz at the end goes beyond test_scheduler.py's: growth reserve on, blocks of
1-8 tokens, budgets down to 1, stop strings and aborts at any moment, block accounting checked
after every schedule/update/abort, and no decode-only step reading a key written in that step.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter, deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import tiny_hf_models

from pagedlm import LLM, SamplingParams
from pagedlm.config import CacheConfig, EngineArgs, SchedulerConfig
from pagedlm.core.block_pool import NULL_BLOCK_ID
from pagedlm.core.growth import GrowthEstimate
from pagedlm.core.kv_cache_manager import cdiv
from pagedlm.core.sched_output import ModelRunnerOutput, SchedulerOutput
from pagedlm.core.scheduler import Scheduler
from pagedlm.request import Request, RequestStatus

from .fakes import (
    VOCAB,
    FakeRunner,
    Result,
    collect,
    engine_request,
    make_request,
    make_scheduler,
    mixing_next_token,
    reference_output,
    run_engine,
)

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_llama")
    tiny_hf_models.save_tiny_model(folder, "llama")
    return folder


def _tiny_llm(folder: Path, **kwargs: Any) -> LLM:
    return LLM(
        str(folder),
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=64,
        num_gpu_blocks_override=64,
        device="cpu",
        **kwargs,
    )


def _drain(engine: Any, max_steps: int = 500) -> dict[str, Any]:
    finished = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return finished
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    raise AssertionError(f"engine not drained after {max_steps} steps")


# ---- bug: a reused request id takes the ended request's token still in flight ----


@pytest.mark.parametrize("end", ["abort", "stop_string"])
def test_reused_request_id_does_not_take_the_ended_requests_token_in_flight(end: str):
    """Async scheduling: "x" samples in step 1; before step 1's output is back, "x" ends (abort,
    or a stop string seen by the detokenizer) and a new request reuses the id. Step 1's token
    belongs to the old "x": the new one must not receive it."""
    sched = make_scheduler()
    runner = FakeRunner(8)
    sched.add_request(make_request("x", [1, 2, 3], max_tokens=8))
    first = sched.schedule()
    first_out = runner.execute(first)
    assert first.sampling_req_ids == {"x"}
    if end == "abort":
        sched.abort_requests(["x"])
    else:
        sched.finish_requests(["x"], RequestStatus.FINISHED_STOPPED)
    new = make_request("x", [4, 5, 6, 7], max_tokens=3)
    sched.add_request(new)
    second = sched.schedule()  # planned before step 1's tokens are known
    second_out = runner.execute(second)
    stale = sched.update_from_output(first, first_out)
    assert [o.new_token_ids for o in stale if o.req_id == "x"] in ([], [[]]), (
        "the new 'x' received the old request's token from step 1"
    )
    assert new.output_token_ids == [] and new.num_output_placeholders == 1
    results: dict[str, Result] = {}
    collect(results, sched.update_from_output(second, second_out))
    rest = run_engine(sched, runner)
    got = results["x"].token_ids + rest.get("x", Result()).token_ids
    assert got == reference_output(new, sched.max_model_len, mixing_next_token)[0]


def test_reused_request_id_does_not_poison_the_prefix_cache():
    """The stale token also enters the new "x"'s token list on the scheduler but not on the worker,
    so x's first block is cached under tokens its KV does not hold: a later request whose prompt
    starts with what the scheduler says that block holds hits it and reads the wrong KV."""
    sched = make_scheduler()
    runner = FakeRunner(8)
    sched.add_request(make_request("x", [1, 2, 3], max_tokens=8))
    first = sched.schedule()
    first_out = runner.execute(first)
    sched.abort_requests(["x"])
    new = make_request("x", [4, 5, 6, 7, 8, 9, 10], max_tokens=6)
    sched.add_request(new)
    second = sched.schedule()
    second_out = runner.execute(second)
    sched.update_from_output(first, first_out)
    sched.update_from_output(second, second_out)
    run_engine(sched, runner)
    later = make_request("later", new.all_token_ids[:8] + [1], max_tokens=2)
    sched.add_request(later)
    results = run_engine(sched, runner)  # the FakeRunner checks the KV "later" reads
    assert results["later"].num_cached_tokens == 8
    assert (
        results["later"].token_ids
        == reference_output(later, sched.max_model_len, mixing_next_token)[0]
    )


def test_engine_reused_request_id_after_abort_gets_its_own_tokens(tiny_llama_dir: Path):
    """The same through LLMEngine with async scheduling (the GPU default)."""
    llm = _tiny_llm(tiny_llama_dir, async_scheduling=True)
    expected = llm.generate([[8, 9]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    engine = llm.llm_engine
    engine.add_request(
        "x", [5, 6, 7], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    )
    engine.step()
    engine.step()  # a step of the first "x" is in flight now
    engine.abort_request("x")
    engine.add_request("x", [8, 9], GREEDY)
    finished = _drain(engine)
    assert finished["x"].outputs[0].token_ids == expected


# ---- bug: a priority the policy cannot order leaves a ghost request in the scheduler ----


@pytest.mark.parametrize("priority", [None, "1"])
def test_unorderable_priority_fails_the_assert_without_a_ghost_request(priority: Any):
    """LLMEngine refuses it (InvalidRequest); the scheduler asserts it before taking the request."""
    sched = make_scheduler(policy="priority")
    good = make_request("good", [1, 2, 3], max_tokens=4)
    sched.add_request(good)
    with pytest.raises(AssertionError, match="priority"):
        sched.add_request(make_request("bad", [4, 5], max_tokens=4, priority=priority))
    assert set(sched.requests) == {"good"}
    results = run_engine(sched, FakeRunner(8))
    assert (results["good"].token_ids, results["good"].finish_reason) == reference_output(
        good, sched.max_model_len, mixing_next_token
    )
    assert not sched.has_unfinished_requests()


def test_engine_unorderable_priority_fails_alone(tiny_llama_dir: Path):
    llm = _tiny_llm(tiny_llama_dir, scheduling_policy="priority")
    expected = llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    engine = llm.llm_engine
    engine.add_request("good", [5, 6, 7], GREEDY)
    with pytest.raises(ValueError, match="priority"):
        engine.add_request("bad", [8, 9], GREEDY, priority=None)
    finished = _drain(engine)
    assert set(finished) == {"good"} and finished["good"].outputs[0].token_ids == expected


# ---- bug: bad values that are swallowed or raise a TypeError that names nothing ----


@pytest.mark.parametrize("field", ["max_num_seqs", "max_num_batched_tokens"])
def test_zero_scheduler_limits_are_refused(tiny_llama_dir: Path, field: str):
    """0 is falsy: `self.max_num_seqs or default` replaces it with the default silently."""
    args = EngineArgs(model=str(tiny_llama_dir), device="cpu", **{field: 0})
    with pytest.raises(ValueError, match=f"{field} must be positive"):
        args.create_engine_config()


@pytest.mark.parametrize("gib", [0.0, -1.0])
def test_non_positive_kv_cache_memory_is_refused(gib: float):
    with pytest.raises(ValueError, match="kv_cache_memory_gib"):
        CacheConfig(kv_cache_memory_gib=gib)


@pytest.mark.parametrize(
    "kwargs, param",
    [
        (dict(stop=5), "stop"),  # TypeError: 'int' object is not iterable
        (dict(stop_token_ids=5), "stop_token_ids"),  # TypeError
        (dict(stop_token_ids=["7"]), "stop_token_ids"),  # TypeError from '>='
        (dict(logit_bias={"x": 1.0}), "logit_bias"),  # ValueError from int() naming nothing
        (dict(n=1.5), "n"),  # accepted; the engine's add_request raises a TypeError
        (dict(max_tokens=2.5), "max_tokens"),  # accepted; the engine generates 3 tokens
        (dict(top_k=2.5), "top_k"),  # accepted and truncated
        (dict(min_tokens=1.5), "min_tokens"),
        (dict(logprobs=1.5), "logprobs"),
        (dict(allowed_token_ids=["3"]), "allowed_token_ids"),
    ],
)
def test_mistyped_sampling_params_get_a_value_error_naming_them(kwargs: dict, param: str):
    with pytest.raises(ValueError, match=rf"^{param} "):
        SamplingParams(**kwargs)


# ---- fuzz: invariants after every step ----


def _check_blocks(sched: Scheduler) -> None:
    """Block accounting: pool ref counts = holders; free queue = blocks nobody holds; a block held
    twice is a hashed full prefix block at the same place in both; running requests hold exactly
    the blocks their computed tokens need, waiting ones none; queues and `requests` agree."""
    kv, config = sched.kv_cache_manager, sched.config
    pool, block_size = kv.pool, kv.block_size
    running = [r.request_id for r in sched.running]
    waiting = [r.request_id for r in sched.waiting]
    assert len(set(running + waiting)) == len(running) + len(waiting)
    assert set(running + waiting) == set(sched.requests)
    assert len(running) <= config.max_num_seqs and set(kv.req_to_blocks) == set(running)
    holders: Counter[int] = Counter()
    for req_id, block_ids in kv.req_to_blocks.items():
        request = sched.requests[req_id]
        assert request.status == RequestStatus.RUNNING
        assert len(block_ids) == cdiv(request.num_computed_tokens, block_size)  # a slot per token
        assert NULL_BLOCK_ID not in block_ids and len(set(block_ids)) == len(block_ids)
        holders.update(block_ids)
    for block_id in range(1, pool.num_blocks):
        assert pool.ref_cnts[block_id] == holders[block_id]
        assert (block_id in pool.free_queue) == (holders[block_id] == 0)
    for block_id in (b for b, n in holders.items() if n > 1):
        block_hash = pool.block_hashes[block_id]
        assert block_hash is not None
        for req_id, block_ids in kv.req_to_blocks.items():
            if block_id in block_ids:
                i = block_ids.index(block_id)
                request = sched.requests[req_id]
                assert request.block_hashes[i] == block_hash
                assert (i + 1) * block_size <= request.num_computed_tokens
    assert pool.num_free_blocks + len(holders) == pool.num_usable_blocks


class _ReadOrderRunner(FakeRunner):
    """FakeRunner, plus: in a decode-only step (one token per sequence) no sequence reads a key,
    other than its own new one, that this step writes (the split decode reads earlier keys before
    its PDL wait: kv_cache_manager.py module notes)."""

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        starts = {
            req_id: self.rows[req_id].num_computed
            for req_id in so.num_scheduled_tokens
            if req_id in self.rows and req_id not in so.finished_req_ids
        }
        starts.update((new.req_id, new.num_computed_tokens) for new in so.new_reqs)
        out = super().execute(so)
        if so.num_scheduled_tokens and all(n == 1 for n in so.num_scheduled_tokens.values()):
            written = {self._slot(self.rows[r], starts[r]) for r in so.num_scheduled_tokens}
            for req_id in so.num_scheduled_tokens:
                row = self.rows[req_id]
                read = {self._slot(row, pos) for pos in range(starts[req_id])}
                assert not read & written, f"{req_id}: a decode-only step reads a key it writes"
        return out


def _fuzz_scheduler(rng: random.Random) -> tuple[Scheduler, int]:
    """Small pools, tiny blocks and budgets. Blocks of 1-4 tokens need a duck-typed cache config
    (CacheConfig allows 8+): the scheduler reads only block_size and enable_prefix_caching."""
    block_size = rng.choice([1, 2, 4, 8])
    max_model_len = rng.randint(3, 40)
    policy = rng.choice(["fcfs", "priority"])
    sched_config = SchedulerConfig(
        max_num_seqs=rng.choice([1, 2, 3, 8]),
        max_num_batched_tokens=rng.choice([1, 2, 3, 5, 8, 16, 64]),
        policy=policy,
    )
    cache_config = SimpleNamespace(block_size=block_size, enable_prefix_caching=rng.random() < 0.8)
    # EngineCore makes sure the KV cache holds max_model_len - 1 tokens (block 0 is reserved).
    min_blocks = cdiv(max_model_len - 1, block_size) + 1
    sched = Scheduler(
        sched_config, cache_config, rng.randint(min_blocks, max(min_blocks, 16)), max_model_len
    )
    sched.growth = GrowthEstimate(max_model_len, enabled=rng.random() < 0.5)
    return sched, rng.choice([0, 1, 2])


def _fuzz_one(seed: int) -> None:
    rng = random.Random(seed)
    sched, depth = _fuzz_scheduler(rng)
    runner = _ReadOrderRunner(sched.kv_cache_manager.block_size)
    bases = [[rng.randrange(VOCAB) for _ in range(12)] for _ in range(2)]
    added: dict[str, Request] = {}
    ended_early: set[str] = set()  # aborted or stopped from outside (a stop string)
    results: dict[str, Result] = {}
    in_flight: deque[tuple[SchedulerOutput, ModelRunnerOutput]] = deque()
    ids = itertools.count()

    def add() -> None:
        prompt = rng.choice(bases)[: rng.choice([4, 8, rng.randint(0, 12)])]
        prompt += [rng.randrange(3) for _ in range(rng.randint(0, 3))]
        request = engine_request(
            f"r{next(ids)}",
            prompt,
            rng.randint(1, 12),
            sched.max_model_len,
            eos=(3,),
            priority=rng.randint(0, 2),
        )
        if request is not None:
            sched.add_request(request)
            added[request.request_id] = request

    def end_one(abort: bool) -> None:
        req_id = rng.choice(sorted(sched.requests))
        ended_early.add(req_id)
        if abort:
            collect(results, sched.abort_requests([req_id]))
        else:
            sched.finish_requests([req_id], RequestStatus.FINISHED_STOPPED)
        _check_blocks(sched)

    for _ in range(rng.randint(1, 5)):
        add()
    for step in range(3000):
        if step < 40 and rng.random() < 0.2:
            add()
        if sched.has_unfinished_requests():
            so = sched.schedule()
            _check_blocks(sched)
            if so.is_empty:  # no stall: an empty step only waits for tokens in flight
                assert any(r.num_output_placeholders > 0 for r in sched.requests.values())
            in_flight.append((so, runner.execute(so)))
            if sched.requests and rng.random() < 0.08:  # between a step's schedule and its update
                end_one(abort=rng.random() < 0.5)
        while len(in_flight) > depth or (in_flight and not sched.has_unfinished_requests()):
            collect(results, sched.update_from_output(*in_flight.popleft()))
            _check_blocks(sched)
        if step >= 40 and not in_flight and not sched.has_unfinished_requests():
            break
    else:
        raise AssertionError("a request never finished")
    pool = sched.kv_cache_manager.pool
    assert pool.num_free_blocks == pool.num_usable_blocks and not any(pool.ref_cnts)
    for req_id, request in added.items():
        expected = reference_output(request, sched.max_model_len, mixing_next_token)
        got = results.get(req_id, Result())
        if req_id in ended_early:
            assert got.token_ids == expected[0][: len(got.token_ids)]
        else:
            assert (got.token_ids, got.finish_reason) == expected


def test_a_budget_cut_one_token_query_takes_no_hit_on_kv_written_in_its_step():
    """Budget 2: "a" decodes position 15 (one token) and so fills and registers its second block in
    this step; "h" (a's 16 tokens + 2) has 2 tokens left after a full hit but only 1 of budget: it
    would compute one token reading that block in a decode-only step. It must take the first block
    only (test_scheduler.py covers the case without the budget cut)."""
    sched = make_scheduler(block_size=8, max_num_batched_tokens=2)
    runner = _ReadOrderRunner(8)
    prompt = list(range(1, 16))
    sched.add_request(make_request("a", prompt, max_tokens=4))
    while not sched.requests["a"].output_token_ids:
        step = sched.schedule()
        sched.update_from_output(step, runner.execute(step))
    sched.add_request(make_request("h", sched.requests["a"].all_token_ids + [7, 8], max_tokens=2))
    step = sched.schedule()
    assert step.num_scheduled_tokens == {"a": 1, "h": 1}
    assert [new.num_computed_tokens for new in step.new_reqs] == [8]
    sched.update_from_output(step, runner.execute(step))


@pytest.mark.parametrize("first_seed", range(0, 2400, 600))
def test_fuzz_block_accounting_and_read_order(first_seed: int):
    for seed in range(first_seed, first_seed + 600):
        try:
            _fuzz_one(seed)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}: {exc}") from exc


def test_numpy_integers_are_integers() -> None:
    params = SamplingParams(
        n=np.int64(2), max_tokens=np.int32(3), top_k=np.int64(5), logprobs=np.int64(1)
    )
    assert (params.n, params.max_tokens, params.top_k, params.logprobs) == (2, 3, 5, 1)
