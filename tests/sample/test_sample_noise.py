"""The counter-based noise: splitmix64 in int64 torch ops equals the unsigned original."""
from __future__ import annotations

import random

import torch

from pagedlm.sample.noise import exponential_noise, mix64_, row_keys, to_int64

MASK64 = (1 << 64) - 1


def splitmix64_output(z: int) -> int:
    """The reference, on Python ints (unsigned 64-bit)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def test_mix64_matches_unsigned_reference() -> None:
    rng = random.Random(1)
    values = [rng.getrandbits(64) for _ in range(2000)] + [0, 1, MASK64, 1 << 63, (1 << 63) - 1]
    got = mix64_(torch.tensor([to_int64(v) for v in values], dtype=torch.int64))
    assert [v & MASK64 for v in got.tolist()] == [splitmix64_output(v) for v in values]


def test_row_keys_are_the_splitmix_stream_of_the_mixed_seed() -> None:
    seeds = [0, 7, -3, (1 << 63) - 1]
    counters = [0, 1, 5, 100]
    got = row_keys(torch.tensor(seeds), torch.tensor(counters)).tolist()
    for key, seed, counter in zip(got, seeds, counters):
        state = (splitmix64_output(seed & MASK64) + counter * 0x9E3779B97F4A7C15) & MASK64
        assert key & MASK64 == splitmix64_output(state)


def test_noise_element_depends_on_key_and_index_only() -> None:
    keys = torch.tensor([3, -9, 3], dtype=torch.int64)
    noise = exponential_noise(keys, 50)  # [3, 50]
    assert torch.equal(noise[0], noise[2])
    assert torch.equal(exponential_noise(keys[1:2], 20)[0], noise[1, :20])
    assert not torch.equal(noise[0], noise[1])
    # element (i, v) is splitmix64 at state key + (v + 1) * golden, top 24 bits -> -log(u)
    state = (3 + 5 * 0x9E3779B97F4A7C15) & MASK64
    uniform = ((splitmix64_output(state) >> 40) + 0.5) / 2**24
    assert abs(noise[0, 4].item() - (-torch.tensor(uniform).log().item())) < 1e-6


def test_noise_is_exponential() -> None:
    keys = row_keys(torch.arange(64, dtype=torch.int64), torch.zeros(64, dtype=torch.int64))
    noise = exponential_noise(keys, 4096).double()  # 262,144 draws
    assert torch.isfinite(noise).all() and (noise > 0).all()
    assert abs(noise.mean().item() - 1.0) < 0.01
    assert abs(noise.var().item() - 1.0) < 0.03
    # P(E > 1) = e^-1, P(E > 3) = e^-3
    assert abs((noise > 1).double().mean().item() - 0.36788) < 0.004
    assert abs((noise > 3).double().mean().item() - 0.04979) < 0.002
