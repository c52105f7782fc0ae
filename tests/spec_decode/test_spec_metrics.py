"""Acceptance accounting (pagedlm/spec_decode/metrics.py): vLLM's definitions, and per-request
sums that reconcile with the engine counters over rejection-sampler verdicts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedlm.sample.sampler import SamplingBatch
from pagedlm.spec_decode import metrics
from pagedlm.spec_decode.metrics import RequestSpecStats, SpecDecodeCounters
from pagedlm.spec_decode.rejection_sampler import rejection_sample


def test_definitions() -> None:
    stats = RequestSpecStats(num_speculative_tokens=3, detailed=True)
    for drafted, accepted in ((3, 3), (3, 0), (0, 0), (2, 1)):  # the (0, 0) step had no drafts
        stats.record(drafted, accepted)
    result = stats.metrics()
    assert result.num_spec_steps == 3
    assert result.num_draft_tokens == 8
    assert result.num_accepted_draft_tokens == 4
    assert result.mean_acceptance_length == pytest.approx(1 + 4 / 3)
    assert result.draft_acceptance_rate == pytest.approx(0.5)
    assert result.acceptance_histogram == (1, 1, 0, 1)
    assert result.per_step_accepted == (3, 0, 1) and result.per_step_drafted == (3, 3, 2)
    assert set(result.to_dict()) >= {"mean_acceptance_length", "acceptance_histogram"}
    assert RequestSpecStats(2).metrics().acceptance_histogram == (0, 0, 0)
    with pytest.raises(ValueError):
        stats.record(2, 3)


def test_counter_names_are_vllms_under_our_prefix() -> None:
    assert metrics.NUM_DRAFTS == "pagedlm:spec_decode_num_drafts"
    assert metrics.NUM_DRAFT_TOKENS == "pagedlm:spec_decode_num_draft_tokens"
    assert metrics.NUM_ACCEPTED_TOKENS == "pagedlm:spec_decode_num_accepted_tokens"
    assert metrics.NUM_ACCEPTED_TOKENS_PER_POS == "pagedlm:spec_decode_num_accepted_tokens_per_pos"


def test_requests_reconcile_with_the_counters() -> None:
    """Random greedy verdicts over ragged steps: the requests' sums equal the counters, and the
    per-position counts are the histogram's tails."""
    k, num_reqs = 3, 5
    generator = torch.Generator().manual_seed(0)
    counters = SpecDecodeCounters(k)
    requests = [RequestSpecStats(k) for _ in range(num_reqs)]
    for _ in range(30):
        num_drafts = torch.randint(0, k + 1, (num_reqs,), generator=generator)
        cu = num_drafts.cumsum(0)
        num_rows = int(num_drafts.sum()) + num_reqs
        logits = torch.randn(num_rows, 4, generator=generator)  # 4 ids: drafts often right
        drafts = torch.randint(0, 4, (int(num_drafts.sum()),), generator=generator)
        out = rejection_sample(logits, drafts, cu, k, SamplingBatch())
        drafted_np, accepted_np = out.num_valid_drafts.numpy(), out.num_accepted.numpy()
        for stats, drafted, accepted in zip(requests, drafted_np, accepted_np, strict=True):
            stats.record(int(drafted), int(accepted))
            if drafted:  # steps without drafts count nowhere (as the scheduler records them)
                counters.record_one(int(drafted), int(accepted))
    per_request = [stats.metrics() for stats in requests]
    assert counters.num_drafts == sum(m.num_spec_steps for m in per_request)
    assert counters.num_draft_tokens == sum(m.num_draft_tokens for m in per_request)
    assert counters.num_accepted_tokens == sum(m.num_accepted_draft_tokens for m in per_request)
    histogram = np.sum([m.acceptance_histogram for m in per_request], axis=0)  # [k + 1]
    tails = histogram[::-1].cumsum()[::-1][1:]  # steps accepting more than j drafts
    assert counters.accepted_per_pos.tolist() == tails.tolist()
    assert 0 < counters.num_accepted_tokens < counters.num_draft_tokens
