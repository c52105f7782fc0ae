"""The rejection sampler (pagedlm/spec_decode/rejection_sampler.py): greedy exactness against a
plain loop, the emitted distributions against the target's (total variation over many draws,
vectorised as one large batch), penalties over the drafts before each position, synthetic
rates, seeds, ragged layouts and logprobs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedlm.sample.filters import TopKTopP
from pagedlm.sample.noise import row_keys_np
from pagedlm.sample.penalties import PenaltyTables
from pagedlm.sample.sampler import Penalties, RandomParams, SamplingBatch
from pagedlm.spec_decode.rejection_sampler import (
    NO_DRAFT,
    SyntheticAcceptance,
    rejection_sample,
)

VOCAB = 8


def tv_tolerance(probs: torch.Tensor, num_draws: int) -> float:
    """4x the bound E[TV] <= sum_v sqrt(p_v / N) / 2 of N draws from probs: a fair sampler stays
    under it but for a chance of ~1e-4; the errors this guards against (no residual, no
    min(1, p/q)) move TV by > 0.04 on these distributions."""
    return 2.0 * probs.double().sqrt().sum().item() / num_draws**0.5


def _keys(seeds: np.ndarray, counters: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(row_keys_np(seeds.astype(np.uint64), counters))


def _uniform_layout(num_reqs: int, k: int) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """cu_num_draft_tokens [R] and, per target row, its request and position (k drafts each)."""
    cu = torch.arange(1, num_reqs + 1, dtype=torch.int64) * k
    request = np.repeat(np.arange(num_reqs), k + 1)
    position = np.tile(np.arange(k + 1), num_reqs)
    return cu, request, position


def _random_batch(request: np.ndarray, position: np.ndarray, seed: int = 0) -> SamplingBatch:
    return SamplingBatch(random=RandomParams(noise_keys=_keys(request + seed * 10**9, position)))


def _total_variation(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=VOCAB).double()
    return 0.5 * (counts / counts.sum() - probs.double()).abs().sum().item()


def _distributions(k: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Target p and draft q per position [k + 1, V]: random, q half p and half noise (a draft
    that is right often enough for the later positions to be reached; q's last row unused)."""
    p = torch.softmax(torch.randn(k + 1, VOCAB, generator=generator) * 1.5, dim=-1)
    noise = torch.softmax(torch.randn(k + 1, VOCAB, generator=generator) * 1.5, dim=-1)
    return p, 0.5 * p + 0.5 * noise


@pytest.mark.parametrize("draft_kind", ["probabilistic", "one_hot"])
def test_emitted_tokens_follow_the_target_at_every_position(draft_kind: str) -> None:
    """k = 2: token j of the output (where emitted) ~ p_j, whatever q: position 0 always, 1 after
    an acceptance, 2 (the bonus) after two."""
    k, num_reqs = 2, 200_000
    generator = torch.Generator().manual_seed(1)
    p, q = _distributions(k, generator)
    cu, request, position = _uniform_layout(num_reqs, k)
    logits = p.log()[torch.from_numpy(position)]  # [T, V]
    if draft_kind == "probabilistic":
        drafts = torch.multinomial(q[:k], num_reqs, replacement=True, generator=generator)
        draft_probs = q[:k].repeat(num_reqs, 1)  # [D, V]
    else:  # one-hot q at any draft: here ids drawn from q too, verified as one-hot
        drafts = torch.multinomial(q[:k], num_reqs, replacement=True, generator=generator)
        draft_probs = None
    drafts = drafts.T.reshape(-1)  # [D], request-major
    out = rejection_sample(logits, drafts, cu, k, _random_batch(request, position), draft_probs)
    for j in range(k + 1):
        emitted = out.token_ids[:, j]
        tokens = emitted[emitted >= 0]
        assert len(tokens) > 5_000  # the tolerance grows as fewer are reached
        assert _total_variation(tokens, p[j]) < tv_tolerance(p[j], len(tokens)), j
    # the acceptance rate of position 0 is sum_v min(p, q) (one-hot: E_q[p(d)])
    expected = torch.minimum(p[0], q[0]).sum() if draft_probs is not None else (p[0] * q[0]).sum()
    observed = (out.num_accepted > 0).double().mean()
    assert abs(observed - expected) < 0.01


