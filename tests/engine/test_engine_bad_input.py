"""Bad input gets an error whose message names the parameter and the limit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pagedlm import LLM, SamplingParams


def test_missing_model_path(tmp_path: Path) -> None:
    missing = tmp_path / "no_such_model"
    with pytest.raises(ValueError, match=r"model: path .*no_such_model.* does not exist"):
        LLM(str(missing))


def test_unsupported_architecture(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["GPT2LMHeadModel"],
                "model_type": "gpt2",
                "n_embd": 64,
                "n_layer": 2,
                "n_head": 4,
                "vocab_size": 256,
            }
        )
    )
    with pytest.raises(
        ValueError,
        match=r"architecture 'GPT2LMHeadModel' is not supported; "
        r"supported: LlamaForCausalLM",
    ):
        LLM(str(tmp_path))


def test_unknown_llm_keyword_names_it(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) 'max_num_sequences'"):
        LLM(str(tmp_path), max_num_sequences=4)


def test_prompt_over_max_model_len_gives_both_numbers(tiny_llm: LLM) -> None:
    with pytest.raises(
        ValueError, match=r"^prompt 0: prompt has 64 tokens but max_model_len is 64"
    ):
        tiny_llm.generate([[5] * 64], use_tqdm=False)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_tokens=-1), r"max_tokens must be at least 1, got -1"),
        (dict(max_tokens=0), r"max_tokens must be at least 1, got 0"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\], got 0.0"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\], got 1.5"),
        (dict(temperature=-0.1), r"temperature must be non-negative, got -0.1"),
    ],
)
def test_bad_sampling_params(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_sampling_params_checked_against_the_model(tiny_llm: LLM) -> None:
    with pytest.raises(
        ValueError, match=r"^prompt 1: stop_token_ids token ids must be in \[0, 256\)"
    ):
        tiny_llm.generate(
            [[5], [6]], [SamplingParams(), SamplingParams(stop_token_ids=[256])], use_tqdm=False
        )
    with pytest.raises(ValueError, match=r"stop: stop strings need detokenisation"):
        tiny_llm.generate([[5]], SamplingParams(stop=["x"]), use_tqdm=False)
    with pytest.raises(ValueError, match=r"sampling_params: got 1 values for 2 prompts"):
        tiny_llm.generate([[5], [6]], [SamplingParams()], use_tqdm=False)


@pytest.mark.parametrize("salt", ["", 3])
def test_bad_cache_salt_names_it_and_adds_no_request(tiny_llm: LLM, salt: object) -> None:
    prompts = [[5], {"prompt_token_ids": [6], "cache_salt": salt}]
    message = rf"^prompt 1: cache_salt must be a non-empty string or None, got {salt!r}"
    with pytest.raises(ValueError, match=message):
        tiny_llm.generate(prompts, use_tqdm=False)
    assert not tiny_llm.llm_engine.has_unfinished_requests()  # prompt 0 never entered the engine
    assert len(tiny_llm.generate(prompts[:1], SamplingParams(max_tokens=1), use_tqdm=False)) == 1
