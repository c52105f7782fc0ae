"""Penalties and bad words at verify positions (sample/state.py make_batch with drafts): the
logits of position j are those the plain sampler gives a request whose outputs end with the
drafts before j; after a verify step (record_verified, then count_emitted when the host reads
the counts) the histories are those of a request that emitted the accepted tokens."""

from __future__ import annotations

import random

import numpy as np
import torch

from pagedlm.sample import SamplingState
from pagedlm.sample.sampler import process_logits
from pagedlm.sampling_params import SamplingParams
from pagedlm.worker.spec_layout import drafts_before_index

VOCAB = 12
K = 3
EOS = 11
HOT = [0, 1, 2, 3]  # drafts, outputs and words come from these, so they meet often


def _params(rng: random.Random, kind: str) -> SamplingParams:
    penalties = {
        "repetition": {"repetition_penalty": 1.7},
        "frequency": {"frequency_penalty": 0.9},
        "presence": {"presence_penalty": -0.8},
        "all": {"repetition_penalty": 0.6, "frequency_penalty": -0.4, "presence_penalty": 1.1},
    }.get(kind, {})
    words = None
    if kind in ("bad_words", "all"):
        words = [[rng.choice(HOT) for _ in range(rng.randint(1, 3))] for _ in range(3)]
    return SamplingParams(
        temperature=rng.choice([0.0, 0.8]),
        bad_words_token_ids=words,
        min_tokens=rng.choice([0, 3]),
        **penalties,
    )


def _plain_logits(
    params: SamplingParams, prompt: list[int], outputs: list[int], logits: torch.Tensor
) -> torch.Tensor:
    """The plain sampler's processed logits [V] of a request with these outputs."""
    state = SamplingState(1, VOCAB, "cpu", seed=0)
    state.add_request(0, params, prompt, outputs, eos_token_ids=[EOS])
    return process_logits(logits.clone()[None], state.make_batch(np.array([0])))[0]


def test_verify_positions_see_the_drafts_before_them() -> None:
    rng = random.Random(0)
    torch.manual_seed(0)
    kinds = ["repetition", "frequency", "presence", "bad_words", "all", "none"]
    state = SamplingState(len(kinds), VOCAB, "cpu", seed=0)
    requests = []  # (params, prompt, outputs)
    for row, kind in enumerate(kinds):
        params = _params(rng, kind)
        prompt = [] if row == 4 else [rng.choice(HOT) for _ in range(4)]  # [] as prompt_embeds
        outputs = [rng.choice(HOT) for _ in range(rng.choice([0, 1, 5]))]
        state.add_request(row, params, prompt, outputs, eos_token_ids=[EOS])
        requests.append((params, prompt, outputs))
    rows_np = np.arange(len(kinds))
    num_banned_by_a_draft = 0
    for _ in range(6):
        num_drafts_np = np.array([rng.randint(0, K) for _ in kinds])
        drafts = [[rng.choice(HOT) for _ in range(n)] for n in num_drafts_np]
        row_rows_np = np.repeat(rows_np, num_drafts_np + 1)
        offsets_np = np.concatenate([np.arange(n + 1) for n in num_drafts_np])
        before = torch.full((len(row_rows_np), K), -1, dtype=torch.int64)  # [T, K]
        for t, (row, j) in enumerate(zip(row_rows_np, offsets_np)):
            before[t, :j] = torch.tensor(drafts[row][:j], dtype=torch.int64)
        logits = torch.randn(len(row_rows_np), VOCAB)
        batch = state.make_batch(row_rows_np, offsets_np, before)
        got = process_logits(logits.clone(), batch)
        for t, (row, j) in enumerate(zip(row_rows_np, offsets_np)):
            params, prompt, outputs = requests[row]
            history = outputs + drafts[row][:j]
            want = _plain_logits(params, prompt, history, logits[t])
            torch.testing.assert_close(got[t], want)
            if j and not torch.equal(want, _plain_logits(params, prompt, outputs, logits[t])):
                num_banned_by_a_draft += 1
        # each request emits its accepted drafts and one token of its own
        emitted = torch.full((len(kinds), K + 1), -1, dtype=torch.int64)
        num_emitted_np = np.zeros(len(kinds), dtype=np.int64)
        for row, row_drafts in enumerate(drafts):
            tokens = row_drafts[: rng.randint(0, len(row_drafts))] + [rng.choice(HOT)]
            emitted[row, : len(tokens)] = torch.tensor(tokens)
            num_emitted_np[row] = len(tokens)
            requests[row][2].extend(tokens)
        state.record_verified(rows_np, emitted)
        state.count_emitted(rows_np, num_emitted_np)
        logits = torch.randn(len(kinds), VOCAB)
        got = process_logits(logits.clone(), state.make_batch(rows_np))
        for row, (params, prompt, outputs) in enumerate(requests):
            torch.testing.assert_close(
                got[row], _plain_logits(params, prompt, outputs, logits[row])
            )
    assert num_banned_by_a_draft > 10  # the drafts changed what later positions see


def test_drafts_before_index() -> None:
    """Requests of 2, 0 and 1 drafts (D = 3), k = 2: each logits row's earlier drafts, then D."""
    num_drafts_np = np.array([2, 0, 1])
    offsets_np = np.array([0, 1, 2, 0, 0, 1])
    index = drafts_before_index(num_drafts_np, offsets_np, 2)
    assert index.tolist() == [[3, 3], [0, 3], [0, 1], [3, 3], [3, 3], [2, 3]]
