"""The truncation thresholds without a sort (top-k values, radix select) against a sort."""

from __future__ import annotations

import pytest
import torch

from pagedlm.sample.filters import TOP_K_LIMIT, TopKTopP, radix_select, top_k_top_p_threshold


def random_probs(num_rows: int, vocab_size: int, seed: int) -> torch.Tensor:
    """exp(logit - max) rows [M, V] with ties (rounded logits), zeros (-inf) and flat rows."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.rand(num_rows, 1, generator=gen) * 6  # [M, 1]: flat rows to peaked ones
    logits = torch.randn(num_rows, vocab_size, generator=gen) * scale
    logits[::3] = (logits[::3] * 4).round() / 4  # many exact ties
    logits[1::4, : vocab_size // 2] = float("-inf")
    return (logits - logits.amax(dim=-1, keepdim=True)).exp()


def reference_threshold(
    probs: torch.Tensor, floor: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """By a full sort, in float64: min-p floor, top-k, then the smallest prefix of the rest
    whose mass reaches top_p of it (an id stays iff the mass ranked above it is < the target)."""
    out = []
    for row, f, k, p in zip(probs.double(), floor.tolist(), top_k.tolist(), top_p.tolist()):
        ranked = row.sort(descending=True).values
        threshold = max(f, ranked[k - 1].item() if k > 0 else 0.0)
        kept = torch.where(ranked >= threshold, ranked, 0.0)
        if p < 1.0:
            mass_above = kept.cumsum(0) - kept
            num_kept = max(1, int((mass_above < p * kept.sum()).sum()))
            threshold = max(threshold, kept[num_kept - 1].item())
        out.append(threshold)
    return torch.tensor(out, dtype=torch.float32)


@pytest.mark.parametrize("num_rows, vocab_size", [(48, 3000), (8, 40000)])  # 3 levels, 2 of 15 bits
def test_radix_select_finds_the_top_p_value(num_rows: int, vocab_size: int) -> None:
    probs = random_probs(num_rows, vocab_size, seed=0)
    top_p = torch.rand(num_rows) * 0.98 + 0.01
    top_p[5], top_p[6], top_p[7] = 1e-30, 0.9999, 0.5
    got = radix_select(probs, probs, top_p)
    zeros = torch.zeros(num_rows)
    want = reference_threshold(probs, zeros, zeros.to(torch.int64), top_p)
    assert torch.isin(got, probs).all()  # an actual value of the row
    assert torch.equal(got, want), (got - want).abs().max()
    assert got[5] == 1.0  # a top_p that is 0 in float32 keeps the top value


def test_radix_select_counts_for_top_k() -> None:
    probs = random_probs(32, 2000, seed=1)
    top_k = torch.randint(1, 2000, (32,))
    top_k[0], top_k[1] = 1, 2000
    ones = torch.ones(()).expand(probs.shape)
    got = radix_select(probs, ones, 1.0, at_most=top_k.float())
    want = probs.sort(dim=-1, descending=True).values.gather(1, (top_k - 1)[:, None]).squeeze(1)
    assert torch.equal(got, want)


def test_radix_select_keeps_fraction_of_weights_only() -> None:
    """Zero-weight values are never the answer; a flat row splits where its mass says."""
    values = torch.tensor([[1.0, 0.5, 0.5, 0.25, 0.125, 0.0]])
    weights = torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]])
    assert radix_select(values, weights, torch.tensor([0.5])).item() == 0.25
    flat = torch.full((1, 1000), 0.5)
    flat[0, 0] = 1.0
    assert radix_select(flat, flat, torch.tensor([0.9])).item() == 0.5


@pytest.mark.parametrize("path", ["top_k_values", "top_k_values_then_radix", "radix_only"])
def test_threshold_paths_equal_the_sort(path: str) -> None:
    """The three ways top_k_top_p_threshold takes, each against the sort; some rows without
    top-k (not for the top-k-values path) or without top-p, some with a min-p floor."""
    num_rows, vocab_size = 40, 1500
    probs = random_probs(num_rows, vocab_size, seed=2)
    gen = torch.Generator().manual_seed(3)
    top_k = torch.randint(1, 60, (num_rows,), generator=gen)
    top_p = torch.rand(num_rows, generator=gen) * 0.9 + 0.05
    floor = torch.where(torch.arange(num_rows) % 5 == 0, 0.05, 0.0)
    top_p[::4] = 1.0
    if path != "top_k_values":
        top_k[1::3] = 0
    max_top_k = TOP_K_LIMIT + 1 if path == "radix_only" else int(top_k.max())
    params = TopKTopP(
        index=None,
        top_k=top_k,
        top_p=top_p,
        max_top_k=max_top_k,
        every_row_top_k=path == "top_k_values",
        any_top_p=True,
    )
    got = top_k_top_p_threshold(probs, floor, params)
    want = reference_threshold(probs, floor, top_k, top_p)
    assert torch.equal(got, want), (got - want).abs().max()
    num_kept = (probs >= got[:, None]).sum(dim=-1)
    has_k = top_k > 0
    assert (num_kept[has_k & (top_p < 1)] < top_k[has_k & (top_p < 1)]).any()  # top-p cut somewhere


def test_threshold_without_top_k_or_floor() -> None:
    """Only top-p: no floor, no k; rows with top_p = 1 keep everything."""
    probs = random_probs(8, 500, seed=4)
    top_p = torch.tensor([0.3, 1.0, 0.9, 0.99, 1e-30, 0.5, 1.0, 0.7])
    params = TopKTopP(
        index=None,
        top_k=torch.zeros(8, dtype=torch.int64),
        top_p=top_p,
        max_top_k=0,
        every_row_top_k=False,
        any_top_p=True,
    )
    got = top_k_top_p_threshold(probs, None, params)
    want = reference_threshold(probs, torch.zeros(8), torch.zeros(8, dtype=torch.int64), top_p)
    want[top_p == 1.0] = 0.0
    assert torch.equal(got, want)
    assert got[4] == 1.0
