"""The scheduler's part in structured outputs (pure Python, a fake grammar): a constrained
request is admitted once its grammar is ready, never has a token in flight when it is scheduled
to sample (its bitmask needs every token), feeds its matcher every token in order and ends where
the grammar ends; unconstrained neighbours are unaffected."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from core.fakes import (
    FakeRunner,
    make_request,
    make_scheduler,
    mixing_next_token,
    reference_output,
    run_engine,
)

from pagedlm.core.sched_output import SchedulerOutput
from pagedlm.core.scheduler import Scheduler


@dataclass
class FakeGrammar:
    """Ends after `length` tokens; `ready` says whether its compile finished."""

    length: int
    ready: bool = True
    accepted: list[int] = field(default_factory=list)

    def is_ready(self) -> bool:
        return self.ready

    def accept_token(self, token_id: int) -> bool:
        self.accepted.append(token_id)
        return len(self.accepted) >= self.length


@pytest.mark.parametrize("depth", [0, 1])
def test_a_constrained_request_samples_only_with_every_token_known(depth: int) -> None:
    sched = make_scheduler()
    constrained = make_request("c", list(range(10)), max_tokens=20)
    constrained.structured_output = grammar = FakeGrammar(length=6)
    free = make_request("u", list(range(20, 32)), max_tokens=12)
    for request in (constrained, free):
        sched.add_request(request)
    num_steps_without_c = []

    def on_step(s: Scheduler, so: SchedulerOutput) -> None:
        if "c" in so.sampling_req_ids:  # its one placeholder is this step's
            assert constrained.num_output_placeholders == 1
            assert len(grammar.accepted) == constrained.num_output_tokens
        elif constrained.num_output_tokens and not constrained.is_finished:
            num_steps_without_c.append(1)

    results = run_engine(sched, FakeRunner(8), depth, on_step=on_step)
    assert results["c"].finish_reason == "stop" and len(results["c"].token_ids) == 6
    assert grammar.accepted == results["c"].token_ids
    expected_c = reference_output(constrained, 256, mixing_next_token)[0][:6]
    assert results["c"].token_ids == expected_c
    assert results["u"].token_ids == reference_output(free, 256, mixing_next_token)[0]
    # async: the constrained request waits one step after each of its samples, the other does not
    assert bool(num_steps_without_c) == (depth == 1)


def test_a_request_waits_for_its_grammar_while_others_run() -> None:
    sched = make_scheduler()
    constrained = make_request("c", list(range(10)), max_tokens=4)
    constrained.structured_output = grammar = FakeGrammar(length=100, ready=False)
    free = make_request("u", list(range(20, 32)), max_tokens=6)
    for request in (constrained, free):
        sched.add_request(request)
    num_free_steps = []

    def on_step(s: Scheduler, so: SchedulerOutput) -> None:
        if not grammar.ready:
            assert "c" not in so.num_scheduled_tokens
            num_free_steps.append(1)
            grammar.ready = len(num_free_steps) == 3

    results = run_engine(sched, FakeRunner(8), depth=1, on_step=on_step)
    assert len(num_free_steps) == 3
    assert results["c"].finish_reason == "length" and len(grammar.accepted) == 4
    assert results["u"].token_ids == reference_output(free, 256, mixing_next_token)[0]
