from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedlm.core.sched_output import Logprobs, ModelRunnerOutput, SchedulerOutput
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
    position_next_token,
    reference_output,
    run_engine,
)


def _assert_all_free(sched: Scheduler) -> None:
    kv = sched.kv_cache_manager
    assert kv.pool.num_free_blocks == kv.pool.num_usable_blocks and not kv.req_to_blocks
    stats = sched.get_stats()
    assert (stats.num_running, stats.num_waiting, stats.kv_cache_usage) == (0, 0, 0.0)


def _assert_reference(
    sched: Scheduler,
    requests: list[Request],
    results: dict[str, Result],
    next_token=mixing_next_token,
) -> None:
    for request in requests:
        got = results[request.request_id]
        expected = reference_output(request, sched.max_model_len, next_token)
        assert (got.token_ids, got.finish_reason) == expected


def _check_step(sched: Scheduler, so: SchedulerOutput) -> None:
    """Invariants of every step (test requests arrive in add order, see make_request)."""
    config = sched.config
    assert so.total_num_scheduled_tokens <= config.max_num_batched_tokens
    if so.is_empty:  # no livelock: an empty step only waits for tokens in flight (async)
        assert any(r.num_output_placeholders > 0 for r in sched.requests.values())
    assert (
        len(sched.running) <= config.max_num_seqs
        and len(so.num_scheduled_tokens) <= config.max_num_seqs
    )
    assert all(n > 0 for n in so.num_scheduled_tokens.values())
    new_ids = {n.req_id for n in so.new_reqs}
    assert not new_ids & {c.req_id for c in so.cached_reqs}
    assert not so.finished_req_ids & set(so.num_scheduled_tokens)
    preempted = {req_id for req_id in so.finished_req_ids if req_id in sched.requests}
    assert not (preempted and new_ids)  # a step that preempts admits nobody
    keys = [
        (r.priority, r.arrival_time) if config.policy == "priority" else (r.arrival_time,)
        for r in sched.running
    ]
    assert keys == sorted(keys)  # the last running request is the one preempted first
    for r in sched.running:  # no sample past max_tokens, no KV for the last token of max_model_len
        assert r.num_output_tokens + r.num_output_placeholders <= r.max_tokens
        assert r.num_computed_tokens < min(r.num_prompt_tokens + r.max_tokens, sched.max_model_len)


def _prompts(num: int, base_len: int = 12) -> list[list[int]]:
    """Prompts sharing a prefix, so the prefix cache has work."""
    base = [(7 * i + 3) % VOCAB for i in range(base_len)]
    return [base[: base_len - i] + [i] * (i + 1) for i in range(num)]


def test_chunked_prefill_mixes_with_decodes():
    sched = make_scheduler(max_num_batched_tokens=16)
    short = make_request("short", [1, 2, 3], max_tokens=12)
    long = make_request("long", list(range(40)), max_tokens=4)
    sched.add_request(short)
    steps: list[SchedulerOutput] = []

    def on_step(s: Scheduler, so: SchedulerOutput) -> None:
        _check_step(s, so)
        if not steps:
            s.add_request(long)
        steps.append(so)

    results = run_engine(sched, FakeRunner(8), on_step=on_step)
    prefill_steps = steps[1:4]
    assert [so.num_scheduled_tokens["long"] for so in prefill_steps] == [15, 15, 10]
    assert [("long" in so.sampling_req_ids) for so in prefill_steps] == [False, False, True]
    assert all(so.num_scheduled_tokens["short"] == 1 for so in prefill_steps)  # the decode goes on
    assert all(list(so.num_scheduled_tokens)[0] == "short" for so in prefill_steps)  # running first
    _assert_reference(sched, [short, long], results)
    _assert_all_free(sched)


