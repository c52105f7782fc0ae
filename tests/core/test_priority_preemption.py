"""Priority preemption (scheduling_policy="priority"): a waiting request that outranks running ones
takes their blocks, the victim being the running request of largest (priority, arrival_time), as
in vLLM; the rules are in pagedlm/core/scheduler.py's module notes. FCFS is unchanged: its tests
are test_scheduler.py's. CPU only: the scheduler with the fake runner, then the engine on a tiny
model."""

from __future__ import annotations

import itertools
import random
from collections import Counter, deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import tiny_hf_models

from pagedlm import LLM, SamplingParams
from pagedlm.config import SchedulerConfig
from pagedlm.core.growth import GrowthEstimate
from pagedlm.core.kv_cache_manager import cdiv
from pagedlm.core.sched_output import ModelRunnerOutput, SchedulerOutput
from pagedlm.core.scheduler import Scheduler
from pagedlm.request import Request

from .fakes import (
    VOCAB,
    FakeRunner,
    Result,
    collect,
    make_request,
    make_scheduler,
    mixing_next_token,
    reference_output,
    run_engine,
)
from .test_scheduler import _check_step
from .test_scheduler_robustness import _check_blocks, _ReadOrderRunner


def _run(
    sched: Scheduler, depth: int, arrivals: dict[int, Request] | None = None
) -> tuple[list[SchedulerOutput], dict[str, Result]]:
    """Runs to the end with the fake runner, checking every step; arrivals[n] is added right after
    the n-th schedule() (counting from 0), before the step runs."""
    arrivals = dict(arrivals or {})
    steps: list[SchedulerOutput] = []

    def on_step(s: Scheduler, so: SchedulerOutput) -> None:
        _check_step(s, so)
        _check_blocks(s)
        steps.append(so)
        if len(steps) - 1 in arrivals:
            s.add_request(arrivals.pop(len(steps) - 1))

    results = run_engine(
        sched, FakeRunner(sched.kv_cache_manager.block_size), depth, on_step=on_step
    )
    return steps, results


def _steps_where(steps: list[SchedulerOutput], req_id: str, *, admitted: bool) -> list[int]:
    """Indexes of the steps that admit `req_id` (new_reqs), or that drop it from the worker first
    (finished_req_ids: preempted while planning the step, or finished before it)."""
    return [
        n
        for n, so in enumerate(steps)
        if req_id in ({new.req_id for new in so.new_reqs} if admitted else so.finished_req_ids)
    ]


def _assert_reference(
    sched: Scheduler, requests: list[Request], results: dict[str, Result]
) -> None:
    for request in requests:
        got = results[request.request_id]
        assert (got.token_ids, got.finish_reason) == reference_output(
            request, sched.max_model_len, mixing_next_token
        )


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_a_higher_priority_arrival_takes_the_lowest_running_requests_blocks(depth: int):
    """6 blocks of 8. "a" (priority 0) and "low" (1) run; "high" (0, a 25-token prompt: 4 blocks)
    arrives after step 0 and cannot fit. Step 1 preempts "low" (with its token in flight when
    depth > 0) while "a", ranked before "high", runs on; step 2 admits "high" (a step that preempts
    admits nobody); "low" resumes once blocks free up and every request gives its reference tokens."""
    sched = make_scheduler(num_blocks=7, max_model_len=64, policy="priority")
    a = make_request("a", list(range(1, 9)), max_tokens=8)
    low = make_request("low", list(range(10, 26)), max_tokens=8, priority=1)
    high = make_request("high", list(range(30, 55)), max_tokens=8)
    sched.add_request(a)
    sched.add_request(low)
    steps, results = _run(sched, depth, arrivals={0: high})
    assert _steps_where(steps, "low", admitted=False)[0] == 1
    assert steps[1].num_scheduled_tokens == {"a": 1} and not steps[1].new_reqs
    assert _steps_where(steps, "high", admitted=True) == [2]
    first, resumed = _steps_where(steps, "low", admitted=True)
    assert first == 0 and resumed > 2
    # Resumed with the one token it had sampled (in flight at the preemption when depth > 0).
    assert [new.output_token_ids for new in steps[resumed].new_reqs] == [
        results["low"].token_ids[:1]
    ]
    assert (a.num_preemptions, low.num_preemptions, high.num_preemptions) == (0, 1, 0)
    _assert_reference(sched, [a, low, high], results)


