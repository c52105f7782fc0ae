"""Counter-based random noise: Exp(1) variates from a hash of (seed, step, vocab index).

The noise a request sees depends only on its seed, how many tokens it has sampled and the
vocabulary index, never on the batch around it: a seeded request is reproducible anywhere.
The hash is splitmix64 in torch int64 ops, whose arithmetic wraps (two's complement), as the
unsigned 64-bit original needs; right shifts are made logical by masking the sign fill.
"""
from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def to_int64(value: int) -> int:
    """An arbitrary Python int, wrapped to the signed 64-bit range (two's complement)."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def _shr(x: torch.Tensor, shift: int) -> torch.Tensor:
    """Logical right shift of int64 values."""
    return (x >> shift) & ((1 << (64 - shift)) - 1)


def mix64_(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's output function, in place on an int64 tensor."""
    for shift, multiplier in ((30, to_int64(_MIX1)), (27, to_int64(_MIX2))):
        x ^= _shr(x, shift)
        x *= multiplier
    x ^= _shr(x, 31)
    return x


def row_keys(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """One key per (seed, number of tokens sampled so far): seeds [N], counters [N] -> [N] int64."""
    keys = mix64_(seeds.clone())
    keys += counters * to_int64(_GOLDEN)
    return mix64_(keys)


def exponential_noise(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Exp(1) noise, keys [N] int64 -> [N, vocab_size] float32, element (i, v) a function of
    (keys[i], v) alone: splitmix64's stream from state keys[i], v + 1 steps along."""
    offsets = torch.arange(1, vocab_size + 1, dtype=torch.int64, device=keys.device)
    offsets *= to_int64(_GOLDEN)
    state = keys[:, None] + offsets  # [N, V] int64
    mix64_(state)
    uniform = _shr(state, 40).to(torch.float32)  # [N, V]: the top 24 bits, exact in float32
    uniform.add_(0.5).mul_(2.0**-24)  # in (0, 1): the log below stays finite
    return uniform.log_().neg_()