def test_max_num_seqs_is_respected():
    sched = make_scheduler(max_num_seqs=2)
    requests = [make_request(f"r{i}", p, max_tokens=5) for i, p in enumerate(_prompts(5))]
    for request in requests:
        sched.add_request(request)
    batch_sizes = []

    def on_step(s: Scheduler, so: SchedulerOutput) -> None:
        _check_step(s, so)
        batch_sizes.append(len(so.num_scheduled_tokens))

    results = run_engine(sched, FakeRunner(8), on_step=on_step)
    assert max(batch_sizes) == 2
    _assert_reference(sched, requests, results)
    _assert_all_free(sched)


@pytest.mark.parametrize(
    "policy, expected",
    [("fcfs", ["a", "b", "c", "d", "e"]), ("priority", ["e", "d", "b", "c", "a"])],
)
def test_admission_order(policy: str, expected: list[str]):
    sched = make_scheduler(max_num_seqs=1, policy=policy)
    # "d" has b's priority but arrived earlier, though it is added later.
    specs = [("a", 3, 1.0), ("b", 1, 2.0), ("c", 2, 3.0), ("d", 1, 0.5), ("e", 0, 5.0)]
    for req_id, priority, arrival in specs:
        sched.add_request(
            make_request(req_id, [1, 2, 3], max_tokens=2, priority=priority, arrival_time=arrival)
        )
    order: list[str] = []
    run_engine(
        sched, FakeRunner(8), on_step=lambda s, so: order.extend(n.req_id for n in so.new_reqs)
    )
    assert order == expected


@pytest.mark.parametrize("depth", [0, 1, 2])
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_preemption_in_a_tiny_pool(policy: str, depth: int):
    sched = make_scheduler(num_blocks=8, max_model_len=64, max_num_batched_tokens=32, policy=policy)
    requests = [
        make_request(f"r{i}", prompt, max_tokens=16, priority=i % 2)
        for i, prompt in enumerate(_prompts(5, 16))
    ]
    for request in requests:
        sched.add_request(request)
    num_in_flight_preemptions = 0

    def on_step(s: Scheduler, so: SchedulerOutput) -> None:
        nonlocal num_in_flight_preemptions
        preempted = [s.requests[r] for r in so.finished_req_ids if r in s.requests]
        num_in_flight_preemptions += sum(r.num_output_placeholders > 0 for r in preempted)
        _check_step(s, so)

    results = run_engine(sched, FakeRunner(8), depth, on_step=on_step)
    assert sched.get_stats().num_preemptions > 0
    assert sum(r.num_preemptions for r in requests) == sched.get_stats().num_preemptions
    if depth > 0:  # a preempted request still had a token in flight, which was kept
        assert num_in_flight_preemptions > 0
    _assert_reference(sched, requests, results)
    _assert_all_free(sched)


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_the_lowest_request_is_preempted(policy: str):
    # 4 usable blocks of 8: either request fits alone, both do not.
    sched = make_scheduler(num_blocks=5, max_model_len=64, policy=policy)
    specs = {"low": (list(range(8)), 1), "high": (list(range(10, 18)), 0)}
    # fcfs: the newest is the lowest; priority: the higher value, though it came first.
    for req_id in ["high", "low"] if policy == "fcfs" else ["low", "high"]:
        prompt, priority = specs[req_id]
        sched.add_request(make_request(req_id, prompt, max_tokens=20, priority=priority))
    low, high = sched.requests["low"], sched.requests["high"]
    results = run_engine(sched, FakeRunner(8), on_step=_check_step)
    assert high.num_preemptions == 0 and low.num_preemptions > 0
    assert results["low"].num_cached_tokens == 0  # set by the first schedule only
    _assert_reference(sched, [low, high], results)


