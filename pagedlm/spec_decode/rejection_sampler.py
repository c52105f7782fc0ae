"""Verification of drafts: which of each request's drafts the target accepts, and the token after.

Layout (vLLM's): request r has n_r drafts (cu_num_draft_tokens [R] holds the cumulative ends, so
n_r = cu[r] - cu[r - 1]) and n_r + 1 target rows, flat and in request order: one per draft, then
the bonus row. A draft id of NO_DRAFT (-1) is never accepted.

- greedy rows (temperature 0): accept while the draft is the target's argmax; the first row not
  accepted, or the bonus row, emits the argmax.
- random rows (Leviathan et al. / Chen et al., arXiv 2211.17192): accept draft d with probability
  min(1, p(d) / q(d)); on a rejection emit a draw from the residual max(0, p - q), normalised; the
  bonus row emits a draw from p. p is the target's distribution after every filter the plain
  sampler applies (masks, bias, penalties, temperature, min-p, top-k, top-p: sample/sampler.py;
  penalties and bad words read the request's outputs and its drafts before the row, vLLM's way);
  q is the draft's (one-hot at d when draft_probs is None: n-gram or greedy drafts). The emitted
  tokens are then distributed exactly as p's own draws.
- synthetic (benchmarking): draft j is accepted with probability rates[j] whatever it is; the first
  row not accepted emits the target's own token (argmax, or a draw from p).

Randomness is counter-based (sample/noise.py): row t's key (the request's seed and its count of
sampled tokens + the row's position) gives the residual's Gumbel draw and, salted, the uniform of
the accept test, so a seeded request verifies the same in any batch. Fixed shapes, no host sync.
On CUDA the final scan (verdicts -> output rows) is one Triton kernel (triton_scan.py).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch

from pagedlm.sample.filters import truncate
from pagedlm.sample.gumbel import gumbel_draw
from pagedlm.sample.noise import exponential_noise, to_int64
from pagedlm.sample.sampler import (
    TRITON_DEVICE_TYPES,
    Logprobs,
    RandomParams,
    SamplingBatch,
    gather_logprobs,
    process_logits,
    truncation_threshold,
    unnormalised_probs,
)
from pagedlm.spec_decode.ngram import NO_DRAFT
from pagedlm.spec_decode.triton_scan import triton_accept_scan

_ACCEPT_SALT = to_int64(0xA5A5_5A5A_C3C3_3C3C)  # the accept uniforms' stream, apart from the draw's


@dataclass(slots=True)
class SyntheticAcceptance:
    rates: torch.Tensor  # [K] float32: P(draft j accepted | drafts before it were)
    keys: torch.Tensor  # [T] int64: one noise key per target row (noise.row_keys_np)


@dataclass(slots=True)
class RejectionOutput:
    token_ids: torch.Tensor  # [R, K + 1] int64: accepted drafts, then one token; -1 after
    num_accepted: torch.Tensor  # [R] int64: accepted drafts (emitted tokens - 1)
    num_valid_drafts: torch.Tensor  # [R] int64: drafts that were not NO_DRAFT
    row_token_ids: torch.Tensor  # [T] int64: the token each target row emits if reached
    logprobs: Logprobs | None = None  # gather_logprobs over the raw logits at row_token_ids


@dataclass(frozen=True, slots=True)
class _Rows:
    """Where each flat target row sits: its request, its position and its draft."""

    target_row: torch.Tensor  # [R, K + 1] int64: the flat row of (request, position), clamped
    num_drafts: torch.Tensor  # [R] int64
    position: torch.Tensor  # [T] int64: the row's position in its request, 0..n_r
    draft_index: torch.Tensor  # [T] int64: the row's index in the D drafts; D on bonus rows
    draft: torch.Tensor  # [T] int64: the row's draft id; NO_DRAFT on bonus rows


def rejection_sample(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    max_spec_len: int,
    batch: SamplingBatch,
    draft_probs: torch.Tensor | None = None,
    synthetic: SyntheticAcceptance | None = None,
    triton_device_types: Collection[str] = TRITON_DEVICE_TYPES,
) -> RejectionOutput:
    """target_logits [T, V] float32 (modified in place), T = D + R; draft_token_ids [D] int64;
    cu_num_draft_tokens [R] int64; max_spec_len K >= every n_r; batch: the sampling parameters
    of the T rows (each request's repeated, its noise keys counting the row's position);
    draft_probs [D, V] (normalised) or None: one-hot drafts."""
    rows = _layout(draft_token_ids, cu_num_draft_tokens, target_logits.shape[0], max_spec_len)
    raw_logprobs = None if batch.num_logprobs is None else target_logits.log_softmax(dim=-1)
    logits = process_logits(target_logits, batch)
    argmax = logits.argmax(dim=-1)  # [T]
    valid = rows.draft >= 0  # [T]: a draft row with a real draft
    params = batch.random
    greedy_accept = valid & (rows.draft == argmax)  # [T]
    if params is None:
        accept, own = greedy_accept, argmax
    else:
        accept, own = _random_rows(
            logits, rows, valid, params, draft_probs, synthetic is None, triton_device_types
        )
        accept, own = _greedy_where(params.is_greedy, greedy_accept, argmax, accept, own)
    if synthetic is not None:
        rate = synthetic.rates[rows.position.clamp(max=synthetic.rates.shape[0] - 1)]  # [T]
        accept = valid & (_uniforms(synthetic.keys) < rate)
    token = torch.where(accept, rows.draft, own)  # [T]: greedy rows: the argmax either way
    if target_logits.device.type in triton_device_types:
        scanned = triton_accept_scan(accept, token, rows.draft, cu_num_draft_tokens, max_spec_len)
        out = RejectionOutput(*scanned, row_token_ids=token)
    else:
        out = _scan(accept, token, rows, valid)
    if raw_logprobs is not None:
        out.logprobs = gather_logprobs(raw_logprobs, out.row_token_ids, batch.num_logprobs)
    return out


def _layout(draft_ids: torch.Tensor, cu: torch.Tensor, num_rows: int, max_spec_len: int) -> _Rows:
    """Index arithmetic only (searchsorted, no repeat_interleave sync)."""
    device = cu.device
    num_reqs = cu.shape[0]
    num_drafts = torch.diff(cu, prepend=cu.new_zeros(1))  # [R]
    first_row = cu - num_drafts + torch.arange(num_reqs, device=device)  # [R]
    positions = torch.arange(max_spec_len + 1, device=device)  # [K + 1]
    target_row = first_row[:, None] + torch.minimum(positions[None, :], num_drafts[:, None])
    flat = torch.arange(num_rows, device=device)  # [T]
    request = torch.searchsorted(first_row + num_drafts + 1, flat, right=True)  # [T]
    request = request.clamp_(max=num_reqs - 1)
    position = flat - first_row[request]  # [T]
    is_draft = position < num_drafts[request]
    draft_index = cu[request] - num_drafts[request] + position
    draft_index = torch.where(is_draft, draft_index, draft_ids.shape[0])  # [T]
    padded = torch.cat([draft_ids, draft_ids.new_full((1,), NO_DRAFT)])  # [D + 1]: D may be 0
    return _Rows(target_row, num_drafts, position, draft_index, padded[draft_index])


def _random_rows(
    logits: torch.Tensor,
    rows: _Rows,
    valid: torch.Tensor,
    params: RandomParams,
    draft_probs: torch.Tensor | None,
    residual: bool,
    triton_device_types: Collection[str],
) -> tuple[torch.Tensor, torch.Tensor]:
    """accept [T] bool and the target's own token [T] int64 (what a refused row emits: a draw
    from the residual max(0, p - q) on draft rows, from p on bonus rows and where `residual` is
    False, synthetic) for random rows; logits [T, V] become p (normalised)."""
    probs = unnormalised_probs(logits, params.temperature)  # [T, V], in place
    threshold = truncation_threshold(probs, params, probs.device.type in triton_device_types)
    if threshold is not None:
        truncate(probs, threshold)
    probs.div_(probs.sum(dim=-1, keepdim=True))  # p, [T, V]
    draft = rows.draft.clamp(min=0)[:, None]  # [T, 1]
    p_draft = torch.where(valid, probs.gather(1, draft).squeeze(1), 0.0)  # [T]
    if draft_probs is None:
        q_draft = torch.ones_like(p_draft)
        if residual:  # max(0, p - one_hot(d)): p with d zeroed, on draft rows only
            probs.scatter_(1, draft, torch.where(valid, 0.0, p_draft)[:, None])
    else:
        q = _draft_rows(draft_probs, rows, valid)  # [T, V]: 0 on bonus rows
        q_draft = q.gather(1, draft).squeeze(1)
        if residual:
            probs.sub_(q).clamp_(min=0.0)
    accept = valid & (_uniforms(params.noise_keys) * q_draft <= p_draft)
    drawn = gumbel_draw(probs, params.noise_keys)  # [T]
    # a residual of no mass is never needed (p <= q nowhere: every draft accepted); keep ids sane
    drawn = torch.where(probs.sum(dim=-1) > 0, drawn, rows.draft.clamp(min=0))
    return accept, drawn


def _draft_rows(draft_probs: torch.Tensor, rows: _Rows, valid: torch.Tensor) -> torch.Tensor:
    """draft_probs [D, V] at the T target rows: [T, V], zero on bonus rows and where the draft
    is NO_DRAFT (their emitted token is then a draw from p itself)."""
    num_drafts = draft_probs.shape[0]
    if num_drafts == 0:
        return draft_probs.new_zeros(rows.draft.shape[0], draft_probs.shape[1])
    q = draft_probs.index_select(0, rows.draft_index.clamp(max=num_drafts - 1))  # [T, V]
    return q.mul_(valid[:, None])


def _greedy_where(
    is_greedy: torch.Tensor | None,
    greedy_accept: torch.Tensor,
    greedy_token: torch.Tensor,
    accept: torch.Tensor,
    token: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's greedy or random verdict; is_greedy [T] (None: no greedy row)."""
    if is_greedy is None:
        return accept, token
    return (
        torch.where(is_greedy, greedy_accept, accept),
        torch.where(is_greedy, greedy_token, token),
    )


