"""LLM.beam_search against transformers' beam search on a tiny random Llama.

Where both define the same search: no EOS (ignore_eos here, eos_token_id=None there). Then
every beam has the same length at every step, so the length penalty (which the two scale
differently: vLLM counts the prompt, transformers does not) never reorders beams, and the two
keep the same beams: transformers takes the global top 2k of (beam score + logprob) and keeps
the best k; each of those is among its own beam's top 2k, which vLLM's rule extends. The final
beams come out in cum_logprob order in both.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from pagedlm import LLM, SamplingParams
from pagedlm.beam_search import BeamSearchParams, beam_search_score

PROMPTS = [[5, 6, 7], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57]]
MAX_TOKENS = 6


def _hf_beams(
    model: torch.nn.Module, prompt: list[int], beam_width: int, length_penalty: float
) -> list[list[int]]:
    config = GenerationConfig(
        do_sample=False,
        num_beams=beam_width,
        num_return_sequences=beam_width,
        max_new_tokens=MAX_TOKENS,
        length_penalty=length_penalty,
        early_stopping=True,
        eos_token_id=None,
        pad_token_id=0,
    )
    model.generation_config = config
    input_ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config
        )
    return out.tolist()


def _cum_logprob(model: torch.nn.Module, tokens: list[int], num_prompt: int) -> float:
    with torch.no_grad():
        logprobs = model(torch.tensor([tokens])).logits[0].log_softmax(dim=-1)
    return sum(logprobs[q - 1, tokens[q]].item() for q in range(num_prompt, len(tokens)))


@pytest.mark.parametrize("beam_width, length_penalty", [(2, 1.0), (4, 0.5)])
def test_beam_search_equals_transformers(
    tiny_llm: LLM, tiny_llama_dir: Path, beam_width: int, length_penalty: float
) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    params = BeamSearchParams(
        beam_width=beam_width, max_tokens=MAX_TOKENS, ignore_eos=True, length_penalty=length_penalty
    )
    outputs = tiny_llm.beam_search([{"prompt_token_ids": p} for p in PROMPTS], params)
    for prompt, output in zip(PROMPTS, outputs):
        expected = _hf_beams(model, prompt, beam_width, length_penalty)
        assert [seq.tokens for seq in output.sequences] == expected
        for seq in output.sequences:
            assert len(seq.logprobs) == MAX_TOKENS and seq.finish_reason == "length"
            assert seq.cum_logprob == pytest.approx(
                _cum_logprob(model, seq.tokens, len(prompt)), abs=1e-4
            )


def test_beam_search_completes_beams_at_eos(tiny_llm: LLM) -> None:
    """With EOS in play, finished beams end in EOS and are scored without it (vLLM)."""
    params = BeamSearchParams(beam_width=3, max_tokens=8, length_penalty=1.0)
    eos = tiny_llm.llm_engine.model_config.eos_token_ids
    prompt = [37, 38, 39]  # one of its best beams ends at EOS
    (output,) = tiny_llm.beam_search([prompt], params)
    scores = [beam_search_score(s.tokens, s.cum_logprob, eos, 1.0) for s in output.sequences]
    assert scores == sorted(scores, reverse=True) and len(scores) == 3
    for seq in output.sequences:
        ends_in_eos = seq.tokens[-1] in eos
        assert seq.finish_reason == ("stop" if ends_in_eos else "length")
        assert all(t not in eos for t in seq.tokens[len(prompt) : -1])
    assert any(seq.finish_reason == "stop" for seq in output.sequences)
    assert beam_search_score([3, 4, 1], -2.0, {1}, 1.0) == -1.0


def test_beam_search_params_are_checked() -> None:
    with pytest.raises(ValueError, match=r"beam_width must be in \[1, 10\]"):
        BeamSearchParams(beam_width=11, max_tokens=4)
    with pytest.raises(ValueError, match=r"max_tokens"):
        BeamSearchParams(beam_width=2, max_tokens=0)


def test_beam_search_steps_keep_the_prompt_cache_salt(tiny_llm: LLM) -> None:
    """Every step's requests carry the prompt's salt: its 2 full blocks hit only with that salt."""
    prompt = list(range(100, 133))  # 2 full blocks of 16, then one token
    params = BeamSearchParams(beam_width=2, max_tokens=2, ignore_eos=True)
    tiny_llm.beam_search([{"prompt_token_ids": prompt, "cache_salt": "beam"}], params)
    one_token = SamplingParams(max_tokens=1)
    hits = {
        salt: tiny_llm.generate(
            {"prompt_token_ids": prompt, "cache_salt": salt}, one_token, use_tqdm=False
        )[0].num_cached_tokens
        for salt in ("beam", None)
    }
    assert hits == {"beam": 32, None: 0}