def test_the_distribution_test_fails_without_the_residual() -> None:
    """The check above can fail: emitting the draft on acceptance and a draw from p (not the
    residual) on rejection is biased towards q and goes over the tolerance."""
    k, num_reqs = 1, 200_000
    generator = torch.Generator().manual_seed(1)
    p, q = _distributions(k, generator)
    drafts = torch.multinomial(q[0], num_reqs, replacement=True, generator=generator)
    accept = torch.rand(num_reqs, generator=generator) * q[0][drafts] <= p[0][drafts]
    fallback = torch.multinomial(p[0], num_reqs, replacement=True, generator=generator)
    biased = torch.where(accept, drafts, fallback)
    assert _total_variation(biased, p[0]) > 2 * tv_tolerance(p[0], num_reqs)


def test_filters_shape_the_target_distribution() -> None:
    """temperature 0.7 and top-k 3 apply to p: emitted ~ the truncated, sharpened softmax."""
    num_reqs = 100_000
    generator = torch.Generator().manual_seed(2)
    base = torch.randn(VOCAB, generator=generator)
    cu, request, position = _uniform_layout(num_reqs, 1)
    num_rows = len(request)
    logits = base.expand(num_rows, -1).clone()
    drafts = torch.randint(0, VOCAB, (num_reqs,), generator=generator)
    params = RandomParams(
        noise_keys=_keys(request, position),
        temperature=torch.full((num_rows,), 0.7),
        top_k_top_p=TopKTopP(
            index=None,
            top_k=torch.full((num_rows,), 3, dtype=torch.int64),
            top_p=torch.ones(num_rows),
            max_top_k=3,
            every_row_top_k=True,
            any_top_p=False,
        ),
    )
    out = rejection_sample(logits, drafts, cu, 1, SamplingBatch(random=params))
    scaled = torch.softmax(base / 0.7, dim=-1)
    keep = torch.zeros(VOCAB, dtype=torch.bool)
    keep[scaled.topk(3).indices] = True
    target = torch.where(keep, scaled, 0.0)
    target /= target.sum()
    assert _total_variation(out.token_ids[:, 0], target) < tv_tolerance(target, num_reqs)
    assert keep[out.token_ids[:, 0]].all()  # top-k's cut is never emitted


def _greedy_reference(
    logits: torch.Tensor, drafts: list[list[int]]
) -> tuple[list[list[int]], list[int]]:
    """A plain loop: accept while the draft is the argmax, then the argmax."""
    argmax = logits.argmax(dim=-1).tolist()
    tokens, accepted, start = [], [], 0
    for request_drafts in drafts:
        num_accepted = 0
        while num_accepted < len(request_drafts):
            if request_drafts[num_accepted] != argmax[start + num_accepted]:
                break
            num_accepted += 1
        tokens.append(argmax[start : start + num_accepted + 1])
        accepted.append(num_accepted)
        start += len(request_drafts) + 1
    return tokens, accepted


def _ragged(drafts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, int]:
    flat = torch.tensor([d for ds in drafts for d in ds], dtype=torch.int64)
    cu = torch.tensor(np.cumsum([len(ds) for ds in drafts]), dtype=torch.int64)
    return flat, cu, sum(len(ds) + 1 for ds in drafts)


