"""The n-gram proposer as fixed-shape torch ops over a device token table (vLLM's ngram_gpu idea):
the same drafts as ngram.py's host version, with no host sync, so that with async scheduling the
drafts of step N can come from step N's sampled tokens while the host plans step N + 1.

Cost: max_n elementwise passes over [B, W] (compare, and, add) and one max: on the device a few
passes over 4 bytes a token, against the host version's one pass plus the candidates.
"""

from __future__ import annotations

import torch

from pagedlm.spec_decode.ngram import NO_DRAFT


def propose_ngram_device(
    table: torch.Tensor, lengths: torch.Tensor, k: int, min_n: int, max_n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """table [B, W] int (each request's tokens, anything past its length), lengths [B] int64 ->
    drafts [B, k] int64 (NO_DRAFT where none) and num_drafts [B] int64 (k or 0)."""
    batch, width = table.shape
    ends = torch.arange(width, device=table.device)  # [W]: candidate end positions e
    last = lengths.clamp(min=1) - 1  # [B]
    before_last = ends[None, :] < last[:, None]  # [B, W]: e <= length - 2
    matched = torch.zeros_like(table, dtype=torch.int64)  # [B, W]
    alive = before_last
    for back in range(max_n):
        suffix_at = (last - back).clamp(min=0)[:, None]  # [B, 1]
        suffix_token = table.gather(1, suffix_at)  # [B, 1]
        shifted = torch.nn.functional.pad(table, (back, 0), value=-1)[:, :width]  # [B, W]
        alive = alive & (shifted == suffix_token) & (ends[None, :] >= back)
        matched += alive
    score = torch.where(matched >= min_n, matched * (width + 1) + ends[None, :], -1)  # [B, W]
    best = score.amax(dim=1)  # [B]
    found = best >= 0
    end = best.remainder(width + 1)  # [B]
    distance = (last - end).clamp(min=1)  # [B]
    offsets = torch.arange(k, device=table.device)[None, :] % distance[:, None]  # [B, k]
    source = torch.where(found[:, None], end[:, None] + 1 + offsets, 0).clamp(max=width - 1)
    drafts = torch.where(found[:, None], table.gather(1, source).to(torch.int64), NO_DRAFT)
    return drafts, torch.where(found, k, 0)
