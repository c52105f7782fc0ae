"""The in-process executor ("uni", tp = 1): an Executor as MultiprocExecutor is, whose step calls
go straight to the ModelRunner (a spy put on the runner sees every one, in order)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import tiny_hf_models

from pagedlm import LLM, SamplingParams
from pagedlm.executor.base import Executor
from pagedlm.executor.uni import UniExecutor
from pagedlm.worker.model_runner import ModelRunner


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    folder = tmp_path_factory.mktemp("tiny_llama")
    tiny_hf_models.save_tiny_model(folder, "llama")
    engine = LLM(
        str(folder), skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=64
    )
    yield engine
    engine.shutdown()


def test_uni_is_an_executor_whose_step_calls_reach_the_runner(
    llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = llm.llm_engine.engine_core
    executor, runner = core.executor, core.model_runner
    assert isinstance(executor, UniExecutor) and isinstance(executor, Executor)
    assert isinstance(runner, ModelRunner) and executor.runner is runner
    calls = []

    def spy(name: str) -> Callable:
        method = getattr(runner, name)
        return lambda *args: calls.append(name) or method(*args)

    for name in ("execute_forward", "sample_tokens"):
        monkeypatch.setattr(runner, name, spy(name))
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": [3, 4, 5]}], params, use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
    assert calls[:2] == ["execute_forward", "sample_tokens"] and len(calls) >= 6
    assert calls == ["execute_forward", "sample_tokens"] * (len(calls) // 2)
    executor.check_health()
    assert executor.failed is None
    assert (
        executor.collective_rpc("get_weight_version") == llm.collective_rpc("get_weight_version")[0]
    )


def test_shutdown_drops_the_runner_and_is_idempotent(llm: LLM) -> None:
    out = llm.generate([{"prompt_token_ids": [3, 4, 5]}], SamplingParams(max_tokens=3))
    assert len(out[0].outputs[0].token_ids) == 3
    core = llm.llm_engine.engine_core
    executor = core.executor
    llm.shutdown()
    assert core.executor is None and core.model_runner is None and executor.runner is None
    executor.shutdown()