def test_greedy_is_exact_over_ragged_drafts() -> None:
    generator = torch.Generator().manual_seed(3)
    k = 4
    for _ in range(20):
        lengths = torch.randint(0, k + 1, (7,), generator=generator).tolist()
        num_rows = sum(lengths) + len(lengths)
        logits = torch.randn(num_rows, VOCAB, generator=generator)
        argmax = logits.argmax(dim=-1)
        drafts, row = [], 0
        for n in lengths:  # drafts that mostly match the argmax, sometimes not, sometimes -1
            pick = torch.rand(n, generator=generator)
            wrong = torch.randint(0, VOCAB, (n,), generator=generator)
            ds = torch.where(pick < 0.7, argmax[row : row + n], wrong)
            ds = torch.where(pick > 0.95, NO_DRAFT, ds)
            drafts.append(ds.tolist())
            row += n + 1
        flat, cu, _ = _ragged(drafts)
        tokens, accepted = _greedy_reference(logits, drafts)
        out = rejection_sample(logits.clone(), flat, cu, k, SamplingBatch())
        assert out.num_accepted.tolist() == accepted
        for r, expected in enumerate(tokens):
            got = out.token_ids[r]
            assert got[: len(expected)].tolist() == expected
            assert (got[len(expected) :] == NO_DRAFT).all()
        assert out.num_valid_drafts.tolist() == [sum(d >= 0 for d in ds) for ds in drafts]


def test_greedy_rows_in_a_random_batch_stay_exact() -> None:
    """is_greedy rows take the argmax path in a batch whose other rows are random."""
    generator = torch.Generator().manual_seed(4)
    k, num_reqs = 3, 6
    cu, request, position = _uniform_layout(num_reqs, k)
    logits = torch.randn(len(request), VOCAB, generator=generator)
    argmax = logits.argmax(dim=-1).view(num_reqs, k + 1)
    drafts = argmax[:, :k].clone()
    drafts[::2, 1] = (drafts[::2, 1] + 1) % VOCAB  # even requests: refused at position 1
    greedy_requests = torch.tensor([True, True, False, True, False, True])
    params = RandomParams(noise_keys=_keys(request, position), is_greedy=greedy_requests[request])
    out = rejection_sample(logits.clone(), drafts.reshape(-1), cu, k, SamplingBatch(random=params))
    for r in torch.nonzero(greedy_requests).squeeze(1).tolist():
        if r % 2 == 0:
            assert out.num_accepted[r] == 1
            assert out.token_ids[r].tolist() == [argmax[r, 0], argmax[r, 1], -1, -1]
        else:
            assert out.num_accepted[r] == k
            assert out.token_ids[r].tolist() == argmax[r].tolist()


def test_no_drafts_at_all_emits_one_token_a_request() -> None:
    logits = torch.randn(3, VOCAB)
    cu = torch.zeros(3, dtype=torch.int64)
    empty = torch.empty(0, dtype=torch.int64)
    out = rejection_sample(logits.clone(), empty, cu, 2, SamplingBatch())
    assert out.token_ids.tolist() == [[int(t), -1, -1] for t in logits.argmax(dim=-1)]
    assert out.num_accepted.tolist() == [0, 0, 0]


def test_synthetic_rates_are_observed() -> None:
    k, num_reqs = 3, 60_000
    rates = torch.tensor([0.9, 0.5, 0.3])
    cu, request, position = _uniform_layout(num_reqs, k)
    logits = torch.randn(len(request), VOCAB)
    drafts = torch.randint(0, VOCAB, (num_reqs * k,))
    synthetic = SyntheticAcceptance(rates, _keys(request, position))
    out = rejection_sample(logits.clone(), drafts, cu, k, SamplingBatch(), synthetic=synthetic)
    for j in range(k):
        reached = out.num_accepted >= j
        rate = (out.num_accepted[reached] > j).double().mean().item()
        assert abs(rate - rates[j].item()) < 0.015, j
    # the first refused row emits the target's argmax (a greedy batch), whatever its draft
    rows = torch.arange(num_reqs) * (k + 1) + out.num_accepted
    assert torch.equal(
        out.token_ids[torch.arange(num_reqs), out.num_accepted], logits.argmax(-1)[rows]
    )
    # accepted drafts are emitted as they are
    accepted_rows = out.token_ids[:, :k][torch.arange(k)[None, :] < out.num_accepted[:, None]]
    assert (
        accepted_rows == drafts.view(num_reqs, k)[torch.arange(k) < out.num_accepted[:, None]]
    ).all()


