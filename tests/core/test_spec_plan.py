"""The planner's side of speculative decoding (core/spec_plan.py) with hand-made runner outputs:
1 + n positions for a decoding request holding n drafts, capped by max_tokens, max_model_len and
the budget; the rollback over rejected drafts; a speculating request waits while its step is in
flight, a penalised one too; the per-step counts reach the outputs and the counters."""

from __future__ import annotations

from pagedlm.config import CacheConfig, SchedulerConfig
from pagedlm.core.growth import GrowthEstimate
from pagedlm.core.sched_output import ModelRunnerOutput, SchedulerOutput
from pagedlm.core.scheduler import Scheduler
from pagedlm.spec_decode.config import SpeculativeConfig

from .fakes import make_request

K = 3


def _scheduler(budget: int = 64, max_model_len: int = 64) -> Scheduler:
    return Scheduler(
        SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=budget),
        CacheConfig(block_size=8),
        num_blocks=64,
        max_model_len=max_model_len,
        speculative=SpeculativeConfig.from_user({"method": "ngram", "num_speculative_tokens": K}),
    )


def _output(sched: SchedulerOutput, tokens: dict[str, list[int]], held: int) -> ModelRunnerOutput:
    req_ids = [r for r in sched.num_scheduled_tokens if r in sched.sampling_req_ids]
    return ModelRunnerOutput(
        req_ids=req_ids,
        sampled_token_ids=[tokens[r] for r in req_ids],
        num_draft_tokens=[held] * len(req_ids),
        step_id=sched.step_id,
    )


def test_drafts_are_scheduled_verified_and_rolled_back() -> None:
    scheduler = _scheduler()
    request = make_request("a", list(range(10)), max_tokens=20)
    scheduler.add_request(request)
    prefill = scheduler.schedule()
    assert prefill.num_draft_tokens == {}
    scheduler.update_from_output(prefill, _output(prefill, {"a": [7]}, held=K))
    step = scheduler.schedule()
    assert step.num_scheduled_tokens == {"a": 1 + K} and step.num_draft_tokens == {"a": K}
    assert step.sampling_req_ids == {"a"}
    assert request.num_computed_tokens == 11 + K  # before the verdict: every draft position
    [out] = scheduler.update_from_output(step, _output(step, {"a": [8, 9]}, held=2))
    assert out.new_token_ids == [8, 9]
    assert (out.num_draft_tokens, out.num_accepted_draft_tokens) == (K, 1)
    assert request.num_computed_tokens == request.num_tokens - 1 == 12  # 2 rejected rolled back
    counters = scheduler.spec.counters
    assert (counters.num_drafts, counters.num_draft_tokens, counters.num_accepted_tokens) == (
        1,
        K,
        1,
    )
    assert counters.accepted_per_pos.tolist() == [1, 0, 0]
    assert scheduler.schedule().num_draft_tokens == {"a": 2}  # what the worker holds now
    plain = GrowthEstimate(64)
    assert scheduler.growth.tokens(request, 13) == plain.tokens(request, 13) + K  # the reserve


def test_drafts_are_capped_by_max_tokens_max_model_len_and_budget() -> None:
    for max_tokens, max_model_len, budget, expected in [
        (3, 64, 64, 1),  # 1 output, 2 allowed: the token and 1 draft
        (20, 14, 64, 1),  # 12 tokens: position 13 is the last the context holds
        (20, 64, 3, 2),  # a budget of 3 positions
        (2, 64, 64, 0),  # the next token is the last allowed: no draft
    ]:
        scheduler = _scheduler(budget, max_model_len)
        scheduler.add_request(make_request("a", list(range(11)), max_tokens=max_tokens))
        prefill = scheduler.schedule()
        while prefill.sampling_req_ids != {"a"}:  # chunked under a small budget
            scheduler.update_from_output(prefill, _output(prefill, {}, held=0))
            prefill = scheduler.schedule()
        scheduler.update_from_output(prefill, _output(prefill, {"a": [5]}, held=K))
        step = scheduler.schedule()
        assert step.num_draft_tokens.get("a", 0) == expected, (max_tokens, max_model_len, budget)


