"""Speculative decoding at tp = 2 (two worker processes over gloo) in float32: every rank samples
and verifies the all-gathered logits of every row itself, so all ranks hold the same tokens,
drafts and sampling state. n-gram and draft-model (the draft replicated whole on each rank):
greedy tokens are plain decoding's, seeded sampled ones tp = 1's with the same speculation, and a
draft equal to the target has every greedy draft accepted."""

from __future__ import annotations

from typing import Any

import pytest
import tiny_hf_models

from pagedlm import LLM, SamplingParams

ENGINE = dict(
    skip_tokenizer_init=True,
    dtype="float32",
    device="cpu",
    max_model_len=128,
    max_num_seqs=8,
    num_gpu_blocks_override=64,
    async_scheduling=True,
)
PROMPTS = [{"prompt_token_ids": ([5, 6, 7, 8] * 6)[: 10 + i]} for i in range(4)]
GREEDY = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
PARAMS = [GREEDY, GREEDY] + [
    SamplingParams(max_tokens=20, temperature=0.8, seed=i, ignore_eos=True) for i in range(2)
]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("llama_spec_tp")
    tiny_hf_models.save_tiny_model(
        folder, "llama", vocab_size=250, config_overrides=dict(num_key_value_heads=1)
    )
    return str(folder)


def _tokens(folder: str, **engine: Any) -> tuple[list[list[int]], list[Any]]:
    llm = LLM(folder, **{**ENGINE, **engine})
    try:
        outputs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    finally:
        llm.shutdown()
    return [o.outputs[0].token_ids for o in outputs], [o.outputs[0] for o in outputs]


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_tp2_speculation_gives_tp1s_tokens(llama_dir: str, method: str) -> None:
    spec: dict[str, Any] = {"method": method, "num_speculative_tokens": 3}
    if method == "ngram":
        spec |= {"prompt_lookup_min": 1, "prompt_lookup_max": 3}
    else:
        spec["model"] = llama_dir  # the target itself: every greedy draft is accepted
    plain, _ = _tokens(llama_dir)
    tp1, _ = _tokens(llama_dir, speculative_config=spec)
    tp2, outputs = _tokens(llama_dir, speculative_config=spec, tensor_parallel_size=2)
    assert tp2 == tp1
    assert tp2[:2] == plain[:2]  # greedy: plain decoding's
    drafted = [o.spec_decode_metrics for o in outputs]
    assert sum(m.num_draft_tokens for m in drafted) > 0
    if method == "draft_model":
        assert all(m.num_accepted_draft_tokens == m.num_draft_tokens for m in drafted[:2])
        assert all(m.num_draft_tokens > 0 for m in drafted[:2])


def test_batch_sharded_sampling_does_not_combine_with_speculation(llama_dir: str) -> None:
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    with pytest.raises(ValueError, match="enable_batch_sharded_sampling does not combine"):
        LLM(
            llama_dir,
            speculative_config=spec,
            tensor_parallel_size=2,
            enable_batch_sharded_sampling=True,
            **ENGINE,
        )