def test_preempted_request_goes_to_the_front_and_keeps_its_first_hit():
    # 4 usable blocks of 8, two sequences at a time: "b" is preempted when "a" grows past 16
    # tokens (3 blocks at most); "c", waiting since the start, must not overtake it.
    sched = make_scheduler(num_blocks=5, max_model_len=64, max_num_seqs=2)
    sched.spread = None  # arrival order (the spread admits "b", the longer output, first)
    requests = [
        make_request("a", list(range(8)), 12),
        make_request("b", list(range(10, 18)), 20),
        make_request("c", [1, 2, 3, 4], 2),
    ]
    for request in requests:
        sched.add_request(request)
    admitted: list[tuple[str, int]] = []

    def on_step(s: Scheduler, so: SchedulerOutput) -> None:
        _check_step(s, so)
        admitted.extend((n.req_id, n.num_computed_tokens) for n in so.new_reqs)

    results = run_engine(sched, FakeRunner(8), on_step=on_step)
    assert admitted == [("a", 0), ("b", 0), ("b", 8), ("c", 0)]  # "b" resumes with a prefix hit
    assert results["b"].num_cached_tokens == 0  # the first schedule's hit
    _assert_reference(sched, requests, results)


@pytest.mark.parametrize("depth", [1, 2])
def test_preempted_request_waits_for_its_tokens_in_flight(depth: int):
    # 4 usable blocks of 8: "a" growing to its 3rd block preempts "b"; then "a" is aborted, so
    # "b" fits again at once but must wait until no token of it is in flight.
    sched = make_scheduler(num_blocks=5, max_model_len=64)
    requests = [make_request("a", list(range(8)), 20), make_request("b", list(range(10, 18)), 20)]
    for request in requests:
        sched.add_request(request)
    aborted: dict[str, Result] = {}
    num_in_flight_at_preemption = []

    def on_step(s: Scheduler, so: SchedulerOutput) -> None:
        _check_step(s, so)
        for new in so.new_reqs:
            assert s.requests[new.req_id].num_output_placeholders == (
                new.req_id in so.sampling_req_ids
            )
        if "b" in so.finished_req_ids and not aborted:
            num_in_flight_at_preemption.append(requests[1].num_output_placeholders)
            collect(aborted, s.abort_requests(["a"]))

    results = run_engine(sched, FakeRunner(8), depth, on_step=on_step)
    assert num_in_flight_at_preemption == [depth]
    assert results["b"].token_ids == reference_output(requests[1], 64, mixing_next_token)[0]


def test_async_gives_the_same_tokens_as_sync():
    def run(depth: int) -> dict[str, Result]:
        sched = make_scheduler(
            num_blocks=12, max_model_len=48, max_num_batched_tokens=20, max_num_seqs=3
        )
        for i, prompt in enumerate(_prompts(6)):
            sched.add_request(make_request(f"r{i}", prompt, max_tokens=3 + 2 * i, eos=(40,)))
        results = run_engine(sched, FakeRunner(8), depth)
        _assert_all_free(sched)
        return results

    sync = run(0)
    assert sync == run(1) == run(3)
    assert {r.finish_reason for r in sync.values()} == {"stop", "length"}


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_abort_frees_blocks_and_drops_late_outputs(async_scheduling: bool):
    sched = make_scheduler(max_num_seqs=2)
    requests = [make_request(f"r{i}", p, max_tokens=6) for i, p in enumerate(_prompts(3))]
    for request in requests:
        sched.add_request(request)
    runner = FakeRunner(8)
    results: dict[str, Result] = {}
    first = sched.schedule()
    first_out = runner.execute(first)
    if not async_scheduling:
        collect(results, sched.update_from_output(first, first_out))
    # r0 is running (in async mode its sampled token is still in flight), r2 is waiting.
    aborted = sched.abort_requests(["r0", "r2", "unknown"])
    assert [(o.req_id, o.finish_reason) for o in aborted] == [("r0", "abort"), ("r2", "abort")]
    assert set(sched.kv_cache_manager.req_to_blocks) == {"r1"}
    collect(results, aborted)
    if async_scheduling:
        assert "r0" in first_out.req_ids
        late = sched.update_from_output(first, first_out)
        assert [o.req_id for o in late] == ["r1"]  # r0's late token is dropped
        collect(results, late)
    following = sched.schedule()
    assert following.finished_req_ids == {"r0", "r2"}
    collect(results, sched.update_from_output(following, runner.execute(following)))
    rest = run_engine(sched, runner)
    assert results["r0"].finish_reason == results["r2"].finish_reason == "abort"
    assert results["r2"].token_ids == []
    expected = reference_output(requests[1], sched.max_model_len, mixing_next_token)
    assert (results["r1"].token_ids + rest["r1"].token_ids, rest["r1"].finish_reason) == expected
    _assert_all_free(sched)


