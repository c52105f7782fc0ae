"""Every boundary that validates a request raises InvalidRequest naming the parameter at fault
(`param`, the OpenAI / vLLM name) and, where OpenAI has one, the reason (`code`): a front end maps
it without reading the message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from pagedlm import LLM, BeamSearchParams, SamplingParams
from pagedlm.engine.llm_engine import fit_context
from pagedlm.errors import CONTEXT_LENGTH_EXCEEDED, InvalidRequest

ONE_TOKEN = SamplingParams(max_tokens=1)


def _raised(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        fn(*args, **kwargs)
    return info.value


def _param_code(error: InvalidRequest) -> tuple[str | None, str | None]:
    return error.param, error.code


@pytest.mark.parametrize(
    "kwargs, param",
    [
        (dict(n=0), "n"),
        (dict(n=1.5), "n"),
        (dict(temperature=-0.1), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_k=-2), "top_k"),
        (dict(min_p=1.5), "min_p"),
        (dict(presence_penalty=3.0), "presence_penalty"),
        (dict(frequency_penalty=-3.0), "frequency_penalty"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(min_tokens=-1), "min_tokens"),
        (dict(max_tokens=2, min_tokens=3), "min_tokens"),
        (dict(logprobs=21), "logprobs"),
        (dict(prompt_logprobs=-1), "prompt_logprobs"),
        (dict(stop=5), "stop"),
        (dict(stop=[""]), "stop"),
        (dict(stop_token_ids=[-1]), "stop_token_ids"),
        (dict(seed=1.5), "seed"),
        (dict(logit_bias={"x": 1.0}), "logit_bias"),
        (dict(logit_bias={1: float("nan")}), "logit_bias"),
        (dict(allowed_token_ids=[]), "allowed_token_ids"),
    ],
)
def test_sampling_params_name_the_parameter(kwargs: dict, param: str) -> None:
    error = _raised(SamplingParams, **kwargs)
    assert _param_code(error) == (param, None)
    assert str(error).startswith(param)  # the message is unchanged: it still names it first


def test_vocabulary_check_names_bad_words_not_its_token_ids() -> None:
    params = SamplingParams(bad_words=["x"])
    params.bad_words_token_ids = [[300]]  # what the engine derives from bad_words
    error = _raised(params.check_vocab, 256)
    assert _param_code(error) == ("bad_words", None)
    assert str(error).startswith("bad_words_token_ids token ids must be in [0, 256)")
    assert _raised(SamplingParams(stop_token_ids=[256]).check_vocab, 256).param == "stop_token_ids"


@pytest.mark.parametrize(
    "kwargs, param",
    [
        (dict(beam_width=11, max_tokens=4), "beam_width"),
        (dict(beam_width=2, max_tokens=0), "max_tokens"),
        (dict(beam_width=2, max_tokens=4, temperature=-1.0), "temperature"),
    ],
)
def test_beam_search_params_name_the_parameter(kwargs: dict, param: str) -> None:
    assert _param_code(_raised(BeamSearchParams, **kwargs)) == (param, None)


def test_beam_search_refuses_prompt_embeds(tiny_llm: LLM) -> None:
    embeds = torch.zeros(3, tiny_llm.llm_engine.model_config.hidden_size)
    error = _raised(
        tiny_llm.beam_search,
        [{"prompt_embeds": embeds}],
        BeamSearchParams(beam_width=2, max_tokens=2),
    )
    assert _param_code(error) == ("prompt_embeds", None)


@pytest.mark.parametrize(
    "prompt, param",
    [
        (3, "prompt"),
        ({"prompt_token_ids": [5], "extra": 1}, "prompt"),
        ({"cache_salt": "s"}, "prompt"),
        ("text needs a tokenizer", "prompt"),
        ([5, 300], "prompt"),
        ([5, True], "prompt"),
        ({"prompt_embeds": torch.zeros(3, 10)}, "prompt_embeds"),
        ({"prompt_token_ids": [5], "cache_salt": ""}, "cache_salt"),
    ],
)
def test_process_request_names_the_prompt_field(tiny_llm: LLM, prompt: Any, param: str) -> None:
    error = _raised(tiny_llm.llm_engine.process_request, prompt, ONE_TOKEN)
    assert _param_code(error) == (param, None)


@pytest.mark.parametrize(
    "params, param",
    [
        (SamplingParams(stop=["x"]), "stop"),  # no tokenizer: no detokenisation
        (SamplingParams(bad_words=["x"]), "bad_words"),
        (SamplingParams(logit_bias={256: 1.0}), "logit_bias"),
        ({"max_tokens": 1}, "sampling_params"),
    ],
)
def test_process_request_names_the_sampling_parameter(
    tiny_llm: LLM, params: Any, param: str
) -> None:
    error = _raised(tiny_llm.llm_engine.process_request, [5], params)
    assert _param_code(error) == (param, None)


def test_prompt_logprobs_of_prompt_embeds_are_refused(tiny_llm: LLM) -> None:
    embeds = torch.zeros(3, tiny_llm.llm_engine.model_config.hidden_size)
    error = _raised(
        tiny_llm.llm_engine.process_request,
        {"prompt_embeds": embeds},
        SamplingParams(prompt_logprobs=1),
    )
    assert _param_code(error) == ("prompt_logprobs", None)


def test_prompt_over_the_context_is_context_length_exceeded(tiny_llm: LLM) -> None:
    """max_model_len 64: a prompt may have 63 tokens; an empty one is refused with no code."""
    process = tiny_llm.llm_engine.process_request
    assert process([5] * 63, ONE_TOKEN).max_tokens == 1
    error = _raised(process, [5] * 64, ONE_TOKEN)
    assert _param_code(error) == ("prompt", CONTEXT_LENGTH_EXCEEDED)
    assert "prompt has 64 tokens but max_model_len is 64" in str(error)
    assert _param_code(_raised(process, [], ONE_TOKEN)) == ("prompt", None)


def test_max_tokens_over_the_context_is_cut_or_refused(tiny_llm: LLM) -> None:
    """60 prompt tokens leave room for 4 of max_model_len 64: the offline rule cuts max_tokens to
    4, the server's (reject_over_context) refuses 5 naming max_tokens and both numbers."""
    process = tiny_llm.llm_engine.process_request
    five = SamplingParams(max_tokens=5)
    assert process([5] * 60, five).max_tokens == 4
    for fits in (SamplingParams(max_tokens=4), SamplingParams(max_tokens=None)):
        assert process([5] * 60, fits, reject_over_context=True).max_tokens == 4
    error = _raised(process, [5] * 60, five, reject_over_context=True)
    assert _param_code(error) == ("max_tokens", CONTEXT_LENGTH_EXCEEDED)
    assert str(error) == (
        "This model's maximum context length is 64 tokens (max_model_len), but "
        "65 tokens were requested (60 in the prompt, 5 for the completion). "
        "Reduce the prompt or max_tokens."
    )


