"""A hung TP worker (alive but not answering: SIGSTOP) on a gloo tp = 2 engine: after
PAGEDLM_EXECUTE_MODEL_TIMEOUT_SECONDS the engine reports it, naming the rank and the step it
never read, kills every worker (a stopped one would not stop when asked) and refuses later work."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from pagedlm import LLM, SamplingParams
from pagedlm.executor.base import Executor, WorkerFailed

TIMEOUT_S = 2
ENGINE = dict(
    skip_tokenizer_init=True,
    dtype="float32",
    device="cpu",
    max_model_len=64,
    num_gpu_blocks_override=16,
    tensor_parallel_size=2,
)
PROMPT = [{"prompt_token_ids": [5, 6, 7, 8]}]
PARAMS = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def test_a_stopped_worker_is_reported_hung_and_every_worker_killed(
    tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PAGEDLM_EXECUTE_MODEL_TIMEOUT_SECONDS", str(TIMEOUT_S))
    llm = LLM(str(tiny_llama_dir), **ENGINE)
    executor = llm.llm_engine.engine_core.executor
    assert isinstance(executor, Executor)  # the interface the engine core drives
    procs = list(executor._procs)
    try:
        assert len(llm.generate(PROMPT, PARAMS, use_tqdm=False)[0].outputs[0].token_ids) == 4
        os.kill(procs[1].pid, signal.SIGSTOP)
        start = time.monotonic()
        hung = rf"rank 1 \(pid {procs[1].pid}\) stopped answering \(no answer for {TIMEOUT_S} s\)"
        with pytest.raises(WorkerFailed, match=hung + r": it has not read execute_forward of step"):
            llm.generate(PROMPT, PARAMS, use_tqdm=False)
        assert TIMEOUT_S <= time.monotonic() - start < TIMEOUT_S + 10
        assert all(proc.poll() is not None for proc in procs)  # rank 0 too: no orphan
        with pytest.raises(WorkerFailed, match="stopped answering"):
            llm.generate(PROMPT, PARAMS, use_tqdm=False)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        llm.shutdown()
