"""Truncation filters on temperature-scaled logits: min-p, then top-k, then top-p (on the
distribution the earlier filters left, renormalised). A removed token's logit becomes -inf;
rows whose parameters are off (min_p 0, top_k 0, top_p 1) come out unchanged."""
from __future__ import annotations

import torch


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> None:
    """In place. Keep tokens with prob >= min_p * max prob, i.e. logit >= max logit + log(min_p).
    logits [N, V] float32, min_p [N] float32 (0: off, log 0 = -inf keeps everything)."""
    threshold = logits.amax(dim=-1, keepdim=True) + min_p.log()[:, None]  # [N, 1]
    logits.masked_fill_(logits < threshold, float("-inf"))


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                      max_top_k: int | None) -> torch.Tensor:
    """In place. top-k keeps the k largest logits; top-p then keeps the smallest prefix (by
    probability, descending) of what is left whose mass reaches top_p: a token stays iff the
    mass of the tokens ranked above it is < top_p. Tokens tied with the last kept one stay too.
    logits [M, V] float32, top_k [M] int64 (0: off), top_p [M] float32 (1: off).
    max_top_k: the largest k when every row has one (then a top-k replaces the full sort)."""
    vocab_size = logits.shape[-1]
    if max_top_k is None:
        sorted_logits = logits.sort(dim=-1, descending=True).values  # [M, V]
    else:
        sorted_logits = logits.topk(max_top_k, dim=-1).values  # [M, max_top_k], descending
    width = sorted_logits.shape[-1]
    num_top_k = torch.where(top_k > 0, top_k, vocab_size).clamp_(max=width)  # [M]
    ranks = torch.arange(width, device=logits.device)  # [W]
    sorted_logits.masked_fill_(ranks >= num_top_k[:, None], float("-inf"))
    sorted_probs = sorted_logits.softmax(dim=-1)  # [M, W]
    mass_above = sorted_probs.cumsum(dim=-1) - sorted_probs  # [M, W]
    # [M]; at least 1 even when a tiny top_p rounds to 0 in float32
    num_top_p = (mass_above < top_p[:, None]).sum(dim=-1).clamp_(min=1)
    # top_p = 1 is off: rounding in the cumsum must not cut the tail.
    num_kept = torch.where(top_p < 1.0, torch.minimum(num_top_p, num_top_k), num_top_k)  # [M]
    threshold = sorted_logits.gather(1, (num_kept - 1)[:, None])  # [M, 1]
    return logits.masked_fill_(logits < threshold, float("-inf"))
