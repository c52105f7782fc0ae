"""Sampler edges. Logprobs asked beyond a tiny vocabulary: the top-N is clamped to the vocabulary
(vLLM returns every token then), the rest of the request unchanged. The fused Triton draw at a
temperature near 1e-5: l / T in float32 would round near-tied logits (steps of 1.0 at 8e6); the
kernels divide only offsets from a max, so draws follow float64 softmax(l / T), which a float32
reference of the old math fails. The kernels run in the Triton interpreter (tests/conftest.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tiny_hf_models import save_tiny_model

from pagedlm import LLM, SamplingParams
from pagedlm.sample.gumbel import block_size_for
from pagedlm.sample.noise import gumbel_noise, row_keys_np
from pagedlm.sample.sampler import gather_logprobs
from pagedlm.sample.triton_draw import fused_gumbel_draw

# An all-banned block's log-mass is log(0) = -inf by design; numpy (the interpreter) warns about it.
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")

TINY_VOCAB = 12  # logprobs of up to MAX_LOGPROBS = 20 can exceed it


def test_gather_logprobs_clamps_the_top_to_the_vocabulary() -> None:
    raw = torch.randn(3, 5, generator=torch.Generator().manual_seed(0)).log_softmax(dim=-1)
    sampled = torch.tensor([4, 0, 2])
    for num_logprobs in (5, 9):
        token_ids, logprobs, ranks = gather_logprobs(raw, sampled, num_logprobs)
        assert token_ids.shape == logprobs.shape == (3, 6)
        assert torch.equal(token_ids[:, 0], sampled)
        order = raw.argsort(dim=-1, descending=True)  # [3, 5]
        assert torch.equal(token_ids[:, 1:], order)
        assert torch.equal(logprobs, raw.gather(1, token_ids))
        assert torch.equal(ranks, (order == sampled[:, None]).int().argmax(dim=-1) + 1)


@pytest.fixture(scope="module")
def tiny_vocab_llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    folder = tmp_path_factory.mktemp("tiny_vocab_llama")
    save_tiny_model(folder, "llama", vocab_size=TINY_VOCAB)
    return LLM(
        str(folder),
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=64,
        num_gpu_blocks_override=16,
        device="cpu",
    )


def _batch(num_logprobs: int | None) -> list[SamplingParams]:
    """A seeded random request asking num_logprobs (sampled and prompt), a greedy one asking 2,
    one asking none."""
    return [
        SamplingParams(
            temperature=0.8,
            seed=5,
            max_tokens=5,
            ignore_eos=True,
            logprobs=num_logprobs,
            prompt_logprobs=num_logprobs,
        ),
        SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0.9, seed=6, max_tokens=5, ignore_eos=True),
    ]


def _check_whole_vocabulary(entry: dict, token_id: int) -> None:
    """One position's entry of a request that asked for at least the vocabulary."""
    assert len(entry) == TINY_VOCAB and token_id in entry
    assert sorted(lp.rank for lp in entry.values()) == list(range(1, TINY_VOCAB + 1))
    assert sum(math.exp(lp.logprob) for lp in entry.values()) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("num_logprobs", [TINY_VOCAB, TINY_VOCAB + 5])
