"""The prefill spread (core/prefill_spread.py): its budget and order on hand-made queues, and the
scheduler with it against the plain schedule and the token-by-token reference."""

from __future__ import annotations

import pytest

from pagedlm.core.prefill_spread import PrefillSpread
from pagedlm.core.sched_output import SchedulerOutput
from pagedlm.core.scheduler import Scheduler
from pagedlm.request import Request, RequestStatus

from .fakes import (
    FakeRunner,
    make_request,
    make_scheduler,
    mixing_next_token,
    reference_output,
    run_engine,
)


def _decoding(req_id: str, prompt_len: int, outputs_left: int) -> Request:
    """A running request past its prompt, one token in flight."""
    request = make_request(req_id, [5] * prompt_len, outputs_left + 1)
    request.status = RequestStatus.RUNNING
    request.num_computed_tokens = prompt_len
    request.num_output_placeholders = 1
    return request


def test_budget_keeps_every_request_on_time_and_orders_by_slack():
    spread = PrefillSpread(max_num_batched_tokens=4096, target_rows=0)
    running = [_decoding("d", 30, 100)]  # the horizon: 100 outputs left
    waiting = [
        make_request("b", [1] * 50, 51),  # slack 49
        make_request("c", [1] * 500, 90),  # slack 10
        make_request("a", [1] * 40, 100),  # slack 0: its 40 tokens now
        make_request("p", [1] * 20, 2),  # slack 98, but preempted: 0
    ]
    waiting[3].num_preemptions = 1
    budget = spread.plan(running, waiting)
    # owed, by slack: (0, 40 + 20), (10, 500), (49, 50): max(60 / 1, 560 / 11, 610 / 50)
    assert budget == 60
    assert [r.request_id for r in waiting] == ["a", "p", "c", "b"]


def test_budget_fills_the_step_to_its_target_rows():
    spread = PrefillSpread(max_num_batched_tokens=4096, target_rows=256)
    running = [_decoding(f"d{i}", 30, 100) for i in range(56)]
    assert spread.plan(running, [make_request("w", [1] * 300, 2)]) == 200  # 256 - 56 decodes
    assert spread.plan(running, []) == 4096  # no prompt waits: the whole budget


def test_a_waiting_request_is_held_at_most_the_bound():
    spread = PrefillSpread(max_num_batched_tokens=4096, target_rows=0, max_wait_steps=3)
    running = [_decoding("d", 30, 1000)]
    short = make_request("s", [1] * 400, 2)  # slack 998
    budgets = [spread.plan(running, [short]) for _ in range(4)]
    assert budgets == [100, 134, 200, 400]  # 400 tokens over slack + 1 = 4, 3, 2, then 1 step


def _admission_steps(sched: Scheduler, runner: FakeRunner) -> tuple[dict[str, int], int, list]:
    """Runs the scheduler to the end -> (request id -> its admission step, steps, each step's
    scheduled tokens), checking every output against the reference."""
    admitted: dict[str, int] = {}
    steps: list[dict[str, int]] = []
    requests = {r.request_id: r for r in sched.waiting}

    def on_step(s: Scheduler, so: SchedulerOutput) -> None:
        assert so.total_num_scheduled_tokens <= s.config.max_num_batched_tokens
        for new in so.new_reqs:
            admitted.setdefault(new.req_id, len(steps))
        steps.append(dict(so.num_scheduled_tokens))

    results = run_engine(sched, runner, depth=1, on_step=on_step)
    for req_id, request in requests.items():
        expected = reference_output(request, sched.max_model_len, mixing_next_token)
        assert (results[req_id].token_ids, results[req_id].finish_reason) == expected
    return admitted, len(steps), steps


def _scheduler(spread: bool, specs: list[tuple[int, int]], **kwargs) -> Scheduler:
    sched = make_scheduler(num_blocks=400, max_model_len=256, max_num_seqs=64, **kwargs)
    sched.spread = PrefillSpread(sched.config.max_num_batched_tokens) if spread else None
    for i, (prompt_len, max_tokens) in enumerate(specs):
        prompt = [(7 * i + j) % 50 for j in range(prompt_len)]
        sched.add_request(make_request(f"r{i}", prompt, max_tokens))
    return sched


def test_like_outputs_schedule_as_without_the_spread():
    specs = [(10 + 7 * i % 40, 12) for i in range(20)]
    plain = _admission_steps(_scheduler(False, specs), FakeRunner(8))
    spread = _admission_steps(_scheduler(True, specs), FakeRunner(8))
    assert spread == plain


@pytest.mark.parametrize("target_rows", [0, 16])
def test_skewed_outputs_spread_prompts_and_end_on_time(target_rows: int):
    """One long output, many short ones with long prompts: their prompts wait for the steps the
    long output decodes alone, and the run ends when it does."""
    specs = [(20, 120)] + [(40 + 3 * i, 2 + i % 5) for i in range(20)]
    plain_admitted, plain_steps, _ = _admission_steps(_scheduler(False, specs), FakeRunner(8))
    sched = _scheduler(True, specs)
    sched.spread.target_rows = target_rows
    admitted, num_steps, steps = _admission_steps(sched, FakeRunner(8))
    assert num_steps == plain_steps  # the long output's steps
    assert max(plain_admitted.values()) < 25  # plain: every prompt in the first steps
    assert max(admitted.values()) > 60  # spread: the short outputs start late
    assert max(admitted.values()) + 6 < 120  # and end before the long one (at most 6 outputs)
    assert max(sum(step.values()) for step in steps[1:]) < 64  # no step takes the whole budget


@pytest.mark.parametrize("depth", [0, 1])
def test_spread_with_preemptions_matches_the_reference(depth: int):
    """A pool too small for the batch: preempted requests come back at once (slack 0) and every
    output is still the reference's."""
    specs = [(20, 60)] + [(10 + 3 * i, 2 + 7 * i % 30) for i in range(12)]
    sched = make_scheduler(num_blocks=14, max_model_len=128, max_num_seqs=8)
    sched.spread = PrefillSpread(sched.config.max_num_batched_tokens, target_rows=0)
    for i, (prompt_len, max_tokens) in enumerate(specs):
        prompt = [(5 * i + j) % 50 for j in range(prompt_len)]
        sched.add_request(make_request(f"r{i}", prompt, max_tokens))
    requests = list(sched.waiting)
    results = run_engine(sched, FakeRunner(8), depth)
    for request in requests:
        expected = reference_output(request, sched.max_model_len, mixing_next_token)
        got = results[request.request_id]
        assert (got.token_ids, got.finish_reason) == expected
    assert sched.num_preemptions > 0
