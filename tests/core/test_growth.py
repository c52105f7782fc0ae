"""Admission with a growth reserve (core/growth.py): a pool that holds every prompt but not every
request's full length admits only what can finish without preemption; the estimate learns from
requests that stop early; a lone request too long for the reserve is still admitted."""

from __future__ import annotations

import pytest

from pagedlm.core.growth import INITIAL_FRACTION, MAX_ESTIMATED_OUTPUTS, GrowthEstimate
from pagedlm.request import RequestStatus

from .fakes import FakeRunner, make_request, make_scheduler, reference_output, run_engine


def _uniform_requests(num: int, prompt_len: int, max_tokens: int):
    return [
        make_request(
            f"r{i}",
            [(5 * i + j) % 50 + 1 for j in range(prompt_len)],
            max_tokens=max_tokens,
            ignore_eos=True,
        )
        for i in range(num)
    ]


@pytest.mark.parametrize("depth", [0, 1])
@pytest.mark.parametrize("growth_reserve", [False, True])
def test_reserve_avoids_preemption(growth_reserve: bool, depth: int):
    """6 requests of 16 prompt + 24 output tokens (5 blocks of 8 each at the end) in 16 blocks: every
    prompt fits (2 blocks each), but only 3 full requests do."""
    sched = make_scheduler(
        num_blocks=17, max_model_len=64, max_num_batched_tokens=64, growth_reserve=growth_reserve
    )
    requests = _uniform_requests(6, 16, 24)
    for request in requests:
        sched.add_request(request)
    max_running = 0

    def on_step(s, so) -> None:
        nonlocal max_running
        max_running = max(max_running, len(s.running))

    results = run_engine(sched, FakeRunner(8), depth, on_step=on_step)
    for request in requests:  # the same tokens either way
        got = results[request.request_id]
        assert (got.token_ids, got.finish_reason) == reference_output(
            request, 64, FakeRunner(8).next_token
        )
    if growth_reserve:
        assert sched.get_stats().num_preemptions == 0 and max_running == 3
    else:
        assert sched.get_stats().num_preemptions > 0 and max_running > 3


def test_the_estimate_learns_from_early_stops():
    estimate = GrowthEstimate(max_model_len=100)
    assert estimate.fraction == INITIAL_FRACTION
    request = make_request("early", [1] * 10, max_tokens=40)
    for token in (3, 4, 5, 6):  # 4 of 40 allowed outputs
        request.append_output_token(token)
    assert estimate.tokens(request, 0) == pytest.approx(
        14 + 36
    )  # 14 tokens not computed + 36 more outputs
    assert estimate.tokens(request, 13) == pytest.approx(1 + 36)
    assert estimate.blocks(request, 13, block_size=8) == 5  # 50 tokens in 7 blocks, 2 held
    for _ in range(200):
        estimate.observe_finished(request)
    assert estimate.fraction == pytest.approx(0.1, abs=1e-3)
    assert estimate.tokens(request, 13) == pytest.approx(1 + 0.1 * 36, abs=1e-2)
    assert estimate.blocks(request, 13, block_size=8) == 1  # 17.6 tokens: 3 blocks, 2 held
    assert estimate.blocks(request, 13, block_size=32) == 0  # the free slots of the held block
    assert GrowthEstimate(100, enabled=False).tokens(request, 0) == 0.0


def test_an_allowance_counts_at_most_max_estimated_outputs():
    """max_tokens left to the context (40k on Qwen3): the reserve holds MAX_ESTIMATED_OUTPUTS."""
    estimate = GrowthEstimate(max_model_len=40960)
    request = make_request("long", [1] * 100, max_tokens=40960 - 100)
    assert estimate.tokens(request, 100) == MAX_ESTIMATED_OUTPUTS
    request.append_output_token(5)
    assert estimate.tokens(request, 100) == pytest.approx(1 + MAX_ESTIMATED_OUTPUTS - 1)


def test_aborted_requests_teach_nothing():
    sched = make_scheduler(growth_reserve=True)
    request = make_request("a", [1, 2, 3], max_tokens=50)
    sched.add_request(request)
    sched.schedule()
    sched.abort_requests(["a"])
    assert sched.growth.fraction == INITIAL_FRACTION
    assert request.status == RequestStatus.FINISHED_ABORTED


@pytest.mark.parametrize(
    "prompt_len, max_tokens, num_blocks, budget",
    [
        (8, 56, 9, 64),  # 63 KV tokens in 8 usable blocks of 8
        (9, 56, 9, 64),  # 64 KV tokens: exactly the pool, the prompt's last block part-filled
        (17, 8, 4, 8),  # 24 KV tokens in 3 blocks, the prompt chunked by a budget of 8
    ],
)
def test_a_request_that_fits_alone_is_admitted(
    prompt_len: int, max_tokens: int, num_blocks: int, budget: int
):
    """With nothing running, a request the pool holds (_check_fits) is admitted whatever its
    reserve, and finishes; with others running it waits for them."""
    sched = make_scheduler(
        num_blocks=num_blocks,
        max_model_len=prompt_len + max_tokens,
        max_num_batched_tokens=budget,
        growth_reserve=True,
    )
    requests = _uniform_requests(2, prompt_len, max_tokens)
    for request in requests:
        sched.add_request(request)
    results = run_engine(sched, FakeRunner(8), max_steps=400)
    assert [len(results[r.request_id].token_ids) for r in requests] == [max_tokens, max_tokens]
    assert sched.get_stats().num_preemptions == 0


def test_an_urgent_request_is_not_held_back_by_less_urgent_ones():
    """Priority policy: running requests ranked after the waiting one are not reserved for (they
    are the ones preempted if the pool runs out), so it is admitted at once."""
    sched = make_scheduler(num_blocks=36, max_model_len=96, policy="priority", growth_reserve=True)
    low = [
        make_request(f"low{i}", [i + 1] * 8, max_tokens=80, priority=5, ignore_eos=True)
        for i in range(3)
    ]
    for request in low:
        sched.add_request(request)
    sched.schedule()  # the three start: their growth (~10 blocks each) is reserved
    urgent = make_request("urgent", [9] * 8, max_tokens=80, priority=0, ignore_eos=True)
    sched.add_request(urgent)
    assert [n.req_id for n in sched.schedule().new_reqs] == ["urgent"]
    fcfs = make_scheduler(num_blocks=36, max_model_len=96, growth_reserve=True)
    for request in _uniform_requests(3, 8, 80):
        fcfs.add_request(request)
    fcfs.schedule()
    fcfs.add_request(make_request("late", [9] * 8, max_tokens=80, ignore_eos=True))
    assert fcfs.schedule().new_reqs == []  # fcfs: the running ones come first
