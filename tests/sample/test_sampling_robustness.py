"""Sampling and decoding features on the CPU (as tests/worker/test_pipeline_robustness.py for the
pipeline): each test names the defect it pins (BUG: it failed before the fix, for the reason given)
or the path no other test covered (PATH: it passes, and the source mutation named in it makes it
fail)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import tiny_hf_models
import torch

from pagedlm import LLM, SamplingParams
from pagedlm.core.sched_output import EngineCoreOutput
from pagedlm.engine.output_processor import OutputProcessor
from pagedlm.engine.tokenizer import bad_words_token_ids
from pagedlm.sample import SamplingState
from pagedlm.sample.state import Feature


def _ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def _broken_bytes(tokenizer: Any) -> list[int]:
    """'\\n' as a byte-fallback token, then the lead byte of a 3-byte character that never comes:
    with a word token after them, the decoder turns both bytes into U+FFFD, rewriting the '\\n'
    it already emitted, and tokenizers' DecodeStream raises 'Invalid prefix encountered'."""
    return [tokenizer.convert_tokens_to_ids("<0x0A>"), tokenizer.convert_tokens_to_ids("<0xE4>")]


# ---- detokenizer -----------------------------------------------------------------------------


def test_output_with_broken_byte_fallback_bytes_does_not_crash_the_step(
    sentencepiece_tokenizer: Any,
) -> None:
    """BUG (engine/detokenizer.py push: `self._stream.step` unguarded): a Llama-2/Mistral style
    tokenizer (byte fallback) fed '<0x0A> <0xE4> ▁The' makes DecodeStream raise a bare Exception
    out of OutputProcessor.process_outputs, so LLMEngine.step fails for every request of the step
    (LLM.generate aborts all; the server's output loop task dies and every client hangs). vLLM
    catches this error and restarts the stream at the token (vllm issue 17448)."""
    prompt = _ids(sentencepiece_tokenizer, "hello world")
    output = _broken_bytes(sentencepiece_tokenizer) + _ids(sentencepiece_tokenizer, " The end")
    processor = OutputProcessor(sentencepiece_tokenizer)
    processor.add_request("r", None, prompt, SamplingParams(), 1.0, prompt)
    result = processor.process_outputs([EngineCoreOutput("r", output, finish_reason="length")])
    (out,) = result.request_outputs
    assert out.finished and out.outputs[0].token_ids == output
    assert out.outputs[0].text.endswith("The end")


def test_prompt_ending_in_broken_byte_fallback_bytes_is_accepted(
    sentencepiece_tokenizer: Any,
) -> None:
    """BUG (engine/detokenizer.py _prime: the same unguarded `self._stream.step`): a valid
    token-id prompt ending in '<0x0A> <0xE4> ▁The' (no clean suffix to prime with, so the last 4
    tokens are stepped) is refused by add_request with a bare Exception (not a ValueError); beam
    search, which sends every beam back as a token-id prompt, hits it too."""
    prompt = (
        _ids(sentencepiece_tokenizer, "hello")
        + _broken_bytes(sentencepiece_tokenizer)
        + _ids(sentencepiece_tokenizer, " The")
    )
    output = _ids(sentencepiece_tokenizer, "hello the cat sat")[1:]  # ▁the ▁cat ▁sat
    processor = OutputProcessor(sentencepiece_tokenizer)
    processor.add_request("r", None, prompt, SamplingParams(), 1.0, prompt)
    result = processor.process_outputs([EngineCoreOutput("r", output, finish_reason="length")])
    assert result.request_outputs[0].outputs[0].text.endswith("the cat sat")