def test_logprobs_beyond_a_tiny_vocabulary(tiny_vocab_llm: LLM, num_logprobs: int) -> None:
    prompts = [[2, 7, 3, 11, 5], [4, 4, 9], [10, 1, 6, 8]]
    plain = tiny_vocab_llm.generate(prompts, _batch(None), use_tqdm=False)
    asked = tiny_vocab_llm.generate(prompts, _batch(num_logprobs), use_tqdm=False)
    reference = tiny_vocab_llm.generate(prompts, _batch(1), use_tqdm=False)  # a width that works
    assert [out.outputs[0].token_ids for out in asked] == [
        out.outputs[0].token_ids for out in reference
    ]
    assert [out.outputs[0].token_ids for out in asked] == [
        out.outputs[0].token_ids for out in plain
    ]
    completion = asked[0].outputs[0]
    assert len(completion.logprobs) == len(completion.token_ids) == 5
    for token_id, entry, ref_entry in zip(
        completion.token_ids, completion.logprobs, reference[0].outputs[0].logprobs
    ):
        _check_whole_vocabulary(entry, token_id)
        assert entry[token_id] == ref_entry[token_id]
    assert completion.cumulative_logprob == pytest.approx(
        reference[0].outputs[0].cumulative_logprob
    )
    prompt_logprobs = asked[0].prompt_logprobs
    assert len(prompt_logprobs) == len(prompts[0]) and prompt_logprobs[0] is None
    for token_id, entry in zip(prompts[0][1:], prompt_logprobs[1:]):
        _check_whole_vocabulary(entry, token_id)
    assert all(1 <= len(entry) <= 3 for entry in asked[1].outputs[0].logprobs)  # asked 2
    assert asked[2].outputs[0].logprobs is None and asked[2].prompt_logprobs is None


# Two near-tied tokens a, b at T = 1.1e-5: b is the float32 successor of l_a = 92.3223, whose
# step (7.63e-6) over T is 0.6936, so p_b / p_a = 2.001 in float64. In float32, l / T = 8.39e6 (steps
# of 1.0) rounds both to one value: the old math (l / T first) draws them 1:1. Every other id is
# banned or 0.5 below (weight e^-45000). Layouts: V = 16, B = 4; a and b in one block (stage 2
# decides) or in blocks 0 and 2 (stage 1 decides).
NEAR_TIE_T = 1.1e-5
NEAR_TIE_LOGIT = 92.3223
LAYOUTS = ((5, 6), (1, 10))  # (id of a, id of b)
NUM_DRAWS = 320  # 30 ms to 0.1 s a draw in the interpreter
Z_BOUND = 4.0  # two-sided, 6e-5


