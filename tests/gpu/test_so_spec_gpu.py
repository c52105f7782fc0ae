"""Structured outputs with speculative decoding on CUDA (float32, Triton attention and mask): a
tiny random Llama with a byte-level tokenizer, n-gram drafts from a repetitive prompt, a regex
constraint beside an unconstrained request. Greedy tokens equal the run without speculation
(the mask at every verify position), the constrained outputs match the regex, drafts verified."""

from __future__ import annotations

import re

import pytest
from tiny_hf_models import save_tiny_model_with_tokenizer

from pagedlm import LLM, SamplingParams
from pagedlm.sampling_params import StructuredOutputsParams

pytestmark = pytest.mark.gpu
REGEX = "[ab]{12,40}"
PROMPTS = ["abababababababab", "ab ab ab ab ab ab", "free text here: "]
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
        "prompt_lookup_max": 3}  # fmt: skip


def _run(folder, **engine) -> list:
    llm = LLM(str(folder), device="cuda", dtype="float32", max_model_len=128, **engine)
    constrained = StructuredOutputsParams(regex=REGEX)
    params = [
        SamplingParams(temperature=0, max_tokens=24, structured_outputs=c)
        for c in (constrained, constrained, None)
    ]
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    llm.shutdown()
    return [o.outputs[0] for o in outputs]


def test_constrained_speculation_on_cuda_equals_plain(tmp_path) -> None:
    save_tiny_model_with_tokenizer(tmp_path)
    plain = _run(tmp_path)
    spec = _run(tmp_path, speculative_config=SPEC)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    for out in spec[:2]:
        assert re.fullmatch(REGEX, out.text), out.text
    assert sum(o.spec_decode_metrics.num_draft_tokens for o in spec[:2]) > 0