@pytest.mark.parametrize("stop_kind", ["stop_token_id", "eos_kept_by_skip_special_tokens_false"])
def test_stop_token_text_is_left_out_unless_include_stop_str_in_output(
    byte_level_tokenizer: Any, stop_kind: str
) -> None:
    """BUG (engine/output_processor.py _update_sample: every token, the one the core stopped at
    included, is pushed to the detokenizer): vLLM (V0 StopChecker and V1 detokenizer.update with
    stop_terminated) leaves the text of the token that ended the request by a stop token id or
    EOS out of the output text unless include_stop_str_in_output. Here stop_token_ids=['.'] gives
    ' the cat.' and EOS with skip_special_tokens=False gives ' the cat</s>'."""
    prompt = _ids(byte_level_tokenizer, "Hello")
    body = _ids(byte_level_tokenizer, " the cat")
    if stop_kind == "stop_token_id":
        (stop_id,) = _ids(byte_level_tokenizer, ".")
        kwargs, stop_reason, stop_text = dict(stop_token_ids=[stop_id]), stop_id, "."
    else:
        stop_id = byte_level_tokenizer.eos_token_id
        kwargs, stop_reason, stop_text = dict(skip_special_tokens=False), None, "</s>"
    texts = {}
    for include in (False, True):
        processor = OutputProcessor(byte_level_tokenizer)
        params = SamplingParams(include_stop_str_in_output=include, **kwargs)
        processor.add_request("r", "Hello", prompt, params, 1.0, prompt)
        result = processor.process_outputs(
            [EngineCoreOutput("r", body + [stop_id], finish_reason="stop", stop_reason=stop_reason)]
        )
        completion = result.request_outputs[0].outputs[0]
        assert completion.token_ids == body + [stop_id]  # the ids keep the stop token
        texts[include] = completion.text
    assert texts == {False: " the cat", True: " the cat" + stop_text}


def test_bad_word_with_a_leading_space_is_also_banned_at_the_start_of_the_text(
    byte_level_tokenizer: Any,
) -> None:
    """BUG (engine/tokenizer.py bad_words_token_ids: the first variant is `word`, not
    `word.lstrip()`): vLLM encodes each bad word both as word.lstrip() (text start) and with one
    leading space (mid-text). bad_words=[' cat'] gives only 'Ġcat' here, so an output that starts
    with 'cat' is not banned."""
    assert _ids(byte_level_tokenizer, "cat") != _ids(
        byte_level_tokenizer, " cat"
    )  # the two forms differ
    sequences = bad_words_token_ids(byte_level_tokenizer, [" cat"])
    assert (
        _ids(byte_level_tokenizer, "cat") in sequences
        and _ids(byte_level_tokenizer, " cat") in sequences
    )
    assert bad_words_token_ids(byte_level_tokenizer, ["cat"]) == sequences  # the same word


# ---- sampling state --------------------------------------------------------------------------

VOCAB_SIZE = 16
EOS = 2


@pytest.mark.parametrize("temperature", [1e300, math.inf])
def test_huge_temperature_never_samples_masked_tokens(temperature: float) -> None:
    """BUG (sample/state.py _set_numeric_params stores the temperature in a float32 table:
    1e300 becomes inf; sampler.py unnormalised_probs then computes (-inf - max) / inf = NaN for
    every masked id, and the Gumbel argmax takes the NaN): allowed_token_ids, the min_tokens ban
    on EOS and bad words are all broken, the masked ids being drawn every time. 1e300 is a
    'valid' value for the server (tests/server/test_fuzz.py test_extreme_valid_values). With
    every unmasked id equally likely at such a temperature, the draw must be uniform over them."""
    state = SamplingState(3, VOCAB_SIZE, "cpu", seed=0)
    state.add_request(0, SamplingParams(temperature=temperature, allowed_token_ids=[3, 4]), [1], [])
    state.add_request(
        1,
        SamplingParams(temperature=temperature, min_tokens=20, max_tokens=20),
        [1],
        [],
        eos_token_ids=[EOS],
    )
    state.add_request(
        2, SamplingParams(temperature=temperature, bad_words_token_ids=[[5]]), [1], []
    )
    gen = torch.Generator().manual_seed(0)
    sampled = np.stack(
        [
            state.sample(
                torch.randn(3, VOCAB_SIZE, generator=gen), np.arange(3)
            ).sampled_token_ids.numpy()
            for _ in range(12)
        ]
    )  # [steps, 3]
    assert set(sampled[:, 0]) <= {3, 4}
    assert EOS not in sampled[:, 1] and 5 not in sampled[:, 2]
    assert len(set(sampled[:, 1])) > 3  # uniform over the rest, not one forced id