@pytest.mark.parametrize("depth", [0, 1])
@pytest.mark.parametrize("arrival_priority, preempts", [(1, False), (0, False), (-1, True)])
def test_only_a_higher_priority_arrival_preempts(arrival_priority: int, preempts: bool, depth: int):
    """ "h1" and "h2" (priority 0) run in 6 blocks of 8; "x" arrives needing 4 blocks it cannot get.
    A lower-priority arrival (1), or an equal one that came later (0), waits for blocks to free up;
    a higher one (-1) takes h2's blocks (the lowest running) while h1 runs on."""
    sched = make_scheduler(num_blocks=7, max_model_len=64, policy="priority")
    h1 = make_request("h1", list(range(1, 9)), max_tokens=8)
    h2 = make_request("h2", list(range(10, 26)), max_tokens=8)
    x = make_request("x", list(range(30, 55)), max_tokens=4, priority=arrival_priority)
    sched.add_request(h1)
    sched.add_request(h2)
    steps, results = _run(sched, depth, arrivals={0: x})
    if preempts:
        assert (h1.num_preemptions, h2.num_preemptions) == (0, 1)
        assert _steps_where(steps, "h2", admitted=False)[0] == 1
        assert _steps_where(steps, "x", admitted=True) == [2]
    else:
        assert sched.get_stats().num_preemptions == 0
        # x needs 4 blocks: it gets them once h1 (2) and h2 (3 of the 6) have both finished.
        assert _steps_where(steps, "x", admitted=True)[0] >= max(
            _steps_where(steps, "h1", admitted=False)[0],
            _steps_where(steps, "h2", admitted=False)[0],
        )
    _assert_reference(sched, [h1, h2, x], results)


def test_no_preemption_that_cannot_make_room():
    """6 blocks of 8: "h" (priority 0) holds 4, "low" (2) 1-2. "x" (1) needs 3: preempting "low"
    would not make room, so it runs on; x waits until h finishes."""
    sched = make_scheduler(num_blocks=7, max_model_len=64, policy="priority")
    h = make_request("h", list(range(1, 25)), max_tokens=8)
    low = make_request("low", list(range(30, 37)), max_tokens=6, priority=2)
    x = make_request("x", list(range(40, 60)), max_tokens=2, priority=1)
    sched.add_request(h)
    sched.add_request(low)
    steps, results = _run(sched, 0, arrivals={0: x})
    assert sched.get_stats().num_preemptions == 0
    assert _steps_where(steps, "x", admitted=True)[0] >= _steps_where(steps, "h", admitted=False)[0]
    _assert_reference(sched, [h, low, x], results)


@pytest.mark.parametrize("depth", [0, 1])
def test_a_victims_blocks_the_arrival_hits_make_no_room(depth: int):
    """7 blocks of 8: "a" (priority 0) 1-2 blocks, "v1" (1) 2, "v2" (2) 2. "x" (0) starts with v2's
    16-token prompt (2 hits) and needs 3 more blocks; after a's growth 1 is free. Preempting v2 frees
    only blocks x would hit: v1 must go too, in the same step, and x is admitted the step after."""
    sched = make_scheduler(num_blocks=8, max_model_len=64, policy="priority")
    a = make_request("a", list(range(1, 9)), max_tokens=8)
    v1 = make_request("v1", list(range(10, 26)), max_tokens=8, priority=1)
    v2 = make_request("v2", list(range(30, 46)), max_tokens=8, priority=2)
    x = make_request("x", v2.prompt_token_ids + list(range(50, 67)), max_tokens=4)
    for request in (a, v1, v2):
        sched.add_request(request)
    steps, results = _run(sched, depth, arrivals={0: x})
    assert {"v1", "v2"} <= steps[1].finished_req_ids and steps[1].num_scheduled_tokens == {"a": 1}
    assert _steps_where(steps, "x", admitted=True) == [2]
    assert [new.num_computed_tokens for new in steps[2].new_reqs] == [16]
    _assert_reference(sched, [a, v1, v2, x], results)


def test_free_cached_blocks_the_arrival_hits_make_no_room():
    """9 blocks of 8. "f" (priority 0, 16 tokens, one output) finishes at once, its 2 blocks left
    free but cached; "x" (0) starts with f's prompt and needs 3 more blocks. Of the 3 free blocks
    after a's growth, 2 are x's own hits: preempting "v2" (2 blocks) makes the room, "v1" runs on."""
    sched = make_scheduler(num_blocks=10, max_model_len=64, policy="priority")
    a = make_request("a", list(range(1, 9)), max_tokens=8)
    f = make_request("f", list(range(10, 26)), max_tokens=1)
    v1 = make_request(
        "v1", list(range(30, 44)), max_tokens=8, priority=1
    )  # no new block in steps 1-2
    v2 = make_request("v2", list(range(50, 66)), max_tokens=8, priority=2)
    x = make_request("x", f.prompt_token_ids + list(range(70, 87)), max_tokens=4)
    for request in (a, f, v1, v2):
        sched.add_request(request)
    steps, results = _run(sched, 0, arrivals={0: x})
    assert steps[1].finished_req_ids == {"f", "v2"} and set(steps[1].num_scheduled_tokens) == {
        "a",
        "v1",
    }
    assert _steps_where(steps, "x", admitted=True) == [2]
    assert [new.num_computed_tokens for new in steps[2].new_reqs] == [16]
    _assert_reference(sched, [a, f, v1, v2, x], results)