@pytest.mark.parametrize(
    "num_prompt_tokens, max_tokens, expected",
    [(1, None, 7), (1, 7, 7), (1, 100, 7), (7, 1, 1), (7, None, 1)],
)
def test_fit_context_gives_the_room_left(
    num_prompt_tokens: int, max_tokens: int | None, expected: int
) -> None:
    assert fit_context(num_prompt_tokens, max_tokens, 8) == expected


def test_add_request_names_request_id_and_priority_and_adds_nothing(tiny_llm: LLM) -> None:
    engine = tiny_llm.llm_engine
    engine.add_request("taken", [5], ONE_TOKEN)
    assert _param_code(_raised(engine.add_request, "taken", [6], ONE_TOKEN)) == ("request_id", None)
    error = _raised(engine.add_request, "bad-priority", [6], ONE_TOKEN, priority=None)
    assert _param_code(error) == ("priority", None)
    finished = {}
    while engine.has_unfinished_requests():
        finished.update((out.request_id, out) for out in engine.step() if out.finished)
    assert set(finished) == {"taken"}


def test_generate_keeps_param_and_code_under_the_prompt_index(tiny_llm: LLM) -> None:
    error = _raised(tiny_llm.generate, [[5], [5] * 64], use_tqdm=False)
    assert _param_code(error) == ("prompt", CONTEXT_LENGTH_EXCEEDED)
    assert str(error).startswith("prompt 1: prompt has 64 tokens")
    error = _raised(tiny_llm.generate, [[5], [6]], [ONE_TOKEN], use_tqdm=False)
    assert _param_code(error) == ("sampling_params", None)
    error = _raised(tiny_llm.generate, [[5], [6]], ONE_TOKEN, use_tqdm=False, priority=[0])
    assert _param_code(error) == ("priority", None)
    assert not tiny_llm.llm_engine.has_unfinished_requests()


def test_bad_words_the_tokenizer_maps_past_the_vocabulary_are_refused(
    tiny_llama_with_tokenizer_dir: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ids bad_words becomes are checked against the model's vocabulary at the boundary (a
    tokenizer may know more ids than the model): not first in the worker, which asserts."""
    import dataclasses

    llm = LLM(
        str(tiny_llama_with_tokenizer_dir),
        dtype="float32",
        device="cpu",
        num_gpu_blocks_override=16,
        max_model_len=64,
    )
    engine = llm.llm_engine
    word_ids = engine.tokenizer.encode(" hello", add_special_tokens=False)
    small = dataclasses.replace(engine.model_config, vocab_size=min(word_ids))
    monkeypatch.setattr(engine, "model_config", small)
    error = _raised(
        engine.process_request, [1, 2, 3], SamplingParams(max_tokens=2, bad_words=["hello"])
    )
    assert _param_code(error) == ("bad_words", None)