def near_tie_rows(num_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows alternating the two layouts -> logits [N, 16], ids of a [N], ids of b [N]."""
    logits = torch.full((num_rows, 16), NEAR_TIE_LOGIT - 0.5)
    logits[:, 12:] = float("-inf")
    logits[:, 3] = float("-inf")
    layout = torch.tensor(LAYOUTS)[torch.arange(num_rows) % len(LAYOUTS)]  # [N, 2]
    logit_a = torch.tensor(NEAR_TIE_LOGIT)
    logits.scatter_(1, layout[:, :1], logit_a.item())
    logits.scatter_(1, layout[:, 1:], torch.nextafter(logit_a, torch.tensor(math.inf)).item())
    return logits, layout[:, 0], layout[:, 1]


def two_stage_draw(scaled: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gumbel-max over the blocks of scaled logits [N, V] in their dtype (the old kernels' math in
    float32, the exact one in float64) with the kernels' noise -> (ids [N], score margin [N]:
    the smaller of the two stages' gaps between the best and second-best score)."""
    num_rows, vocab_size = scaled.shape
    block_size = block_size_for(vocab_size)
    num_blocks = -(-vocab_size // block_size)
    noise = gumbel_noise(keys, num_blocks + block_size).to(scaled.dtype)  # [N, num_blocks + B]
    padded = torch.full((num_rows, num_blocks * block_size), float("-inf"), dtype=scaled.dtype)
    padded[:, :vocab_size] = scaled
    blocks = padded.view(num_rows, num_blocks, block_size)
    block_max = blocks.amax(dim=-1, keepdim=True)  # [N, num_blocks, 1]
    block_max = block_max.masked_fill(block_max == float("-inf"), 0.0)
    logmass = block_max.squeeze(-1) + (blocks - block_max).exp().sum(dim=-1).log()
    block_scores = logmass - logmass.amax(dim=-1, keepdim=True) + noise[:, :num_blocks]
    block = block_scores.argmax(dim=-1)  # [N]
    members = blocks[torch.arange(num_rows), block]  # [N, B]
    scores = members - members.amax(dim=-1, keepdim=True) + noise[:, num_blocks:]
    margin = torch.minimum(
        *(s.topk(2, dim=-1).values.diff(dim=-1).neg().squeeze(-1) for s in (block_scores, scores))
    )
    return block * block_size + scores.argmax(dim=-1), margin


def binomial_z(count: int, num_draws: int, prob: float) -> float:
    return (count - num_draws * prob) / math.sqrt(num_draws * prob * (1.0 - prob))


@pytest.mark.slow
def test_near_tie_at_tiny_temperature_follows_float64() -> None:
    logits, ids_a, ids_b = near_tie_rows(NUM_DRAWS)
    temperature = torch.full((NUM_DRAWS,), NEAR_TIE_T)
    keys = torch.from_numpy(row_keys_np(np.arange(NUM_DRAWS, dtype=np.uint64), np.zeros(NUM_DRAWS)))
    ids = fused_gumbel_draw(logits, temperature, keys)
    exact_ids, margin = two_stage_draw(logits.double() / temperature.double()[:, None], keys)
    old_ids, _ = two_stage_draw(logits / temperature[:, None], keys)

    assert float(logits[0, ids_a[0]] / NEAR_TIE_T) == float(logits[0, ids_b[0]] / NEAR_TIE_T)
    assert ((ids == ids_a) | (ids == ids_b)).all()
    decided = margin > 1e-3  # float64 near-ties may go either way
    assert int(decided.sum()) >= NUM_DRAWS - 2
    assert torch.equal(ids[decided], exact_ids[decided])
    for layout in range(len(LAYOUTS)):  # each stage decides some draws the old math gets wrong
        assert (old_ids != exact_ids)[layout :: len(LAYOUTS)].sum() >= 5

    gap = (logits[0, ids_b[0]].double() - logits[0, ids_a[0]].double()) / temperature[0].double()
    prob_b = float(torch.sigmoid(gap))  # float64, from the float32 logits and temperature
    assert prob_b == pytest.approx(2 / 3, abs=1e-3)
    assert abs(binomial_z(int((ids == ids_b).sum()), NUM_DRAWS, prob_b)) < Z_BOUND
    assert abs(binomial_z(int((old_ids == ids_b).sum()), NUM_DRAWS, prob_b)) > Z_BOUND


def test_random_near_ties_at_tiny_temperatures_follow_float64() -> None:
    """Rows of V = 300 (B = 32, 10 blocks) at T = 1e-5, 3e-5, 1e-4 (in turn) with logits
    60 + T N(0, 1), ~20% banned: each draw is float64's Gumbel-max (up to near-ties), and the old
    math misses some."""
    num_rows, vocab_size = 36, 300
    gen = torch.Generator().manual_seed(0)
    temperatures = torch.tensor([1e-5, 3e-5, 1e-4]).repeat(num_rows // 3)  # [N]
    logits = 60.0 + temperatures[:, None] * torch.randn(num_rows, vocab_size, generator=gen)
    logits.masked_fill_(torch.rand(num_rows, vocab_size, generator=gen) < 0.2, float("-inf"))
    keys = torch.randint(-(2**63), 2**63 - 1, (num_rows,), dtype=torch.int64, generator=gen)
    ids = fused_gumbel_draw(logits, temperatures, keys)
    exact_ids, margin = two_stage_draw(logits.double() / temperatures.double()[:, None], keys)
    old_ids, _ = two_stage_draw(logits / temperatures[:, None], keys)
    decided = margin > 1e-3
    assert int(decided.sum()) >= num_rows - 1
    assert torch.equal(ids[decided], exact_ids[decided])
    assert int((old_ids != exact_ids).sum()) >= 2
