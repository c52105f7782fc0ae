"""NgramProposer behind the Proposer boundary: the tokens each step emits extend its rows, and the
drafts equal the brute-force lookup over each row's tokens, on the host (numpy) path and the
device (fixed-shape torch) path alike; a step proposing none (k = 0) still extends the rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedlm.spec_decode.config import SpeculativeConfig
from pagedlm.spec_decode.ngram import NO_DRAFT
from pagedlm.spec_decode.ngram_proposer import NgramProposer
from pagedlm.spec_decode.proposer import VerifiedStep
from spec_decode.test_ngram import brute_force


def _step(rows: list[int], emitted: list[list[int]], first: list[int]) -> VerifiedStep:
    width = max(len(e) for e in emitted)
    token_ids = torch.full((len(rows), width), NO_DRAFT, dtype=torch.int64)
    for i, tokens in enumerate(emitted):
        token_ids[i, : len(tokens)] = torch.tensor(tokens)
    rows_t = torch.tensor(rows, dtype=torch.int64)
    first_np = np.array(first, dtype=np.int64)
    return VerifiedStep(
        rows_np=np.array(rows, dtype=np.int64),
        rows=rows_t,
        token_ids=token_ids,
        num_accepted=torch.tensor([len(e) - 1 for e in emitted]),
        first_positions_np=first_np,
        first_positions=torch.from_numpy(first_np),
        hidden_states=torch.zeros(1, 1),
        batch_index_np=np.arange(len(rows)),
        layout=None,
        inputs=None,
    )


@pytest.mark.parametrize("on_host", [True, False])
def test_drafts_follow_the_emitted_tokens(on_host: bool) -> None:
    config = SpeculativeConfig.from_user(
        {
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": 3,
        }
    )
    proposer = NgramProposer(config, max_num_reqs=4, max_model_len=48, device=torch.device("cpu"))
    proposer._on_host = on_host  # the device path runs on CPU tensors too
    rng = np.random.default_rng(1)
    tokens = {row: rng.integers(0, 4, size=int(rng.integers(2, 9))).tolist() for row in (0, 2, 3)}
    for row, ids in tokens.items():
        proposer.add_request(row, ids)
    for _ in range(12):
        rows = [r for r in tokens if rng.random() < 0.8] or [2]
        emitted = [rng.integers(0, 4, size=int(rng.integers(1, 4))).tolist() for _ in rows]
        step = _step(rows, emitted, [len(tokens[r]) for r in rows])
        for row, new in zip(rows, emitted):
            tokens[row] += new
        if rng.random() < 0.3:  # a batch size that decodes plainly: the rows still learn
            drafts = proposer.propose(step, 0)
            assert (drafts.token_ids == NO_DRAFT).all() and not drafts.num_drafts.any()
            continue
        drafts = proposer.propose(step)
        for i, row in enumerate(rows):
            expected = brute_force(tokens[row], 3, 1, 3)
            num = int(drafts.num_drafts[i])
            assert drafts.token_ids[i, :num].tolist() == expected
            assert (drafts.token_ids[i, num:] == NO_DRAFT).all()