@pytest.mark.parametrize("depth", [0, 1, 2])
@pytest.mark.parametrize(
    "params, max_model_len, expected",
    [
        (dict(eos=(6,)), 64, ([4, 5, 6], "stop", None)),
        (dict(eos=(6,), ignore_eos=True), 64, ([4, 5, 6, 7, 8], "length", None)),
        (dict(eos=(5, 7), min_tokens=3), 64, ([4, 5, 6, 7], "stop", None)),
        (dict(stop_token_ids=[5]), 64, ([4, 5], "stop", 5)),
        (dict(stop_token_ids=[5], min_tokens=2), 64, ([4, 5], "stop", 5)),
        (dict(max_tokens=3), 64, ([4, 5, 6], "length", None)),
        (dict(), 7, ([4, 5, 6], "length", None)),  # max_model_len
    ],
)
def test_token_level_stops(params: dict, max_model_len: int, expected: tuple, depth: int):
    sched = make_scheduler(max_model_len=max_model_len)
    params = {"max_tokens": 5, **params}
    sched.add_request(make_request("r", [0, 1, 2, 3], **params))  # the model emits its position
    results = run_engine(sched, FakeRunner(8, position_next_token), depth, on_step=_check_step)
    got = results["r"]
    assert (got.token_ids, got.finish_reason, got.stop_reason) == expected
    _assert_all_free(sched)


def test_finish_requests_from_outside():
    sched = make_scheduler()
    sched.add_request(make_request("r", [1, 2, 3]))
    runner = FakeRunner(8)
    step = sched.schedule()
    sched.update_from_output(step, runner.execute(step))
    with pytest.raises(ValueError, match="status must be a finished status"):
        sched.finish_requests(["r"], RequestStatus.RUNNING)
    sched.finish_requests("r", RequestStatus.FINISHED_STOPPED)  # e.g. a stop string
    assert not sched.has_unfinished_requests()
    assert sched.schedule().finished_req_ids == {"r"}
    _assert_all_free(sched)


def test_logprobs_are_passed_along():
    sched = make_scheduler(max_num_batched_tokens=8)
    sched.add_request(make_request("r", list(range(12)), max_tokens=2, eos=(99,)))
    prompt_lps = [None] + [Logprobs([i], [-0.5], 1) for i in range(1, 8)]
    chunk = sched.schedule()  # 8 of 12 prompt tokens: no sample, prompt logprobs only
    outs = sched.update_from_output(
        chunk, ModelRunnerOutput([], [], prompt_logprobs={"r": prompt_lps})
    )
    assert [(o.req_id, o.new_token_ids, o.prompt_logprobs) for o in outs] == [("r", [], prompt_lps)]
    last = sched.schedule()
    assert last.sampling_req_ids == {"r"}
    sampled = [Logprobs([99, 5], [-0.1, -2.0], 1), Logprobs([7], [-0.3], 1)]  # the 2nd is cut off
    outs = sched.update_from_output(last, ModelRunnerOutput(["r"], [[99, 7]], logprobs=[sampled]))
    assert [(o.new_token_ids, o.new_logprobs, o.finish_reason) for o in outs] == [
        ([99], sampled[:1], "stop")
    ]
    _assert_all_free(sched)