def test_nan_logit_bias_is_refused() -> None:
    """BUG (sampling_params.py __post_init__: float(v) takes 'nan'): a NaN bias makes that
    token's logit NaN, which argmax and the Gumbel draw both pick, every step: bad input that
    silently forces a token instead of a ValueError naming logit_bias (the server refuses values
    outside [-100, 100]; LLM.generate takes anything)."""
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={3: float("nan")})


@pytest.mark.parametrize("top_k", [VOCAB_SIZE, VOCAB_SIZE + 5])
def test_top_k_at_or_above_the_vocabulary_is_off(top_k: int) -> None:
    """PATH (SamplingState with a top_k >= vocab_size; the server caps it before, no test of the
    state did): the draw follows the full softmax. Mutation that fails it: drop
    `and params.top_k < self.vocab_size` in sample/state.py _set_numeric_params (torch.topk then
    raises for k > V, and k = V takes the top-k path for nothing)."""
    num_rows, num_steps = 500, 8
    logits = torch.linspace(2.0, -2.0, VOCAB_SIZE)
    state = SamplingState(num_rows, VOCAB_SIZE, "cpu", seed=0)
    for row in range(num_rows):
        state.add_request(row, SamplingParams(temperature=0.8, top_k=top_k), [1], [])
    assert not state._flags_np[:, Feature.TOP_K_TOP_P].any()
    rows_np = np.arange(num_rows)
    counts = np.zeros(VOCAB_SIZE)
    for _ in range(num_steps):
        sampled = state.sample(logits.expand(num_rows, -1).clone(), rows_np).sampled_token_ids
        counts += np.bincount(sampled.numpy(), minlength=VOCAB_SIZE)
    expected = num_rows * num_steps * torch.softmax(logits.double() / 0.8, 0).numpy()
    chi_square = float(((counts - expected) ** 2 / expected).sum())
    assert chi_square < 45.0  # df 15: the 1 - 1e-4 quantile is about 42


# ---- through the engine ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    folder = tmp_path_factory.mktemp("tiny_llama_sampling")
    tiny_hf_models.save_tiny_model(folder, "llama")
    return LLM(
        str(folder),
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=64,
        num_gpu_blocks_override=64,
        device="cpu",
    )


def _embeddings(llm: LLM, token_ids: list[int]) -> torch.Tensor:
    model = llm.llm_engine.engine_core.model_runner.model
    with torch.no_grad():
        return model.embed_tokens(torch.tensor(token_ids)).float()  # [num_tokens, hidden_size]


def test_prompt_embeds_request_penalises_no_placeholder_token(tiny_llm: LLM) -> None:
    """BUG (worker/model_runner.py _add_request passes new.prompt_token_ids to
    sampler.add_request; for prompt_embeds those are placeholders, [0] * num_tokens): the
    repetition penalty treats token 0 as a prompt token. A bias of +30 makes 0 the greedy pick:
    the same prompt as ids (without 0) takes it; as embeddings, with repetition_penalty=100,
    its logit is divided by 100 and another token wins. An embeddings prompt has no known ids,
    so nothing may be penalised before the first output (the sampler handles an empty prompt:
    tests/sample/test_sample_processors.py)."""
    prompt = list(range(20, 40))
    params = SamplingParams(
        temperature=0.0,
        max_tokens=1,
        ignore_eos=True,
        repetition_penalty=100.0,
        logit_bias={0: 30.0},
    )
    (from_ids,) = tiny_llm.generate(prompt, params, use_tqdm=False)
    (from_embeds,) = tiny_llm.generate(
        {"prompt_embeds": _embeddings(tiny_llm, prompt)}, params, use_tqdm=False
    )
    assert from_ids.outputs[0].token_ids == [0]
    assert from_embeds.outputs[0].token_ids == [0]
