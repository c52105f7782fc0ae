"""Sampled frequencies against the exact target distribution (chi-square at a fixed seed)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pagedlm.sample import SamplingState
from pagedlm.sampling_params import SamplingParams

LOGITS = np.array([2.0, 1.55, 1.2, 0.8, 0.3, 0.0, -0.6, -1.1])  # [V], no ties
VOCAB_SIZE = len(LOGITS)
NUM_ROWS = 2000
NUM_STEPS = 10  # 20,000 samples


def target_probs(
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    allowed: list[int] | None = None,
    top_p_shift: int = 0,
) -> np.ndarray:
    """The exact distribution, in float64: allowed mask, temperature, min-p, top-k, then top-p
    on the renormalised rest. `top_p_shift` moves the top-p cut by that many tokens (wrong on
    purpose, for the negative checks)."""
    logits = LOGITS / temperature
    if allowed is not None:
        logits = np.where(np.isin(np.arange(VOCAB_SIZE), allowed), logits, -np.inf)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    keep = probs >= min_p * probs.max()
    order = np.argsort(-probs)
    if top_k:
        keep[order[top_k:]] = False
    probs = np.where(keep, probs, 0.0) / probs[keep].sum()
    num_kept = 0
    mass_above = 0.0
    for token in order:  # the smallest prefix with mass >= top_p
        if probs[token] == 0.0 or mass_above >= top_p:
            break
        mass_above += probs[token]
        num_kept += 1
    keep = np.zeros(VOCAB_SIZE, dtype=bool)
    keep[order[: num_kept + top_p_shift]] = True
    probs = np.where(keep, probs, 0.0)
    return probs / probs.sum()


def sample_counts(params: SamplingParams, seed: int = 0) -> np.ndarray:
    state = SamplingState(NUM_ROWS, VOCAB_SIZE, "cpu", seed)
    for row in range(NUM_ROWS):  # no seed: each row draws its own from the state
        state.add_request(row, params, [0], [])
    rows_np = np.arange(NUM_ROWS, dtype=np.int32)
    logits = torch.tensor(LOGITS, dtype=torch.float32).expand(NUM_ROWS, -1)
    counts = np.zeros(VOCAB_SIZE, dtype=np.int64)
    for _ in range(NUM_STEPS):
        sampled = state.sample(logits.clone(), rows_np).sampled_token_ids
        counts += np.bincount(sampled.numpy(), minlength=VOCAB_SIZE)
    return counts


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson's statistic; infinite if a token of probability 0 was drawn."""
    if counts[probs == 0.0].any():
        return math.inf
    expected = counts.sum() * probs
    support = probs > 0.0
    return float((((counts - expected) ** 2)[support] / expected[support]).sum())


def chi_square_bound(probs: np.ndarray, z: float = 3.719) -> float:
    """The chi-square quantile at 1 - 1e-4 (z = 3.719), Wilson-Hilferty approximation."""
    df = int((probs > 0).sum()) - 1
    if df == 0:
        return 0.0
    return df * (1.0 - 2.0 / (9 * df) + z * math.sqrt(2.0 / (9 * df))) ** 3


CASES = {
    "plain": dict(),
    "cold": dict(temperature=0.6),
    "hot": dict(temperature=1.7),
    "top_k": dict(top_k=3),
    "top_p": dict(top_p=0.7),
    "min_p": dict(min_p=0.2),
    "top_k_top_p": dict(top_k=5, top_p=0.85),  # 4 tokens; top-p 0.85 alone keeps 5
    "all": dict(temperature=1.3, top_k=6, top_p=0.9, min_p=0.08),
    "min_p_top_p": dict(temperature=0.8, top_p=0.8, min_p=0.05),  # the radix after a floor
    "allowed": dict(temperature=1.2, top_p=0.9, allowed=[1, 3, 4, 6]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_frequencies_match_target(name: str) -> None:
    case = dict(CASES[name])
    allowed = case.pop("allowed", None)
    probs = target_probs(allowed=allowed, **case)
    counts = sample_counts(SamplingParams(allowed_token_ids=allowed, **case))
    assert chi_square(counts, probs) < chi_square_bound(probs), (counts, probs)


@pytest.mark.parametrize("shift", [-1, 1])
def test_top_p_off_by_one_token_fails_the_bound(shift: int) -> None:
    """The negative check: the test has the power to see a top-p cut one token off."""
    counts = sample_counts(SamplingParams(top_p=0.7))
    right = target_probs(top_p=0.7)
    wrong = target_probs(top_p=0.7, top_p_shift=shift)
    assert chi_square(counts, right) < chi_square_bound(right)
    assert chi_square(counts, wrong) > 10 * chi_square_bound(wrong)


def test_slightly_wrong_temperature_fails_the_bound() -> None:
    counts = sample_counts(SamplingParams(temperature=1.0))
    wrong = target_probs(temperature=1.1)
    assert chi_square(counts, wrong) > chi_square_bound(wrong)


def test_another_state_seed_gives_other_samples_same_law() -> None:
    params = SamplingParams(temperature=0.9, top_k=5)
    counts_a, counts_b = sample_counts(params, seed=0), sample_counts(params, seed=1)
    assert not np.array_equal(counts_a, counts_b)
    probs = target_probs(temperature=0.9, top_k=5)
    assert chi_square(counts_b, probs) < chi_square_bound(probs)
