"""Through the engine: bad words (sync and async scheduling), parallel samples sharing the
prompt's KV blocks, and prompt embeddings kept out of the prefix cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_hf_models import FAMILIES

from pagedlm import LLM, SamplingParams

MAX_TOKENS = 6


@pytest.fixture(scope="module")
def long_context_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama shape with room for a 1,000-token prompt."""
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("tiny_llama_long")
    config = FAMILIES["llama"]()
    config.max_position_embeddings = 1536
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    return folder


def _first_ban(greedy: list[int], words: list[list[int]]) -> int:
    """The first position whose greedy token a word bans, given the greedy tokens before it."""
    for k, token_id in enumerate(greedy):
        for word in words:
            prefix = word[:-1]
            if word[-1] == token_id and len(prefix) <= k and greedy[k - len(prefix) : k] == prefix:
                return k
    raise AssertionError("no word bans a greedy token")


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_bad_words_ban_single_and_multi_token_words(
    tiny_llama_dir: Path, async_scheduling: bool
) -> None:
    llm = LLM(
        str(tiny_llama_dir),
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=64,
        num_gpu_blocks_override=64,
        device="cpu",
        async_scheduling=async_scheduling,
    )
    prompt = [5, 6, 7, 8]
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    (base,) = llm.generate(prompt, greedy, use_tqdm=False)
    g = base.outputs[0].token_ids
    cases = [[[g[0]]], [[g[2], g[3]]], [[g[1], g[2], g[3]], [250, 251]]]
    params = [
        SamplingParams(
            temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, bad_words_token_ids=words
        )
        for words in cases
    ]
    outputs = llm.generate([prompt] * (1 + len(cases)), [greedy] + params, use_tqdm=False)
    assert outputs[0].outputs[0].token_ids == g  # a batch-mate's bad words change nothing
    for words, output in zip(cases, outputs[1:]):
        tokens = output.outputs[0].token_ids
        k = _first_ban(g, words)
        assert tokens[:k] == g[:k] and tokens[k] != g[k]


def test_parallel_samples_share_prompt_blocks(long_context_dir: Path) -> None:
    """Measured: KV blocks in use (the scheduler's kv_cache_usage x usable blocks) after every
    step, peak over the prompt step and the first MAX_TOKENS generated tokens; n=8 must stay
    under 1.3x of n=1 (without sharing it would be 8x). The children are admitted in the same
    step as the first sample and take its full prompt blocks from the prefix cache; each
    recomputes its own partial last block (1,000 = 62 x 16 + 8)."""
    llm = LLM(
        str(long_context_dir),
        skip_tokenizer_init=True,
        dtype="float32",
        device="cpu",
        max_model_len=1100,
        num_gpu_blocks_override=600,
    )
    engine = llm.llm_engine
    kv = engine.engine_core.scheduler.kv_cache_manager
    prompt = torch.randint(2, 256, (1000,), generator=torch.Generator().manual_seed(0)).tolist()
    peaks = {}
    for n in (1, 8):
        params = SamplingParams(n=n, seed=0, max_tokens=MAX_TOKENS, ignore_eos=True)
        engine.add_request(f"n{n}", prompt, params)
        peak, first_step = 0, True
        while engine.has_unfinished_requests():
            engine.step()
            peak = max(peak, round(llm.get_stats().kv_cache_usage * kv.pool.num_usable_blocks))
            if first_step and n == 8:
                tables = [kv.get_block_ids(f"n8_{i}") for i in range(n)]
                assert all(table[:62] == tables[0][:62] for table in tables)  # shared, same step
                assert len({table[62] for table in tables}) == n  # own last blocks
            first_step = False
        peaks[n] = peak
    assert peaks[1] == 63
    assert peaks[8] < 1.3 * peaks[1], peaks


def test_parallel_samples_equal_separate_seeded_requests(tiny_llm: LLM) -> None:
    prompt = list(range(10, 50))
    params = SamplingParams(n=4, seed=11, temperature=1.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    (out,) = tiny_llm.generate(prompt, params, use_tqdm=False)
    singles = tiny_llm.generate(
        [prompt] * 4,
        [
            SamplingParams(seed=11 + i, temperature=1.0, max_tokens=MAX_TOKENS, ignore_eos=True)
            for i in range(4)
        ],
        use_tqdm=False,
    )
    assert [c.token_ids for c in out.outputs] == [s.outputs[0].token_ids for s in singles]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1


def test_prompt_embeds_never_share_cached_blocks(tiny_llm: LLM, tiny_llama_dir: Path) -> None:
    """Two embedding prompts of equal length have the same placeholder token ids: a prefix
    cache keyed on token ids would hand the second the first's KV."""
    weights = load_file(str(tiny_llama_dir / "model.safetensors"))["model.embed_tokens.weight"]
    prompts = [list(range(20, 60)), list(range(100, 140))]  # 40 tokens: two full blocks each
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    hits_before = tiny_llm.get_stats().prefix_cache_hits
    from_embeds = [
        tiny_llm.generate({"prompt_embeds": weights[torch.tensor(p)]}, greedy, use_tqdm=False)[0]
        for p in prompts
    ]
    assert tiny_llm.get_stats().prefix_cache_hits == hits_before
    from_ids = tiny_llm.generate(prompts, greedy, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in from_embeds] == [
        o.outputs[0].token_ids for o in from_ids
    ]
    assert from_ids[0].outputs[0].token_ids != from_ids[1].outputs[0].token_ids