def test_repeat_prompt_hits_the_prefix_cache():
    sched = make_scheduler()
    prompt = list(range(20))
    runner = FakeRunner(8)  # one KV cache for both runs
    sched.add_request(make_request("a", prompt, max_tokens=2))
    first = run_engine(sched, runner)
    sched.add_request(make_request("b", prompt, max_tokens=2))
    second = run_engine(sched, runner)
    assert (first["a"].num_cached_tokens, second["b"].num_cached_tokens) == (0, 16)
    assert first["a"].token_ids == second["b"].token_ids
    stats = sched.get_stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (40, 16)


def test_a_one_token_query_takes_no_hit_on_kv_written_in_its_step():
    """'a' computes the last token of its 16-token prompt alone, which fills and registers its second
    block in that step; 'b' (a's prompt + 1) arriving then would hit both blocks and compute one
    token: in a decode-only step the split decode reads keys before its PDL wait, so 'b' takes the
    first block only and computes 9 tokens. One step later the block is settled: a full hit."""
    sched = make_scheduler(block_size=8, max_num_batched_tokens=15)
    prompt = list(range(16))
    sched.add_request(make_request("a", prompt, max_tokens=4))
    first = sched.schedule()
    assert first.num_scheduled_tokens == {"a": 15}
    sched.update_from_output(first, ModelRunnerOutput([], []))
    sched.add_request(make_request("b", prompt + [99], max_tokens=2))
    second = sched.schedule()
    assert second.num_scheduled_tokens == {"a": 1, "b": 9}
    assert [n.num_computed_tokens for n in second.new_reqs] == [8]
    sched.update_from_output(second, ModelRunnerOutput(["a", "b"], [[5], [6]]))
    sched.add_request(make_request("c", prompt + [99], max_tokens=2))
    third = sched.schedule()
    assert third.num_scheduled_tokens["c"] == 1 and [
        n.num_computed_tokens for n in third.new_reqs
    ] == [16]


def test_a_one_token_query_hits_blocks_a_longer_query_fills_in_its_step():
    """Identical prompts admitted together: the first computes all 17 tokens (no decode-only step
    can follow from it), the second hits both blocks it fills and computes one token."""
    sched = make_scheduler(block_size=8, max_num_batched_tokens=64)
    prompt = list(range(17))
    sched.add_request(make_request("a", prompt, max_tokens=2))
    sched.add_request(make_request("b", prompt, max_tokens=2))
    step = sched.schedule()
    assert step.num_scheduled_tokens == {"a": 17, "b": 1}
    assert [n.num_computed_tokens for n in step.new_reqs] == [0, 16]


def test_prompt_embeds_requests_skip_the_prefix_cache():
    sched = make_scheduler()
    runner = FakeRunner(8)
    sched.add_request(make_request("a", list(range(20)), max_tokens=2))
    run_engine(sched, runner)
    embeds = torch.randn(20, 4)
    with_embeds = make_request("b", list(range(20)), max_tokens=2)
    with_embeds.prompt_embeds = embeds
    sched.add_request(with_embeds)
    first = sched.schedule()
    [new] = first.new_reqs
    assert (new.req_id, new.num_computed_tokens, new.prompt_embeds is embeds) == ("b", 0, True)
    sched.update_from_output(first, runner.execute(first))
    run_engine(sched, runner)
    assert sched.get_stats().prefix_cache_queries == 20  # "a" only