def test_seeded_rows_verify_the_same_in_any_batch() -> None:
    """A request's verdict depends on its keys, logits and drafts, not on its neighbours."""
    generator = torch.Generator().manual_seed(5)
    k = 3
    p, q = _distributions(k, generator)
    logits_one = p.log()  # [k + 1, V]: request 0
    drafts_one = torch.multinomial(q[:k], 1, generator=generator).squeeze(1)  # [k]
    keys_one = _keys(np.full(k + 1, 42), np.arange(k + 1) + 17)

    def run(others: int) -> torch.Tensor:
        logits = torch.cat([torch.randn(others * (k + 1), VOCAB, generator=generator), logits_one])
        drafts = torch.cat(
            [torch.randint(0, VOCAB, (others * k,), generator=generator), drafts_one]
        )
        keys = torch.cat([_keys(np.arange(others * (k + 1)), np.zeros(others * (k + 1))), keys_one])
        cu = torch.arange(1, others + 2, dtype=torch.int64) * k
        batch = SamplingBatch(random=RandomParams(noise_keys=keys))
        return rejection_sample(
            logits, drafts, cu, k, batch, q[:k].repeat(others + 1, 1)
        ).token_ids[-1]

    alone = run(0)
    assert torch.equal(alone, run(5))
    assert torch.equal(alone, run(11))


def test_logprobs_are_those_of_the_emitted_tokens() -> None:
    k, num_reqs = 2, 4
    cu, request, position = _uniform_layout(num_reqs, k)
    logits = torch.randn(len(request), VOCAB)
    raw = logits.log_softmax(dim=-1)
    drafts = torch.randint(0, VOCAB, (num_reqs * k,))
    batch = SamplingBatch(num_logprobs=2, random=RandomParams(noise_keys=_keys(request, position)))
    out = rejection_sample(logits.clone(), drafts, cu, k, batch)
    token_ids, logprobs, _ = out.logprobs
    assert torch.equal(token_ids[:, 0], out.row_token_ids)
    assert torch.allclose(logprobs[:, 0], raw.gather(1, out.row_token_ids[:, None]).squeeze(1))
    # the output's tokens are the row tokens of the rows reached
    rows = torch.arange(len(request)).view(num_reqs, k + 1)
    reached = out.token_ids >= 0
    assert torch.equal(out.token_ids[reached], out.row_token_ids[rows][reached])


def test_synthetic_refusals_emit_the_targets_own_draws() -> None:
    """Random rows: a row the synthetic rate refuses emits a draw from p, whatever its draft."""
    num_reqs = 100_000
    generator = torch.Generator().manual_seed(6)
    p, q = _distributions(1, generator)
    cu, request, position = _uniform_layout(num_reqs, 1)
    logits = p.log()[torch.from_numpy(position)]
    drafts = torch.multinomial(q[0], num_reqs, replacement=True, generator=generator)
    synthetic = SyntheticAcceptance(torch.tensor([0.3]), _keys(request + 7, position))
    batch = _random_batch(request, position)
    out = rejection_sample(logits, drafts, cu, 1, batch, synthetic=synthetic)
    refused = out.token_ids[out.num_accepted == 0, 0]
    assert _total_variation(refused, p[0]) < tv_tolerance(p[0], len(refused))


_PENALTY = (1.4, 0.8, 0.6)  # repetition, frequency, presence
_PROMPT, _OUTPUTS = [0, 1], [2, 2, 5]


