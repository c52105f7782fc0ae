"""distributed_executor_backend="ray": two Ray actors on this host over gloo give tp = 1's greedy
and seeded tokens; a killed actor ends the engine with WorkerFailed naming its rank."""

from __future__ import annotations

from pathlib import Path

import launched_rank
import pytest

from pagedlm import LLM
from pagedlm.executor.base import WorkerFailed

ray = pytest.importorskip(
    "ray", reason='distributed_executor_backend="ray" needs Ray (pip install "pagedlm[ray]")'
)


@pytest.fixture(scope="module")
def local_ray() -> None:
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=1 << 27, log_to_driver=False)
    yield
    ray.shutdown()


def test_two_ray_actors_give_tp1_tokens_and_a_killed_one_fails_cleanly(
    tiny_llama_dir: Path, local_ray: None
) -> None:
    tp1 = LLM(str(tiny_llama_dir), **launched_rank.ENGINE)
    reference, version = launched_rank.tokens(tp1), tp1.collective_rpc("get_weight_version")
    llm = LLM(
        str(tiny_llama_dir),
        tensor_parallel_size=2,
        distributed_executor_backend="ray",
        **launched_rank.ENGINE,
    )
    try:
        assert launched_rank.tokens(llm) == reference
        assert llm.collective_rpc("get_weight_version") == version  # a call through the actors
        executor = llm.llm_engine.engine_core.executor
        ray.kill(executor._actors[1])
        with pytest.raises(WorkerFailed, match="rank 1 failed"):
            launched_rank.tokens(llm)
        with pytest.raises(WorkerFailed):
            launched_rank.tokens(llm)
    finally:
        llm.shutdown()
