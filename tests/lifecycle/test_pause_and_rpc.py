"""pause_generation / resume_generation with a request in flight, reset_prefix_cache and
collective_rpc, offline."""

from __future__ import annotations

from typing import Any

import pytest

from pagedlm import SamplingParams
from pagedlm.errors import InvalidRequest
from pagedlm.worker import rpc

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]
GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def expected(llm: Any) -> list[int]:
    return llm.generate(PROMPT, GREEDY, use_tqdm=False)[0].outputs[0].token_ids


def start_request(llm: Any, request_id: str) -> Any:
    """A request with some tokens out and steps in flight."""
    engine = llm.llm_engine
    engine.add_request(request_id, PROMPT, GREEDY)
    for _ in range(4):
        engine.step()
    assert engine.has_unfinished_requests()
    return engine


def run_to_end(engine: Any) -> list[Any]:
    finished = []
    while engine.has_unfinished_requests():
        finished += [o for o in engine.step() if o.finished]
    return finished


def test_keep_freezes_the_request_and_resume_finishes_it(llm: Any, expected: list[int]) -> None:
    engine = start_request(llm, "keep")
    llm.pause_generation(mode="keep")
    assert llm.is_paused()
    steps = [engine.step() for _ in range(3)]  # the steps in flight were collected at the pause
    num_tokens = [len(o.outputs[0].token_ids) for step in steps for o in step]
    assert steps[1:] == [[], []] and engine.has_unfinished_requests(), num_tokens
    with pytest.raises(InvalidRequest, match="paused") as exc:
        llm.generate(PROMPT, GREEDY, use_tqdm=False)
    assert exc.value.code == "engine_paused"
    llm.resume_generation()
    assert not llm.is_paused()
    (done,) = run_to_end(engine)
    assert done.outputs[0].token_ids == expected


def test_abort_finishes_the_request_as_aborted(llm: Any) -> None:
    engine = start_request(llm, "abort")
    llm.pause_generation(mode="abort")
    outputs = engine.step()
    assert [(o.request_id, o.outputs[0].finish_reason) for o in outputs] == [("abort", "abort")]
    assert not engine.has_unfinished_requests()
    llm.resume_generation()


def test_wait_lets_the_request_finish_first(llm: Any, expected: list[int]) -> None:
    engine = start_request(llm, "wait")
    llm.pause_generation(mode="wait")
    assert llm.is_paused() and not engine.has_unfinished_requests()
    finished = [o for o in engine.step() if o.finished]  # held for the caller's next step()
    assert [o.outputs[0].token_ids for o in finished] == [expected]
    llm.resume_generation()
    with pytest.raises(InvalidRequest, match="mode"):
        llm.pause_generation(mode="sometimes")


def test_reset_prefix_cache_refuses_while_a_request_runs(llm: Any) -> None:
    llm.generate(PROMPT, GREEDY, use_tqdm=False)
    assert llm.generate(PROMPT, GREEDY, use_tqdm=False)[0].num_cached_tokens > 0
    engine = start_request(llm, "holds-blocks")
    assert llm.reset_prefix_cache() is False
    run_to_end(engine)
    assert llm.reset_prefix_cache() is True
    assert llm.generate(PROMPT, GREEDY, use_tqdm=False)[0].num_cached_tokens == 0


def test_collective_rpc_runs_between_steps(llm: Any, expected: list[int]) -> None:
    engine = start_request(llm, "rpc")
    (footprint,) = llm.collective_rpc("memory_footprint")
    assert footprint["weights_bytes"] > 0 and footprint["kv_cache_bytes"] > 0
    (done,) = run_to_end(engine)
    assert done.outputs[0].token_ids == expected  # the RPC's drain lost no token


def test_collective_rpc_errors_leave_the_engine_running(
    llm: Any, expected: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(InvalidRequest, match="not a worker method") as exc:
        llm.collective_rpc("no_such_method")
    assert exc.value.param == "method"
    monkeypatch.setitem(rpc.WORKER_METHODS, "broken", f"{__name__}:broken_method")
    with pytest.raises(InvalidRequest, match="broken value") as exc:
        llm.collective_rpc("broken", args=("value",))
    assert exc.value.param == "args"
    with pytest.raises(rpc.WorkerMethodError, match="RuntimeError: broken runtime"):
        llm.collective_rpc("broken", kwargs={"how": "runtime"})
    assert llm.generate(PROMPT, GREEDY, use_tqdm=False)[0].outputs[0].token_ids == expected


def broken_method(runner: Any, how: str) -> None:
    """A worker method registered by the test above."""
    raise (ValueError if how == "value" else RuntimeError)(f"broken {how}")


def test_weight_version_wrappers(llm: Any) -> None:
    """vLLM's offline names over collective_rpc; a new version stamps the outputs after it."""
    previous = llm.get_weight_version()
    try:
        assert llm.update_weight_version("step-1") == "step-1"
        assert llm.get_weight_version() == "step-1"
        out = llm.generate(PROMPT, GREEDY, use_tqdm=False)[0].outputs[0]
        assert [span.version for span in out.weight_versions] == ["step-1"]
        with pytest.raises(InvalidRequest, match="init_weight_transfer_engine"):
            llm.start_weight_update()
    finally:
        llm.update_weight_version(previous)