@pytest.mark.parametrize("depth", [0, 1])
def test_a_preemption_never_idles_the_step(depth: int):
    """4 blocks of 8: "low" (priority 1) runs alone; "high" (0) needs 3 and only low's blocks would
    make room. Sync (nothing in flight), preempting low would leave a step with nothing to run: low
    runs on and high waits for it to finish. With low's token in flight (depth 1) the step may idle
    while it comes back: low is preempted and high admitted the step after."""
    sched = make_scheduler(num_blocks=5, max_model_len=64, policy="priority")
    low = make_request("low", list(range(1, 17)), max_tokens=8, priority=1)
    high = make_request("high", list(range(20, 37)), max_tokens=4)
    sched.add_request(low)
    steps, results = _run(sched, depth, arrivals={0: high})
    if depth == 0:
        assert low.num_preemptions == 0
        assert (
            _steps_where(steps, "high", admitted=True)[0]
            >= _steps_where(steps, "low", admitted=False)[0]
        )
    else:
        assert low.num_preemptions == 1 and steps[1].is_empty and "low" in steps[1].finished_req_ids
        assert _steps_where(steps, "high", admitted=True) == [2]
    _assert_reference(sched, [low, high], results)


# ---- the engine on a tiny model: the preempted request's tokens are those of an unconstrained run ----

BLOCK_SIZE = 16
NUM_NEW_TOKENS = 16
_rng = random.Random(0)
# "a" (priority 0: 1 block, growing to 2), "low" (1: 2 blocks, to 3), "high" (0: 4 blocks), in 6.
PROMPTS = {
    req_id: [_rng.randrange(2, tiny_hf_models.VOCAB_SIZE) for _ in range(length)]
    for req_id, length in [("a", 16), ("low", 32), ("high", 49)]
}
PRIORITIES = {"a": 0, "low": 1, "high": 0}
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
ENGINE_ARGS = dict(
    skip_tokenizer_init=True, dtype="float32", max_model_len=80, device="cpu", block_size=BLOCK_SIZE
)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[int]]]:
    """The checkpoint and each prompt's tokens from a run with room for all (no preemption)."""
    folder = tmp_path_factory.mktemp("tiny_llama")
    tiny_hf_models.save_tiny_model(folder, "llama")
    llm = LLM(str(folder), **ENGINE_ARGS, num_gpu_blocks_override=64)
    outputs = llm.generate(list(PROMPTS.values()), GREEDY, use_tqdm=False)
    assert llm.get_stats().num_preemptions == 0
    return folder, {req_id: out.outputs[0].token_ids for req_id, out in zip(PROMPTS, outputs)}


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_engine_priority_preemption_keeps_the_tokens(
    tiny_llama: tuple[Path, dict[str, list[int]]], async_scheduling: bool
):
    """6 usable blocks of 16: "a" and "low" run; "high" arrives after the first step and cannot fit.
    The next step preempts low; the one after admits high; low resumes later by recompute. Every
    request's greedy tokens are those of the unconstrained run."""
    folder, expected = tiny_llama
    llm = LLM(
        str(folder),
        **ENGINE_ARGS,
        num_gpu_blocks_override=7,
        scheduling_policy="priority",
        async_scheduling=async_scheduling,
    )
    engine = llm.llm_engine
    scheduler = engine.engine_core.scheduler
    scheduler.growth.enabled = False  # admission by the prompt alone: the pool runs out
    steps: list[SchedulerOutput] = []
    schedule = scheduler.schedule

    def recording_schedule() -> SchedulerOutput:
        steps.append(schedule())
        return steps[-1]

    scheduler.schedule = recording_schedule
    for req_id in ("a", "low"):
        engine.add_request(req_id, PROMPTS[req_id], GREEDY, priority=PRIORITIES[req_id])
    finished: dict[str, Any] = {}
    for num_steps in itertools.count():
        assert num_steps < 500, "the engine did not drain"
        if num_steps == 1:
            engine.add_request("high", PROMPTS["high"], GREEDY, priority=PRIORITIES["high"])
        finished.update((out.request_id, out) for out in engine.step() if out.finished)
        if num_steps >= 1 and not engine.has_unfinished_requests():
            break
    assert len(steps[0].new_reqs) == 2 and _steps_where(steps, "low", admitted=False)[0] == 1
    assert _steps_where(steps, "high", admitted=True) == [2]
    assert len(_steps_where(steps, "low", admitted=True)) == 2  # admitted, then resumed
    assert {req_id: out.outputs[0].token_ids for req_id, out in finished.items()} == expected