def _penalised(logits: torch.Tensor, prompt: list[int], outputs: list[int]) -> torch.Tensor:
    """A plain reference of the penalties of _PENALTY over one row [V]."""
    out = logits.clone()
    for token in set(prompt + outputs):
        value = out[token]
        out[token] = value / _PENALTY[0] if value > 0 else value * _PENALTY[0]
    for token in set(outputs):
        out[token] -= _PENALTY[1] * outputs.count(token) + _PENALTY[2]
    return out


def _penalised_verify(with_drafts: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """k = 1, probabilistic drafts, a penalised request's history: the emitted tokens [R, 2]
    and the raw target logits of both positions [2, V]. with_drafts=False: the bonus row's
    penalties ignore the draft before it (the error the check must catch)."""
    k, num_reqs = 1, 200_000
    generator = torch.Generator().manual_seed(7)
    base = torch.randn(k + 1, VOCAB, generator=generator) * 1.5  # [2, V]
    p0 = torch.softmax(_penalised(base[0], _PROMPT, _OUTPUTS), dim=-1)
    q = 0.5 * p0 + 0.5 * torch.softmax(torch.randn(VOCAB, generator=generator), dim=-1)
    cu, request, position = _uniform_layout(num_reqs, k)
    drafts = torch.multinomial(q, num_reqs, replacement=True, generator=generator)  # [D]
    before = torch.full((len(request), k), NO_DRAFT, dtype=torch.int64)  # [T, 1]
    if with_drafts:
        before[1::2, 0] = drafts
    tables = PenaltyTables(1, VOCAB, torch.device("cpu"))
    tables.reset_row(0, _PROMPT, _OUTPUTS)
    rows = torch.zeros(len(request), dtype=torch.int64)
    token_ids, counts, has_history = tables.batch(np.zeros(1, np.int64), rows, before)
    num_rows = len(request)
    penalties = Penalties(
        index=None,
        rows=rows,
        positions=rows,
        token_ids=token_ids,
        counts=counts,
        repetition=torch.where(has_history, _PENALTY[0], 1.0),
        frequency=torch.full((num_rows,), _PENALTY[1]),
        presence=torch.full((num_rows,), _PENALTY[2]),
    )
    batch = _random_batch(request, position, seed=3)
    batch.penalties = penalties
    logits = base[torch.from_numpy(position)]  # [T, V]
    out = rejection_sample(logits, drafts, cu, k, batch, q.expand(num_reqs, -1).contiguous())
    return out.token_ids, base


def _worst_conditional_tv(tokens: torch.Tensor, base: torch.Tensor) -> tuple[float, int]:
    """Over first tokens v drawn often enough: max of TV(second | first = v) / its tolerance,
    against the bonus row penalised with v among the outputs; and how many v were checked."""
    worst, checked = 0.0, 0
    for v in range(VOCAB):
        second = tokens[(tokens[:, 0] == v) & (tokens[:, 1] >= 0), 1]
        if len(second) < 5_000:
            continue
        p1 = torch.softmax(_penalised(base[1], _PROMPT, _OUTPUTS + [v]), dim=-1)
        worst = max(worst, _total_variation(second, p1) / tv_tolerance(p1, len(second)))
        checked += 1
    return worst, checked


def test_penalties_see_the_drafts_before_each_position() -> None:
    """With penalties, token 0 ~ the penalised p of the history, and token 1 given token 0 = v
    ~ the penalised p of the history and v: the bonus row's penalties count the accepted draft.
    Without the draft in its history the same check fails."""
    tokens, base = _penalised_verify(with_drafts=True)
    p0 = torch.softmax(_penalised(base[0], _PROMPT, _OUTPUTS), dim=-1)
    assert _total_variation(tokens[:, 0], p0) < tv_tolerance(p0, len(tokens))
    worst, checked = _worst_conditional_tv(tokens, base)
    assert checked >= 4 and worst < 1.0
    tokens, base = _penalised_verify(with_drafts=False)
    assert _worst_conditional_tv(tokens, base)[0] > 2.0
