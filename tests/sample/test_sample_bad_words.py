"""Bad words against a plain-Python reference of vLLM's rule, over steps, with resumed
histories, rows changing hands and the tables growing; a batch without bad words builds none."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from pagedlm.sample import SamplingState
from pagedlm.sample.sampler import process_logits
from pagedlm.sampling_params import SamplingParams

VOCAB_SIZE = 8
HOT_TOKENS = [0, 1, 2]  # words and likely samples come from these, so prefixes match often


def reference_logits(
    logits: list[float], words: list[list[int]], outputs: list[int]
) -> list[float]:
    """vLLM: the last token of a word is banned when the outputs end with the word's other
    tokens (always, for a one-token word)."""
    x = list(logits)
    for word in words:
        if _matches(word, outputs):
            x[word[-1]] = -float("inf")
    return x


def _matches(word: list[int], outputs: list[int]) -> bool:
    prefix = word[:-1]
    return len(prefix) <= len(outputs) and outputs[len(outputs) - len(prefix) :] == prefix


def _random_words(rng: random.Random, max_len: int) -> list[list[int]]:
    return [
        [rng.choice(HOT_TOKENS) for _ in range(rng.randint(1, max_len))]
        for _ in range(rng.randint(1, 3))
    ]


def test_bad_words_match_reference_over_steps() -> None:
    rng = random.Random(0)
    torch.manual_seed(0)
    num_rows = 10
    state = SamplingState(num_rows, VOCAB_SIZE, "cpu", seed=0)
    reqs: dict[int, tuple[list[list[int]], list[int]]] = {}
    num_multi_banned = 0

    def add(row: int, max_len: int) -> None:
        words = _random_words(rng, max_len) if rng.random() < 0.8 else []
        outputs = [rng.choice(HOT_TOKENS) for _ in range(rng.choice([0, 1, 4]))]  # resumed
        params = SamplingParams(temperature=rng.choice([0.0, 1.0]), bad_words_token_ids=words)
        state.add_request(row, params, [5], list(outputs))
        reqs[row] = (words, outputs)

    for row in range(num_rows):
        add(row, max_len=2 if row < 5 else 4)  # later rows widen the tables
    for step in range(10):
        if step == 4:  # a row changes hands: its device history must be rebuilt
            state.remove_request(3)
            add(3, max_len=5)
        rows = rng.sample(list(reqs), rng.randint(3, num_rows))
        logits = torch.randn(len(rows), VOCAB_SIZE)
        logits[:, HOT_TOKENS] += 4.0
        got = process_logits(logits.clone(), state.make_batch(np.array(rows)))
        for i, row in enumerate(rows):
            words, outputs = reqs[row]
            want = torch.tensor(reference_logits(logits[i].tolist(), words, outputs))
            torch.testing.assert_close(got[i], want)
            num_multi_banned += sum(len(w) > 1 and _matches(w, outputs) for w in words)
        sampled = state.sample(logits.clone(), np.array(rows)).sampled_token_ids
        for i, row in enumerate(rows):
            assert not torch.isinf(got[i, sampled[i]])
            reqs[row][1].append(int(sampled[i]))
    assert num_multi_banned > 10  # the test saw many bans by multi-token words


def test_batch_without_bad_words_builds_none() -> None:
    state = SamplingState(2, VOCAB_SIZE, "cpu", seed=0)
    state.add_request(0, SamplingParams(bad_words_token_ids=[[1, 2]]), [5], [])
    state.add_request(1, SamplingParams(temperature=0.5), [5], [])
    assert state.make_batch(np.array([1])).bad_words is None
    assert state.make_batch(np.array([0, 1])).bad_words is not None


def test_an_empty_bad_word_is_refused() -> None:
    """Only here: the ids' range is checked at the engine boundary (SamplingParams.check_vocab)."""
    state = SamplingState(1, VOCAB_SIZE, "cpu", seed=0)
    with pytest.raises(ValueError, match=r"bad_words_token_ids"):
        state.add_request(0, SamplingParams(bad_words_token_ids=[[1], []]), [5], [])
