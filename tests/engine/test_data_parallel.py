"""data_parallel_size = 2 in the offline LLM: two engine cores behind one LLMEngine give dp = 1's
greedy and seeded tokens, both cores take work (queue-length balancing), utilities reach both,
and a core that fails raises out of generate. The server's dp: test_data_parallel_http.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedlm import LLM, SamplingParams
from pagedlm.engine.data_parallel import DataParallelCores

ENGINE = dict(
    skip_tokenizer_init=True,
    dtype="float32",
    device="cpu",
    max_model_len=64,
    num_gpu_blocks_override=32,
)
PROMPTS = [{"prompt_token_ids": list(range(3 + i, 12 + 2 * i))} for i in range(6)]
PARAMS = [SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)] * 3 + [
    SamplingParams(max_tokens=8, temperature=1.0, seed=i, ignore_eos=True) for i in range(3)
]


def _tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]


@pytest.fixture(scope="module")
def dp2(tiny_llama_dir: Path) -> LLM:
    llm = LLM(str(tiny_llama_dir), data_parallel_size=2, **ENGINE)
    yield llm
    llm.shutdown()


def test_two_cores_give_dp1_tokens_and_both_take_work(tiny_llama_dir: Path, dp2: LLM) -> None:
    dp1 = LLM(str(tiny_llama_dir), **ENGINE)
    reference, (version,) = _tokens(dp1), dp1.collective_rpc("get_weight_version")
    cores = dp2.llm_engine.engine_core
    assert isinstance(cores, DataParallelCores) and len(cores.cores) == 2
    assert _tokens(dp2) == reference
    queried = [core.get_stats().prefix_cache_queries for core in cores.cores]
    assert all(q > 0 for q in queried)  # each core prefilled some of the prompts
    assert dp2.get_stats().prefix_cache_queries == sum(queried)
    assert dp2.collective_rpc("get_weight_version") == [version, version]  # one per core
    assert not any(core.has_unfinished_requests() for core in cores.cores) and not cores._owner


def test_a_failing_core_raises_out_of_generate(dp2: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    failing = dp2.llm_engine.engine_core.cores[1]

    def step() -> list:
        raise RuntimeError("core 1 failed")

    monkeypatch.setattr(failing, "step", step)
    with pytest.raises(RuntimeError, match="core 1 failed"):
        _tokens(dp2)
