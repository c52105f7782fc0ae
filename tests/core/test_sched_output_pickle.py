"""SchedulerOutput pickles its cached requests as columns (TP's broadcast ring): every field of
every kind of step comes back equal."""

from __future__ import annotations

import pickle

from pagedlm.core.sched_output import (
    CachedRequestData,
    GroupBlockUpdate,
    NewRequestData,
    SchedulerOutput,
)
from pagedlm.sampling_params import SamplingParams


def _roundtrip(sched: SchedulerOutput) -> SchedulerOutput:
    return pickle.loads(pickle.dumps(sched, protocol=pickle.HIGHEST_PROTOCOL))


def test_a_mixed_step_comes_back_equal() -> None:
    new = NewRequestData("a", [1, 2, 3], [], SamplingParams(max_tokens=4, seed=3), [7], 0)
    cached = [
        CachedRequestData("b", [], 17),
        CachedRequestData("c", [9, 10], 31, num_null_blocks=2, num_blocks=5),
        CachedRequestData(
            "d", [11], 40, groups=(GroupBlockUpdate([12], num_null_blocks=1, num_blocks=3),)
        ),
    ]
    sched = SchedulerOutput(
        [new],
        cached,
        {"a": 3, "b": 1, "c": 4, "d": 1},
        9,
        finished_req_ids={"z"},
        sampling_req_ids={"a", "b", "c", "d"},
        step_id=12,
        num_draft_tokens={"c": 3},
    )
    back = _roundtrip(sched)
    assert back == sched
    assert list(back.num_scheduled_tokens) == ["a", "b", "c", "d"]  # the batch order
    assert all(type(r) is CachedRequestData for r in back.cached_reqs)


def test_a_step_without_cached_requests_comes_back_equal() -> None:
    sched = SchedulerOutput([], [], {}, 0, finished_req_ids={"x", "y"}, step_id=3)
    assert _roundtrip(sched) == sched
