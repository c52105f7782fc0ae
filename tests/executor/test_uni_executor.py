"""The in-process executor ("uni", tp = 1): an Executor as MultiprocExecutor is, whose step calls
are the ModelRunner's own bound methods (no call in between on the tp = 1 step path)."""

from __future__ import annotations

import pytest
import tiny_hf_models

from pagedlm import LLM, SamplingParams
from pagedlm.executor.base import Executor
from pagedlm.executor.uni import UniExecutor
from pagedlm.worker.model_runner import ModelRunner

STEP_CALLS = ("execute_forward", "grammar_bitmask", "sample_tokens", "execute_model")


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    folder = tmp_path_factory.mktemp("tiny_llama")
    tiny_hf_models.save_tiny_model(folder, "llama")
    engine = LLM(
        str(folder), skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=64
    )
    yield engine
    engine.shutdown()


def test_uni_is_an_executor_whose_step_calls_are_the_runners_own(llm: LLM) -> None:
    core = llm.llm_engine.engine_core
    executor, runner = core.executor, core.model_runner
    assert isinstance(executor, UniExecutor) and isinstance(executor, Executor)
    assert isinstance(runner, ModelRunner) and executor.runner is runner
    for name in STEP_CALLS:
        call = getattr(executor, name)
        assert call.__self__ is runner and call.__func__ is getattr(ModelRunner, name)
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
    assert not any(hasattr(executor, name) for name in STEP_CALLS)
    executor.shutdown()