def test_a_speculating_request_waits_for_its_step_and_penalised_ones_draft_too() -> None:
    scheduler = _scheduler()
    scheduler.add_request(make_request("a", list(range(10)), max_tokens=20))
    scheduler.add_request(make_request("p", list(range(10)), max_tokens=20, presence_penalty=0.5))
    prefill = scheduler.schedule()
    scheduler.update_from_output(prefill, _output(prefill, {"a": [1], "p": [1]}, held=K))
    first = scheduler.schedule()
    assert first.num_draft_tokens == {"a": K, "p": K}
    second = scheduler.schedule()  # async: `first` is in flight
    assert second.num_scheduled_tokens == {}  # both wait for their verdicts
    scheduler.update_from_output(first, _output(first, {"a": [2, 3, 4, 5], "p": [2, 3]}, held=K))
    for req_id in ("a", "p"):
        request = scheduler.requests[req_id]
        assert request.num_computed_tokens == request.num_tokens - 1
    third = scheduler.schedule()
    assert third.num_draft_tokens == {"a": K, "p": K}


def test_blocks_of_a_rejected_tail_go_back() -> None:
    """Block size 8: a request of 15 tokens verifying 3 drafts holds positions up to 17 (3
    blocks); all rejected, it keeps the 2 blocks that hold position 15, which the next step
    writes, and tells the worker so."""
    scheduler = _scheduler()
    kv = scheduler.kv_cache_manager
    request = make_request("a", list(range(14)), max_tokens=20)
    scheduler.add_request(request)
    prefill = scheduler.schedule()
    scheduler.update_from_output(prefill, _output(prefill, {"a": [7]}, held=K))
    step = scheduler.schedule()
    assert step.num_draft_tokens == {"a": K} and len(kv.get_block_ids("a")) == 3
    free_before = kv.pool.num_free_blocks
    scheduler.update_from_output(step, _output(step, {"a": [9]}, held=K))
    assert len(kv.get_block_ids("a")) == 2 and kv.pool.num_free_blocks == free_before + 1
    again = scheduler.schedule()
    [cached] = again.cached_reqs
    assert cached.num_blocks == len(kv.get_block_ids("a")) == 3  # its tail taken again
    assert cached.new_block_ids == kv.get_block_ids("a")[2:]


def test_a_drafted_step_in_flight_holds_its_request_when_the_batch_stops_speculating() -> None:
    """k drops to 0 once a second request runs (per-batch-size k) while the first one's drafted
    step is in flight: the first still waits for that step's verdict (its next position depends
    on it) instead of being scheduled on positions that assume every draft accepted."""
    speculative = SpeculativeConfig.from_user(
        {
            "method": "ngram",
            "num_speculative_tokens": K,
            "num_speculative_tokens_per_batch_size": [[1, 1, K], [2, 4, 0]],
        }
    )
    scheduler = Scheduler(
        SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64),
        CacheConfig(block_size=8),
        num_blocks=64,
        max_model_len=64,
        speculative=speculative,
    )
    first = make_request("a", list(range(10)), max_tokens=20)
    scheduler.add_request(first)
    prefill = scheduler.schedule()
    scheduler.update_from_output(prefill, _output(prefill, {"a": [7]}, held=K))
    drafted = scheduler.schedule()  # batch 1: a verifies K drafts, its step now in flight
    assert drafted.num_draft_tokens == {"a": K}
    scheduler.add_request(make_request("b", list(range(20, 30)), max_tokens=20))
    admits = scheduler.schedule()  # b joins: from now on the batch is 2, k = 0
    assert admits.num_scheduled_tokens == {"b": 10}
    nxt = scheduler.schedule()  # a's drafted step still in flight
    assert "a" not in nxt.num_scheduled_tokens
    assert first.num_computed_tokens == 11 + K  # untouched until the verdict
    scheduler.update_from_output(drafted, _output(drafted, {"a": [8, 9]}, held=0))
    assert first.num_computed_tokens == first.num_tokens - 1 == 12
    after = scheduler.schedule()
    assert after.num_scheduled_tokens["a"] == 1 and "a" not in after.num_draft_tokens
