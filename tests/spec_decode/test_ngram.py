"""The n-gram proposer (pagedlm/spec_decode/ngram.py) against a brute-force loop over random
token rows, and its edge cases."""

from __future__ import annotations

import numpy as np
import pytest

from pagedlm.spec_decode.ngram import NO_DRAFT, propose_ngram


def brute_force(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The longest n (max_n down to min_n) whose suffix occurs earlier, its most recent
    occurrence, then k tokens copied from after it (an LZ77 copy: it may read what it wrote)."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n :]
        for end in range(length - 2, n - 2, -1):
            if tokens[end - n + 1 : end + 1] == suffix:
                extended = list(tokens)
                for m in range(k):
                    extended.append(extended[end + 1 + m])
                return extended[length:]
    return []


def _one(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    table = np.array([tokens or [0]], dtype=np.int32)
    out = propose_ngram(table, np.array([len(tokens)]), np.array([0]), k, min_n, max_n)
    drafts = out.token_ids[0, : out.num_drafts[0]].tolist()
    assert (out.token_ids[0, out.num_drafts[0] :] == NO_DRAFT).all()
    return drafts


def test_matches_brute_force_on_random_rows() -> None:
    """Small vocabularies (2..5 ids) so that matches of every length occur; rows of a shared
    table picked out of order, of ragged lengths (0 included)."""
    rng = np.random.default_rng(0)
    for _ in range(400):
        num_table_rows, width = int(rng.integers(1, 8)), int(rng.integers(1, 40))
        table = rng.integers(0, int(rng.integers(2, 6)), (num_table_rows, width)).astype(np.int32)
        num_tokens = rng.integers(0, width + 1, num_table_rows)
        rows = rng.permutation(num_table_rows)[: int(rng.integers(1, num_table_rows + 1))]
        k, min_n = int(rng.integers(1, 6)), int(rng.integers(1, 4))
        max_n = min_n + int(rng.integers(0, 3))
        out = propose_ngram(table, num_tokens, rows, k, min_n, max_n)
        for i, row in enumerate(rows):
            expected = brute_force(table[row, : num_tokens[row]].tolist(), k, min_n, max_n)
            assert out.num_drafts[i] == len(expected)
            assert out.token_ids[i, : len(expected)].tolist() == expected


def test_no_match_drafts_nothing() -> None:
    assert _one([1, 2, 3, 4, 5], 3, 1, 3) == []
    assert _one([], 3, 1, 3) == []
    assert _one([7], 3, 1, 3) == []
    assert _one([1, 2, 9, 1, 2], 2, 3, 3) == []  # only a 2-gram repeats; min_n is 3


def test_the_longest_then_the_most_recent_match_wins() -> None:
    # "9 1 2" occurs at 0..2 (then 3); the most recent earlier "1 2" at 4..5 (then 5)
    tokens = [9, 1, 2, 3, 1, 2, 5, 9, 1, 2]
    assert _one(tokens, 1, 2, 3) == [3]  # the 3-gram wins over the later 2-gram
    assert _one(tokens, 1, 2, 2) == [5]  # n = 2 only: the most recent "1 2"
    assert _one([1, 2, 7, 1, 2, 8, 1, 2], 1, 2, 2) == [8]


def test_a_match_at_the_end_copies_its_period() -> None:
    """The occurrence ends right before the suffix: the copy runs into the row's end and
    repeats the period ("a b a b" drafts "a b a b ..."), k beyond the row."""
    assert _one([5, 6, 5, 6], 5, 2, 2) == [5, 6, 5, 6, 5]
    assert _one([4, 4, 4], 3, 1, 5) == [4, 4, 4]


def test_k_beyond_the_rows_end_is_filled_by_the_copy() -> None:
    tokens = [1, 2, 3, 1, 2]
    assert _one(tokens, 6, 2, 2) == [3, 1, 2, 3, 1, 2]


@pytest.mark.parametrize("k", [1, 4])
def test_a_batch_mixes_matches_and_misses(k: int) -> None:
    table = np.array([[1, 2, 1, 0, 0], [1, 2, 3, 4, 5], [3, 3, 3, 3, 3]], dtype=np.int32)
    out = propose_ngram(table, np.array([3, 5, 5]), np.arange(3), k, 1, 2)
    assert out.num_drafts.tolist() == [k, 0, k]
    assert out.token_ids[0].tolist() == brute_force([1, 2, 1], k, 1, 2)
    assert out.token_ids[1].tolist() == [NO_DRAFT] * k


def test_the_device_version_drafts_the_same() -> None:
    """propose_ngram_device (torch, fixed shapes) against the host version on random rows."""
    import torch

    from pagedlm.spec_decode.ngram_device import propose_ngram_device

    rng = np.random.default_rng(1)
    for _ in range(100):
        batch, width = int(rng.integers(1, 9)), int(rng.integers(1, 40))
        table = rng.integers(0, int(rng.integers(2, 6)), (batch, width)).astype(np.int32)
        lengths = rng.integers(0, width + 1, batch)
        k, min_n = int(rng.integers(1, 6)), int(rng.integers(1, 4))
        max_n = min_n + int(rng.integers(0, 3))
        host = propose_ngram(table, lengths, np.arange(batch), k, min_n, max_n)
        drafts, num_drafts = propose_ngram_device(
            torch.from_numpy(table), torch.from_numpy(lengths), k, min_n, max_n
        )
        assert drafts.tolist() == host.token_ids.tolist()
        assert num_drafts.tolist() == host.num_drafts.tolist()