def _uniforms(keys: torch.Tensor) -> torch.Tensor:
    """[T] float32 in (0, 1), a function of each key alone, independent of the draw's noise."""
    return exponential_noise(keys ^ _ACCEPT_SALT, 1)[:, 0].neg_().exp_()


def _scan(
    accept: torch.Tensor, token: torch.Tensor, rows: _Rows, valid: torch.Tensor
) -> RejectionOutput:
    """Per request: the drafts accepted before the first refusal, then that row's token."""
    max_spec_len = rows.target_row.shape[1] - 1
    draft_rows = rows.target_row[:, :max_spec_len]  # [R, K]
    in_request = torch.arange(max_spec_len, device=accept.device) < rows.num_drafts[:, None]
    accepted = (accept[draft_rows] & in_request).to(torch.int64)  # [R, K]
    num_accepted = accepted.cumprod(dim=1).sum(dim=1)  # [R]
    positions = torch.arange(max_spec_len + 1, device=accept.device)  # [K + 1]
    emitted = positions[None, :] <= num_accepted[:, None]  # [R, K + 1]
    token_ids = torch.where(emitted, token[rows.target_row], NO_DRAFT)
    num_valid = (valid[draft_rows] & in_request).sum(dim=1)
    return RejectionOutput(token_ids, num_accepted, num_valid, token)