# ---- fuzz: block accounting and tokens under priority preemption ----


def _fuzz_scheduler(rng: random.Random) -> Scheduler:
    """Pools of 26-48 tokens for requests of up to 25 tokens of KV, blocks of 1-8 tokens (a duck-typed
    cache config: CacheConfig allows 8+), tiny budgets, the growth reserve on or off."""
    block_size = rng.choice([1, 2, 4, 8])
    max_model_len = 32
    sched_config = SchedulerConfig(
        max_num_seqs=rng.choice([2, 4, 8]),
        max_num_batched_tokens=rng.choice([3, 8, 16, 64]),
        policy="priority",
    )
    cache_config = SimpleNamespace(block_size=block_size, enable_prefix_caching=rng.random() < 0.8)
    num_blocks = cdiv(rng.randint(26, 48), block_size) + 1
    sched = Scheduler(sched_config, cache_config, num_blocks, max_model_len)
    sched.growth = GrowthEstimate(max_model_len, enabled=rng.random() < 0.5)
    return sched


def _fuzz_one(seed: int) -> None:
    """Requests of priorities 0-3 arrive over the first 30 steps; none stops early, so each must end
    with exactly max_tokens tokens, those of the reference; blocks checked after every call."""
    rng = random.Random(seed)
    sched = _fuzz_scheduler(rng)
    depth = rng.choice([0, 1, 2])
    runner = _ReadOrderRunner(sched.kv_cache_manager.block_size)
    base = [rng.randrange(VOCAB) for _ in range(12)]
    arrivals = sorted(rng.randint(0, 30) for _ in range(rng.randint(2, 9)))
    priorities = [rng.randint(0, 3) for _ in arrivals]
    if rng.random() < 0.5:  # later arrivals outrank earlier ones
        priorities.sort(reverse=True)
    added: list[Request] = []
    results: dict[str, Result] = {}
    in_flight: deque[tuple[SchedulerOutput, ModelRunnerOutput]] = deque()
    for step in range(3000):
        while arrivals and arrivals[0] <= step:  # made in arrival order: arrival_time grows
            arrivals.pop(0)
            prompt = base[: rng.randint(1, 12)] + [
                rng.randrange(VOCAB) for _ in range(rng.randint(0, 2))
            ]
            added.append(
                make_request(
                    f"r{len(added)}", prompt, rng.randint(1, 12), priority=priorities[len(added)]
                )
            )
            sched.add_request(added[-1])
        if sched.has_unfinished_requests():
            so = sched.schedule()
            _check_step(sched, so)
            _check_blocks(sched)
            in_flight.append((so, runner.execute(so)))
        while len(in_flight) > depth or (in_flight and not sched.has_unfinished_requests()):
            collect(results, sched.update_from_output(*in_flight.popleft()))
            _check_blocks(sched)
        if not arrivals and not in_flight and not sched.has_unfinished_requests():
            break
    else:
        raise AssertionError("a request never finished")
    pool = sched.kv_cache_manager.pool
    assert pool.num_free_blocks == pool.num_usable_blocks and not any(pool.ref_cnts)
    for request in added:
        got = results[request.request_id]
        assert len(got.token_ids) == request.max_tokens and got.finish_reason == "length"
        assert got.token_ids == reference_output(request, sched.max_model_len, mixing_next_token)[0]


@pytest.mark.parametrize("first_seed", [0, 300])
def test_fuzz_priority_preemption(monkeypatch: pytest.MonkeyPatch, first_seed: int):
    """Also counts the preemptions made for a waiting request (each victim ranked after it), so the
    fuzz cannot silently stop exercising them."""
    counts: Counter[str] = Counter()
    preempt_for_waiting = Scheduler._preempt_for_waiting

    def counting(self: Scheduler, head: Request, first_after: int, plan: Any) -> None:
        running = list(self.running)
        preempt_for_waiting(self, head, first_after, plan)
        victims = running[len(self.running) :]
        assert all(self._sort_key(head) < self._sort_key(victim) for victim in victims)
        counts["steps"] += bool(victims)
        counts["victims"] += len(victims)

    monkeypatch.setattr(Scheduler, "_preempt_for_waiting", counting)
    for seed in range(first_seed, first_seed + 300):
        try:
            _fuzz_one(seed)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}: {exc}") from exc
    assert counts["steps"] >= 30, counts