def test_requests_the_engine_would_refuse_fail_an_assert():
    """LLMEngine validates requests (InvalidRequest, tests/engine/test_invalid_request.py); the
    scheduler asserts what it relies on, and a failed assert leaves no trace of the request."""
    sched = make_scheduler(num_blocks=3, max_model_len=32)  # 16 tokens of KV cache
    sched.add_request(make_request("ok", [1] * 4, max_tokens=13))
    no_room = make_request("no_room", [1])
    no_room.max_tokens = 0  # the engine resolves max_tokens to at least 1
    for bad, fragment in (
        (make_request("ok", [1, 2]), "request_id 'ok' is already in use"),
        (make_request("empty", []), "0 tokens, max_model_len=32"),
        (make_request("long", [1] * 32), "32 tokens, max_model_len=32"),
        (no_room, "max_tokens must be at least 1"),
        (make_request("big", [1] * 4, max_tokens=14), "KV for 17 tokens"),
    ):
        with pytest.raises(AssertionError, match=fragment):
            sched.add_request(bad)
    assert list(sched.requests) == ["ok"]
    runner = FakeRunner(8)
    step = sched.schedule()
    with pytest.raises(ValueError, match="runner_output.req_ids"):
        sched.update_from_output(step, ModelRunnerOutput(req_ids=[], sampled_token_ids=[]))
    sched.update_from_output(step, runner.execute(step))


_request_spec = st.tuples(
    st.integers(0, 1),
    st.lists(st.integers(0, VOCAB - 1), max_size=10),
    st.integers(1, 12),
    st.integers(0, 2),
    st.integers(0, 8),
)


@settings(max_examples=80, deadline=None)
# 4+ blocks of 8: the KV cache holds max_model_len - 1 = 23 tokens, as EngineCore makes sure.
@given(
    specs=st.lists(_request_spec, min_size=1, max_size=6),
    num_blocks=st.integers(4, 14),
    budget=st.integers(1, 40),
    max_num_seqs=st.integers(1, 4),
    policy=st.sampled_from(["fcfs", "priority"]),
    depth=st.integers(0, 3),
    caching=st.booleans(),
    aborts=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 5)), max_size=2),
)
def test_random_workloads_match_the_reference(
    specs, num_blocks, budget, max_num_seqs, policy, depth, caching, aborts
):
    sched = make_scheduler(
        num_blocks=num_blocks,
        max_model_len=24,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        policy=policy,
        enable_prefix_caching=caching,
    )
    bases = _prompts(2, 10)
    arrivals: dict[int, list[Request]] = {}  # step -> requests that arrive then
    # Made in arrival order, so arrival_time grows with the add order.
    for i, (base, suffix, max_tokens, priority, step) in enumerate(
        sorted(specs, key=lambda x: x[-1])
    ):
        request = engine_request(
            f"r{i}",
            bases[base] + suffix,
            max_tokens,
            sched.max_model_len,
            eos=(3,),
            priority=priority,
        )
        if request is not None:
            arrivals.setdefault(step, []).append(request)
    requests: list[Request] = []
    abort_at = {step: f"r{i}" for step, i in aborts}
    aborted: dict[str, Result] = {}
    num_steps = 0

    def add(new_requests: list[Request]) -> None:
        for request in new_requests:
            sched.add_request(request)
            requests.append(request)

    def on_step(s: Scheduler, so: SchedulerOutput) -> None:
        nonlocal num_steps
        _check_step(s, so)
        if num_steps in abort_at:  # between this step's schedule and its update
            collect(aborted, s.abort_requests([abort_at[num_steps]]))
        num_steps += 1
        add(arrivals.pop(num_steps, []))

    add(arrivals.pop(0, []))
    runner = FakeRunner(8)
    results: dict[str, Result] = {}
    while True:
        results.update(run_engine(sched, runner, depth, on_step=on_step))
        if not arrivals:
            break
        add(arrivals.pop(min(arrivals)))  # the engine went idle before they came
    for request in requests:
        expected = reference_output(request, sched.max_model_len, mixing_next_token)
        got = results.get(request.request_id, Result())
        if request.request_id in aborted:
            assert got.finish_reason in (None, "abort")
            assert got.token_ids == expected[0][: len(got.token_ids)]
        else:
            assert (got.token_ids, got.finish_reason) == expected
    _assert_all_free(sched)
