"""The counter-based noise: splitmix64 in numpy, torch int64 and Triton equals the unsigned
original; the fused Triton draw (interpreted on CPU) equals the torch one."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from pagedlm.sample.gumbel import gumbel_argmax_torch, gumbel_argmax_triton
from pagedlm.sample.noise import exponential_noise, mix64_, mix64_np, row_keys_np, to_int64

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
    # element (i, v) is splitmix64 at state key + (v + 1) * golden, top 24 bits -> -log(u)
    state = (3 + 5 * 0x9E3779B97F4A7C15) & MASK64
    uniform = ((splitmix64_output(state) >> 40) + 0.5) / 2**24
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


@pytest.mark.parametrize("vocab_size", [7, 2048, 5000])
def test_triton_draw_equals_torch_draw(vocab_size: int) -> None:
    """The fused kernel (interpreted here, compiled on CUDA) against the torch path."""
    torch.manual_seed(vocab_size)
    num_rows = 5
    keys = torch.from_numpy(row_keys_np(np.arange(num_rows, dtype=np.uint64) * 977, np.arange(num_rows)))
    logits = torch.randn(num_rows, vocab_size) * 2
    logits[1, : vocab_size // 2] = float("-inf")  # excluded tokens, whole blocks of them too
    want = gumbel_argmax_torch(logits.clone(), keys)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    got = gumbel_argmax_triton(logits.to(device), keys.to(device)).cpu()
    assert torch.equal(got, want)
    assert got[1] >= vocab_size // 2


def test_torch_draw_follows_the_softmax() -> None:
    """argmax(logits + Gumbel) over many keys hits each token with its softmax probability."""
    logits = torch.tensor([1.0, 0.0, -1.0, float("-inf")])
    keys = torch.from_numpy(row_keys_np(np.arange(40000, dtype=np.uint64), np.zeros(40000)))
    counts = torch.bincount(gumbel_argmax_torch(logits.expand(40000, -1), keys), minlength=4)
    assert counts[3] == 0
    assert torch.allclose(counts[:3] / 40000.0, logits[:3].softmax(dim=-1), atol=0.01)
