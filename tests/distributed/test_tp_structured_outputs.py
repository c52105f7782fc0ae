"""Structured outputs at tp = 2 (two worker processes, gloo, float32): the engine core fills each
constrained step's bitmask between the forward and sampling broadcasts (MultiprocExecutor), each
rank masks its vocabulary shard; greedy tokens equal tp = 1's, a constrained neighbour does not
change an unconstrained request's tokens."""

from __future__ import annotations

import json

import pytest
import tiny_hf_models

from pagedlm import LLM, SamplingParams
from pagedlm.sampling_params import StructuredOutputsParams

ENGINE = dict(dtype="float32", device="cpu", max_model_len=128, async_scheduling=True)
PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16]]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("llama_tokenizer")
    tiny_hf_models.save_tiny_model_with_tokenizer(path, "llama")
    return str(path)


def _generate(llm: LLM) -> list[list[int]]:
    string = StructuredOutputsParams(json={"type": "string", "minLength": 1000})
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, structured_outputs=string),
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=12, structured_outputs=string),
    ]
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def test_constrained_tokens_at_tp2_equal_tp1(folder: str) -> None:
    reference_llm = LLM(folder, **ENGINE)
    reference = _generate(reference_llm)
    free_alone = reference_llm.generate(
        [{"prompt_token_ids": PROMPTS[1]}],
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
        use_tqdm=False,
    )[0].outputs[0]
    tokenizer = reference_llm.get_tokenizer()
    reference_llm.shutdown()
    assert reference[1] == free_alone.token_ids
    for ids in (reference[0], reference[2]):
        assert len(ids) == 12 and tokenizer.decode(ids).startswith('"')
        with pytest.raises(json.JSONDecodeError):  # an unfinished string: the grammar held it
            json.loads(tokenizer.decode(ids))
    tp_llm = LLM(folder, tensor_parallel_size=2, **ENGINE)
    try:
        assert _generate(tp_llm) == reference
    finally:
        tp_llm.shutdown()
