"""The scheduler's part in structured outputs (pure Python, a fake grammar): a constrained
request is admitted once its grammar is ready, is scheduled every step as an unconstrained one
(under async scheduling with its previous token in flight: the engine core fills its bitmask once
that token is back), feeds its matcher every token in order and ends where the grammar ends;
unconstrained neighbours are unaffected."""

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
def test_a_constrained_request_is_scheduled_every_step_as_its_neighbour(depth: int) -> None:
    """Async scheduling (depth 1) schedules it with its previous token still in flight, as the
    unconstrained one (the engine core fills its bitmask once that token is back); its matcher
    sees every token in order."""
    sched = make_scheduler()
    constrained = make_request("c", list(range(10)), max_tokens=20)
    constrained.structured_output = grammar = FakeGrammar(length=6)
    free = make_request("u", list(range(20, 32)), max_tokens=12)
    for request in (constrained, free):
        sched.add_request(request)
    steps = []  # (c samples, u samples, c's tokens in flight from earlier steps)

    def on_step(s: Scheduler, so: SchedulerOutput) -> None:
        if not constrained.is_finished:
            sampling = so.sampling_req_ids
            in_flight = constrained.num_output_placeholders - ("c" in sampling)
            steps.append(("c" in sampling, "u" in sampling, in_flight))
            assert len(grammar.accepted) == constrained.num_output_tokens

    results = run_engine(sched, FakeRunner(8), depth, on_step=on_step)
    assert results["c"].finish_reason == "stop" and len(results["c"].token_ids) == 6
    assert grammar.accepted == results["c"].token_ids
    expected_c = reference_output(constrained, 256, mixing_next_token)[0][:6]
    assert results["c"].token_ids == expected_c
    assert results["u"].token_ids == reference_output(free, 256, mixing_next_token)[0]
    assert [c for c, _, _ in steps] == [u for _, u, _ in steps]  # the same steps sample
    assert max(in_flight for _, _, in_flight in steps) == depth


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
