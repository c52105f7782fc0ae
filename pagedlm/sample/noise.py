"""Counter-based random noise: a hash of (seed, tokens sampled so far, vocab index).

The noise a request sees depends only on its seed, how many tokens it has sampled and the
vocabulary index, never on the batch around it: a seeded request is reproducible anywhere.
The hash is splitmix64. The host turns (seed, counter) into one key per row (numpy uint64);
element (row, v) is splitmix64's output at state key + (v + 1) * golden, whose top 23 bits k
give u = (k + 0.5) / 2^23 in (0, 1), E = -log(u) ~ Exp(1) and G = -log(E) ~ Gumbel. (With 24
bits, k + 0.5 rounds to 2^24 in float32 for the top k: u = 1, G = +inf, and that element would
win whatever its logit.) The torch version works on int64, whose arithmetic wraps (two's
complement) as the unsigned original needs; right shifts are made logical by masking the sign
fill. The draw (gumbel.py) needs noise for about 2 sqrt(V) elements per row, not V.
"""

from __future__ import annotations

import numpy as np
import torch

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
UNIFORM_BITS = 23  # k + 0.5 exact in float32 for every k < 2^23: u < 1


def to_int64(value: int) -> int:
    """An arbitrary Python int, wrapped to the signed 64-bit range (two's complement)."""
    value &= MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def mix64_np(x: np.ndarray) -> np.ndarray:
    """splitmix64's output function on uint64 arrays (numpy array arithmetic wraps)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(MIX1)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(MIX2)
    return x ^ (x >> np.uint64(31))


def row_keys_np(seeds_np: np.ndarray, counters_np: np.ndarray) -> np.ndarray:
    """One key per (seed, tokens sampled so far): seeds [N] uint64, counters [N] -> [N] int64."""
    state = mix64_np(seeds_np.astype(np.uint64)) + counters_np.astype(np.uint64) * np.uint64(GOLDEN)
    return mix64_np(state).view(np.int64)


def _shr(x: torch.Tensor, shift: int) -> torch.Tensor:
    """Logical right shift of int64 values."""
    return (x >> shift) & ((1 << (64 - shift)) - 1)


def mix64_(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's output function, in place on an int64 tensor."""
    for shift, multiplier in ((30, to_int64(MIX1)), (27, to_int64(MIX2))):
        x ^= _shr(x, shift)
        x *= multiplier
    x ^= _shr(x, 31)
    return x


def exponential_noise(keys: torch.Tensor, width: int) -> torch.Tensor:
    """E ~ Exp(1): keys [N] int64 -> [N, width] float32, element (i, v) a function of
    (keys[i], v) alone."""
    offsets = torch.arange(1, width + 1, dtype=torch.int64, device=keys.device)
    offsets *= to_int64(GOLDEN)
    state = keys[:, None] + offsets  # [N, width] int64
    mix64_(state)
    uniform = _shr(state, 64 - UNIFORM_BITS).to(torch.float32)  # [N, width], exact in float32
    uniform.add_(0.5).mul_(2.0**-UNIFORM_BITS)  # in (0, 1): the logs stay finite
    return uniform.log_().neg_()


def gumbel_noise(keys: torch.Tensor, width: int) -> torch.Tensor:
    """G = -log(E) ~ Gumbel(0, 1): keys [N] int64 -> [N, width] float32, finite."""
    return exponential_noise(keys, width).log_().neg_()
