"""The counter-based noise: splitmix64 in numpy and torch int64 equals the unsigned original;
the noise is finite even where the hash is all ones; the two-stage draw follows the distribution."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from pagedlm.sample.gumbel import block_size_for, gumbel_draw
from pagedlm.sample.noise import (
    GOLDEN,
    MIX1,
    MIX2,
    exponential_noise,
    gumbel_noise,
    mix64_,
    mix64_np,
    row_keys_np,
    to_int64,
)

MASK64 = (1 << 64) - 1


def splitmix64_output(z: int) -> int:
    """The reference, on Python ints (unsigned 64-bit)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def test_mix64_matches_unsigned_reference() -> None:
    rng = random.Random(1)
    values = [rng.getrandbits(64) for _ in range(2000)] + [0, 1, MASK64, 1 << 63, (1 << 63) - 1]
    want = [splitmix64_output(v) for v in values]
    got = mix64_(torch.tensor([to_int64(v) for v in values], dtype=torch.int64))
    assert [v & MASK64 for v in got.tolist()] == want
    assert mix64_np(np.array(values, dtype=np.uint64)).tolist() == want


def test_row_keys_are_the_splitmix_stream_of_the_mixed_seed() -> None:
    seeds = [0, 7, MASK64 - 2, (1 << 63) - 1]
    counters = [0, 1, 5, 100]
    got = row_keys_np(np.array(seeds, dtype=np.uint64), np.array(counters)).tolist()
    for key, seed, counter in zip(got, seeds, counters):
        state = (splitmix64_output(seed) + counter * 0x9E3779B97F4A7C15) & MASK64
        assert key & MASK64 == splitmix64_output(state)


def test_noise_element_depends_on_key_and_index_only() -> None:
    keys = torch.tensor([3, -9, 3], dtype=torch.int64)
    noise = exponential_noise(keys, 50)  # [3, 50]
    assert torch.equal(noise[0], noise[2])
    assert torch.equal(exponential_noise(keys[1:2], 20)[0], noise[1, :20])
    assert not torch.equal(noise[0], noise[1])
    # element (i, v) is splitmix64 at state key + (v + 1) * golden, top 23 bits -> -log(u)
    state = (3 + 5 * 0x9E3779B97F4A7C15) & MASK64
    uniform = ((splitmix64_output(state) >> 41) + 0.5) / 2**23
    assert abs(noise[0, 4].item() - (-torch.tensor(uniform).log().item())) < 1e-6


def test_noise_is_exponential() -> None:
    keys = torch.from_numpy(row_keys_np(np.arange(64, dtype=np.uint64), np.zeros(64)))
    noise = exponential_noise(keys, 4096).double()  # 262,144 draws
    assert torch.isfinite(noise).all() and (noise > 0).all()
    assert abs(noise.mean().item() - 1.0) < 0.01
    assert abs(noise.var().item() - 1.0) < 0.03
    # P(E > 1) = e^-1, P(E > 3) = e^-3
    assert abs((noise > 1).double().mean().item() - 0.36788) < 0.004
    assert abs((noise > 3).double().mean().item() - 0.04979) < 0.002


def splitmix64_output_inverse(z: int) -> int:
    """The state whose splitmix64 output is z (each step of the output function is invertible)."""
    for shift, multiplier in ((31, None), (27, MIX2), (30, MIX1)):
        if multiplier is not None:
            z = (z * pow(multiplier, -1, 1 << 64)) & MASK64
        z ^= (z >> shift) ^ (z >> (2 * shift))  # undoes z ^= z >> shift, shift >= 22
    return z


@pytest.mark.parametrize("hash_output", [MASK64, 0, MASK64 >> 23 << 23])
def test_noise_is_finite_at_the_ends_of_the_hash(hash_output: int) -> None:
    """All-ones top bits once gave u = 1 in float32, E = 0 and G = +inf: that entry won the
    draw whatever its logit, even -inf. The key below puts `hash_output` at entry 0."""
    state = splitmix64_output_inverse(hash_output)
    assert splitmix64_output(state) == hash_output
    keys = torch.tensor([to_int64(state - GOLDEN)], dtype=torch.int64)
    noise = exponential_noise(keys, 1)
    assert torch.isfinite(noise).all() and (noise > 0).all()
    assert torch.isfinite(gumbel_noise(keys, 1)).all()


@pytest.mark.parametrize("vocab_size", [1, 7, 64, 300])
def test_draw_follows_the_distribution(vocab_size: int) -> None:
    """Both stages: the block (with a short last block for 7 and 300) and the id inside it;
    ids of probability 0 are never drawn."""
    torch.manual_seed(vocab_size)
    probs = torch.rand(vocab_size) ** 3
    probs[torch.randperm(vocab_size)[: vocab_size // 3]] = 0.0
    probs[0] = 1.0
    num_draws = 200_000
    keys = torch.from_numpy(row_keys_np(np.arange(num_draws, dtype=np.uint64), np.zeros(num_draws)))
    counts = torch.bincount(gumbel_draw(probs.expand(num_draws, -1), keys), minlength=vocab_size)
    want = probs.double() / probs.double().sum()
    assert counts[want == 0].sum() == 0
    expected = num_draws * want[want > 0]
    chi_square = float(((counts[want > 0] - expected) ** 2 / expected).sum())
    df = max(1, int((want > 0).sum()) - 1)
    assert chi_square < df + 6 * (2 * df) ** 0.5, (chi_square, df)
    wrong = torch.roll(want, 1)  # the same values on other ids: must fail the same bound
    if vocab_size > 1:
        assert ((counts - num_draws * wrong) ** 2 / (num_draws * wrong + 1e-9)).sum() > 10 * df


def test_block_size_is_about_sqrt_vocab() -> None:
    vocab_sizes = (1, 2, 7, 64, 65, 49152, 151936)
    assert [block_size_for(v) for v in vocab_sizes] == [1, 2, 4, 8, 16, 256, 512]


def test_draw_depends_on_the_key_only() -> None:
    """Same key, same probabilities: the same id, whatever the other rows."""
    torch.manual_seed(0)
    probs = torch.rand(6, 1000)
    keys = torch.from_numpy(row_keys_np(np.arange(6, dtype=np.uint64), np.arange(6)))
    ids = gumbel_draw(probs, keys)
    assert torch.equal(gumbel_draw(probs[[4, 1]], keys[[4, 1]]), ids[[4, 1]])
    assert len(set(ids.tolist())) > 1
