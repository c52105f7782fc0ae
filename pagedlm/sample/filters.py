"""Truncation filters as thresholds on unnormalised probabilities p = exp((logit - max) / T),
so that the top id has p = 1: min-p, then top-k, then top-p on the distribution the earlier
filters left, renormalised. Each keeps the ids with p >= a per-row value, so together they are
one threshold, which `truncate` applies once. Ids tied with the last kept value stay.

No sort of the vocabulary:
- when every row has a top-k <= TOP_K_LIMIT, the max-k largest values (topk) give both the k-th
  value and the top-p cut;
- otherwise a radix select finds the value where a cumulative sum of weights taken from the
  top value down reaches a target (weight 1 and target k for top-k; weight p and target
  top_p * mass for top-p). Non-negative float32 values order as their int32 bit patterns, so
  the value is found a group of bits at a time, from the top: a weighted histogram over the
  group finds the bin where the cumulative sum reaches the target, the next group is looked
  at inside that bin only. For V of 49k or 152k: two histogram passes over [M, V] of 2^15 bins,
  whatever the distribution (a flat one puts tens of thousands of ids in the top-p set, where
  no top-k pre-cut helps).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TOP_K_LIMIT = 1024  # the largest k taken by torch.topk; beyond, the radix select
_ONE_BITS = 0x3F800000  # float32 1.0, the largest value
_KEY_BITS = 30  # keys _ONE_BITS - bits of values in [0, 1] lie in [0, 2^30)
_MAX_LEVEL_BITS = 15  # histograms of at most 2^15 bins: two levels, each smaller than a
# 49k or 152k vocabulary; a small vocabulary takes more levels of fewer bins
_CHUNK = 128  # bins per chunk when searching a histogram's cumulative sum


@dataclass(slots=True)
class TopKTopP:
    index: torch.Tensor | None  # [M] int64: positions in the batch; None: all rows
    top_k: torch.Tensor  # [M] int64, 0: off
    top_p: torch.Tensor  # [M] float32, 1: off
    max_top_k: int  # the largest k of the rows; 0: no row has a top-k
    every_row_top_k: bool  # every row has a top-k
    any_top_p: bool  # some row has top_p < 1


def truncate(probs: torch.Tensor, threshold: torch.Tensor) -> None:
    """In place: probs [N, V] below threshold [N] become 0."""
    probs.mul_(probs >= threshold[:, None])


def top_k_top_p_threshold(
    probs: torch.Tensor, floor: torch.Tensor | None, params: TopKTopP
) -> torch.Tensor:
    """probs [M, V] in [0, 1] (top value 1), floor [M] (min-p; None: 0) -> [M]: top-k and top-p
    keep the ids with probs >= it."""
    top = None
    if 0 < params.max_top_k <= TOP_K_LIMIT:
        top = probs.topk(params.max_top_k, dim=-1).values  # [M, K], descending
        if params.every_row_top_k:
            return _threshold_from_top(top, floor, params.top_k, params.top_p)
    threshold = floor
    if params.max_top_k > 0:
        kth = _top_k_value(probs, params.top_k, top)
        threshold = kth if floor is None else torch.maximum(floor, kth)
    if not params.any_top_p:
        return threshold
    weights = probs if threshold is None else torch.where(probs >= threshold[:, None], probs, 0.0)
    nucleus = radix_select(probs, weights, params.top_p)
    if threshold is None:
        return torch.where(params.top_p < 1.0, nucleus, 0.0)
    # never under min-p or top-k: with top_p within rounding of 1 the search may end below the values
    # it counted (a level's sums in another order fall a few ulps short of the target)
    return torch.where(params.top_p < 1.0, torch.maximum(nucleus, threshold), threshold)


def radix_select(
    values: torch.Tensor,
    weights: torch.Tensor,
    fraction: torch.Tensor | float,
    at_most: torch.Tensor | None = None,
) -> torch.Tensor:
    """The largest v with sum(weights[values >= v]) >= target = min(fraction * sum(weights),
    at_most): one of the values, of positive weight. values [M, V] float32 in [0, 1];
    weights [M, V] float32 >= 0 (broadcast); fraction [M] or a float in [0, 1]; at_most [M]."""
    num_rows = values.shape[0]
    bits = values.view(torch.int32)  # [M, V], ordered as the values
    level_keys = torch.empty_like(bits)  # [M, V]
    level_bits = min(_MAX_LEVEL_BITS, max(1, values.shape[-1] - 1).bit_length())
    buffer = torch.empty(num_rows << level_bits, device=values.device)  # every level's histogram
    # [M, 1] int32: the key (_ONE_BITS - bits: 0 for the value 1, growing as the value falls)
    # whose bits above the current level are found so far
    found = torch.zeros((num_rows, 1), dtype=torch.int32, device=values.device)
    target = None
    for high in range(_KEY_BITS, 0, -level_bits):  # the level's bits: [shift, high)
        shift = max(0, high - level_bits)
        num_bins = 1 << (high - shift)
        _level_keys(bits, found, shift, num_bins, out=level_keys)
        histogram = _histogram(level_keys, weights, buffer, num_bins)  # [M, B]
        chunks = histogram.view(num_rows, -1, min(num_bins, _CHUNK))  # [M, B / C, C]
        chunk_sums = chunks.sum(dim=-1).cumsum_(dim=-1)  # [M, B / C]
        if target is None:
            target = fraction * chunk_sums[:, -1]  # [M]
            target = target if at_most is None else torch.minimum(target, at_most)
            target = target.clamp_(min=torch.finfo(torch.float32).tiny)[:, None]  # [M, 1]: > 0
        found += _first_bin_reaching(chunks, chunk_sums, target).to(torch.int32) << shift
    return (_ONE_BITS - found[:, 0]).view(torch.float32)


def _level_keys(
    bits: torch.Tensor, found: torch.Tensor, shift: int, num_bins: int, out: torch.Tensor
) -> None:
    """Into out [M, V] int32: row * num_bins + the bin of each key (_ONE_BITS - bits, bits [M, V]
    int32) inside the bin `found` [M, 1] (the key bits above the level), by its bits from `shift`
    up. Keys above that bin go to bin 0 (they count), keys below it to the last bin (never
    reached before the target: the bin found holds it; under rounding, the bin's bottom).
    The row offset lets one flat index_add fill every row's histogram."""
    row_start = torch.arange(found.shape[0], dtype=torch.int32, device=found.device)[:, None]
    torch.sub(_ONE_BITS - found, bits, out=out)
    if shift > 0:
        out >>= shift
    out.clamp_(0, num_bins - 1).add_(row_start * num_bins)  # scalar bounds: a fast clamp


def _histogram(
    flat_keys: torch.Tensor, weights: torch.Tensor, buffer: torch.Tensor, num_bins: int
) -> torch.Tensor:
    """flat_keys [M, V] int32 (row * num_bins + bin), weights [M, V] -> [M, num_bins]: the
    weight in each bin, a view of `buffer` (float32, large enough)."""
    sums = buffer[: flat_keys.shape[0] * num_bins].zero_()
    sums.index_add_(0, flat_keys.view(-1), weights.expand(flat_keys.shape).reshape(-1))
    return sums.view(-1, num_bins)


def _first_bin_reaching(
    chunks: torch.Tensor, chunk_sums: torch.Tensor, target: torch.Tensor
) -> torch.Tensor:
    """The first bin whose cumulative weight reaches target [M, 1], as [M, 1] int64: chunks
    [M, B / C, C] are the bins in chunks of C, chunk_sums [M, B / C] their cumulative sums.
    The chunk first, then the bin inside it: two short cumsums instead of one over B bins."""
    num_chunks, chunk_size = chunks.shape[1:]
    chunk = torch.searchsorted(chunk_sums, target).clamp_(max=num_chunks - 1)  # [M, 1]
    before = torch.where(chunk > 0, chunk_sums.gather(1, (chunk - 1).clamp(min=0)), 0.0)
    inner = chunks.gather(1, chunk[:, :, None].expand(-1, 1, chunk_size)).squeeze(1)  # [M, C]
    inner = inner.cumsum_(dim=-1).add_(before)  # [M, C]
    return chunk * chunk_size + torch.searchsorted(inner, target).clamp_(max=chunk_size - 1)


def _top_k_value(
    probs: torch.Tensor, top_k: torch.Tensor, top: torch.Tensor | None
) -> torch.Tensor:
    """The k-th largest of probs [M, V] per row (0 where top_k is 0), from `top` [M, K] (the K
    largest, descending, K >= every k) when given."""
    if top is not None:
        kth = top.gather(1, (top_k - 1).clamp(min=0)[:, None]).squeeze(1)  # [M]
    else:
        ones = probs.new_ones(()).expand(probs.shape)
        kth = radix_select(probs, ones, 1.0, at_most=top_k.to(torch.float32))
    return torch.where(top_k > 0, kth, 0.0)


def _threshold_from_top(
    top: torch.Tensor, floor: torch.Tensor | None, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """top [M, K]: the K largest probs of each row, descending; every row has 0 < top_k <= K.
    top-p keeps the smallest prefix whose mass reaches top_p of what min-p and top-k left: an id
    stays iff the mass ranked above it is < top_p * that mass."""
    threshold = top.gather(1, (top_k - 1)[:, None]).squeeze(1)  # [M]: the k-th value
    if floor is not None:
        threshold = torch.maximum(floor, threshold)
    kept = top.masked_fill(top < threshold[:, None], 0.0)  # [M, K]
    mass_above = kept.cumsum(dim=-1) - kept  # [M, K]
    target = top_p * kept.sum(dim=-1)  # [M]
    # [M]; at least 1 even when a tiny top_p rounds to 0 in float32
    num_kept = (mass_above < target[:, None]).sum(dim=-1).clamp_(min=1)
    nucleus = kept.gather(1, (num_kept - 1)[:, None]).squeeze(1)  # [M]
    # top_p = 1 is off: rounding in the cumsum must not cut the tail.
    return torch.where(top_p < 1.0, torch.maximum(nucleus, threshold), threshold)
