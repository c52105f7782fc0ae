"""Random draw from unnormalised probabilities in two Gumbel-max stages, with noise for about
2 sqrt(V) entries of a row instead of V.

The vocabulary is cut into blocks of B ids (B the power of two at or above sqrt(V); the last
block may be shorter). Stage 1 picks a block with probability mass / total: the argmax over
blocks of log(mass) + G. Stage 2 picks an id of that block with probability p / mass: the argmax
of log(p) + G' over its B entries. P(id) = mass / total * p / mass = p / total: exact, up to the
float32 rounding of the block sums. G and G' are one noise row per (seed, step) (noise.py):
entries [0, num_blocks) for stage 1, the next B for stage 2. Stage 2 uses the same G' whichever
block stage 1 picks; that is fine, G' being independent of G.
The only pass over [N, V] is the block sums (one read); the rest is [N, num_blocks + B].
"""

from __future__ import annotations

import math

import torch

from pagedlm.sample.noise import gumbel_noise


def block_size_for(vocab_size: int) -> int:
    """The power of two at or above sqrt(vocab_size): at most vocab_size for vocab_size >= 1."""
    return 1 << math.ceil(math.log2(math.sqrt(vocab_size)))


def gumbel_draw(probs: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """probs [N, V] float32 >= 0, unnormalised, each row with positive mass (0: excluded);
    keys [N] int64 -> sampled ids [N] int64."""
    vocab_size = probs.shape[-1]
    block_size = block_size_for(vocab_size)
    num_blocks = -(-vocab_size // block_size)
    noise = gumbel_noise(keys, num_blocks + block_size)  # [N, num_blocks + B]
    block_scores = _block_masses(probs, block_size).log_().add_(noise[:, :num_blocks])
    block = block_scores.argmax(dim=-1, keepdim=True)  # [N, 1]
    ids = block * block_size + torch.arange(block_size, device=probs.device)  # [N, B]
    scores = probs.gather(1, ids.clamp(max=vocab_size - 1)).log_()  # [N, B]
    scores.masked_fill_(ids >= vocab_size, float("-inf")).add_(noise[:, num_blocks:])
    return ids.gather(1, scores.argmax(dim=-1, keepdim=True)).squeeze(1)


def _block_masses(probs: torch.Tensor, block_size: int) -> torch.Tensor:
    """probs [N, V] -> the sums of its blocks of block_size columns, [N, ceil(V / block_size)]."""
    num_rows, vocab_size = probs.shape
    num_full = vocab_size // block_size
    full_width = num_full * block_size
    masses = probs[:, :full_width].reshape(num_rows, num_full, block_size).sum(dim=-1)
    if full_width == vocab_size:
        return masses
    return torch.cat([masses, probs[:, full_width:].sum(dim=-1, keepdim=True)], dim=1)
