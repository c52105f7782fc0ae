"""One sampling step on the device, for a batch whose parameters the host has laid out.

Order, as in vLLM: logprobs from the raw logits; allowed_token_ids; bad words; min_tokens bans; logit_bias;
penalties; greedy rows take the argmax here. Random rows then become unnormalised probabilities
exp((logit - max) / temperature) (in place), min-p, top-k and top-p give one threshold per row
(filters.py, no sort), and a two-stage Gumbel-max draws from what stays (gumbel.py), with
counter-based noise (noise.py). On CUDA, a batch without min-p, top-k and top-p skips the probs
and draws with the same blocks and noise in two Triton kernels (triton_draw.py); one with top-k
or top-p (min-p then its floor) finds the threshold in one Triton kernel (triton_threshold.py) instead of filters.py's
radix select, unless every row has a top-k of at most filters.TOP_K_LIMIT (torch.topk's values
then give the cuts, faster).
A feature no row of the batch uses is None in the batch and launches nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch

from pagedlm.ops.warm_up import WarmUpRequest, WarmUpTarget
from pagedlm.sample.bad_words import BadWords, apply_bad_words
from pagedlm.sample.filters import TOP_K_LIMIT, TopKTopP, top_k_top_p_threshold, truncate
from pagedlm.sample.gumbel import gumbel_draw
from pagedlm.sample.penalties import apply_penalties
from pagedlm.sample.triton_draw import fused_gumbel_draw
from pagedlm.sample.triton_threshold import triton_top_k_top_p_threshold

Logprobs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
# Device types the Triton kernels (the fused draw, the threshold) serve; elsewhere the torch paths.
# Tests add "cpu": the kernels then run in the Triton interpreter.
TRITON_DEVICE_TYPES = frozenset({"cuda"})


@dataclass(slots=True)
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [N] int64, device
    # token_ids [N, 1 + K] int64 (sampled first, then the top-K), logprobs [N, 1 + K] float32,
    # ranks [N] int64 (1-based rank of the sampled token); K = max requested in the batch,
    # at most the vocabulary size.
    logprobs: Logprobs | None = None


@dataclass(slots=True)
class TokenLists:
    """Per-row token-id lists of the batch rows that use a feature."""

    index: torch.Tensor | None  # [M] int64: positions in the batch (distinct); None: all rows
    token_ids: torch.Tensor  # [M, W] int64, padded with one of the row's own ids
    values: torch.Tensor | None = None  # [M, W] float32 (logit_bias), 0 on padding


@dataclass(slots=True)
class Penalties:
    index: torch.Tensor | None  # [M] int64: positions in the batch; None: all rows
    rows: torch.Tensor  # [M] int64: persistent rows (to record the sampled tokens)
    positions: torch.Tensor  # [M] int64: where each row's history takes the token sampled now
    token_ids: torch.Tensor  # [M, W] int64: prompt and output ids, repeats allowed
    counts: torch.Tensor  # [M, W] int32: how often each of them was sampled
    repetition: torch.Tensor  # [M] float32
    frequency: torch.Tensor  # [M] float32
    presence: torch.Tensor  # [M] float32


@dataclass(slots=True)
class RandomParams:
    noise_keys: torch.Tensor  # [N] int64: noise.row_keys_np of (seed, tokens sampled so far)
    is_greedy: torch.Tensor | None = None  # [N] bool; None: no greedy row in the batch
    temperature: torch.Tensor | None = None  # [N] float32, 1 on rows that keep the logits
    min_p: torch.Tensor | None = None  # [N] float32, 0: off
    top_k_top_p: TopKTopP | None = None


@dataclass(slots=True)
class SamplingBatch:
    """One step's sampling parameters on the device; None: no row of the batch uses it."""

    num_logprobs: int | None = None  # K
    allowed: TokenLists | None = None
    bad_words: BadWords | None = None
    banned: TokenLists | None = None  # min_tokens: EOS and stop ids, while too few outputs
    bias: TokenLists | None = None
    penalties: Penalties | None = None
    random: RandomParams | None = None  # None: every row is greedy


def sample_batch(
    logits: torch.Tensor,
    batch: SamplingBatch,
    triton_device_types: Collection[str] = TRITON_DEVICE_TYPES,
) -> SamplerOutput:
    """logits [N, V] float32, modified in place."""
    raw_logprobs = None if batch.num_logprobs is None else logits.log_softmax(dim=-1)  # [N, V]
    logits = process_logits(logits, batch)
    sampled = draw(logits, batch.random, triton_device_types)
    if raw_logprobs is None:
        return SamplerOutput(sampled)
    return SamplerOutput(sampled, gather_logprobs(raw_logprobs, sampled, batch.num_logprobs))


def process_logits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Masks, bias and penalties: what greedy rows take the argmax of. [N, V], in place."""
    allowed, banned, bias, pen = batch.allowed, batch.banned, batch.bias, batch.penalties
    if allowed is not None:
        _on_rows(logits, allowed.index, lambda sub: _allow_only(sub, allowed.token_ids))
    if batch.bad_words is not None:
        bad = batch.bad_words
        _on_rows(
            logits,
            bad.index,
            lambda sub: apply_bad_words(sub, bad.history, bad.prefixes, bad.last_ids),
        )
    if banned is not None:
        _on_rows(logits, banned.index, lambda sub: sub.scatter_(1, banned.token_ids, float("-inf")))
    if bias is not None:
        _on_rows(logits, bias.index, lambda sub: sub.scatter_add_(1, bias.token_ids, bias.values))
    if pen is not None:
        apply_penalties(
            logits,
            pen.index,
            pen.token_ids,
            pen.counts,
            pen.repetition,
            pen.frequency,
            pen.presence,
        )
    return logits


def draw(
    logits: torch.Tensor,
    params: RandomParams | None,
    triton_device_types: Collection[str] = TRITON_DEVICE_TYPES,
) -> torch.Tensor:
    """Processed logits [N, V] (the torch path modifies them) -> sampled token ids [N] int64."""
    if params is None:
        return logits.argmax(dim=-1)
    greedy_ids = None if params.is_greedy is None else logits.argmax(dim=-1)  # [N]
    triton = logits.device.type in triton_device_types
    if triton and _fused_draw_serves(params):
        random_ids = fused_gumbel_draw(logits, params.temperature, params.noise_keys)  # [N]
    else:
        probs = unnormalised_probs(logits, params.temperature)  # [N, V], the same memory
        threshold = truncation_threshold(probs, params, triton)  # [N]
        if threshold is not None:
            truncate(probs, threshold)
        random_ids = gumbel_draw(probs, params.noise_keys)  # [N]
    if greedy_ids is None:
        return random_ids
    return torch.where(params.is_greedy, greedy_ids, random_ids)


def _fused_draw_serves(params: RandomParams) -> bool:
    """The fused Triton draw (one read of the logits) serves batches without min-p, top-k or top-p."""
    return params.min_p is None and params.top_k_top_p is None


# ops/warm_up.py: the fused draw with a temperature and without one; top-p's threshold kernel (a batch
# where every row has a top-k of at most TOP_K_LIMIT takes torch.topk's path instead)
WARM_UP_REQUESTS = (
    WarmUpRequest(2, "the fused draw with a temperature", temperature=0.7),
    WarmUpRequest(2, "the fused draw without a temperature", temperature=1.0),
    WarmUpRequest(2, "the threshold kernel without a min-p floor", temperature=1.0, top_p=0.9),
)


def unnormalised_probs(logits: torch.Tensor, temperature: torch.Tensor | None) -> torch.Tensor:
    """In place: logits [N, V] -> exp((logits - max) / temperature), in [0, 1], 1 at the top."""
    logits.sub_(logits.amax(dim=-1, keepdim=True))
    if temperature is not None:
        logits.div_(temperature[:, None])
    return logits.exp_()


def truncation_threshold(
    probs: torch.Tensor, params: RandomParams, triton: bool
) -> torch.Tensor | None:
    """[N]: min-p, top-k and top-p keep the ids with probs >= it; None: no row truncates. triton:
    whether the threshold kernel serves probs' device."""
    floor, tktp = params.min_p, params.top_k_top_p  # min-p keeps probs >= min_p
    if tktp is None:
        return floor
    threshold_of = _threshold_function(tktp, triton)
    if tktp.index is None:
        return threshold_of(probs, floor, tktp)
    sub_floor = None if floor is None else floor.index_select(0, tktp.index)
    threshold = threshold_of(probs.index_select(0, tktp.index), sub_floor, tktp)  # [M]
    base = probs.new_zeros(probs.shape[0]) if floor is None else floor
    return base.index_copy(0, tktp.index, threshold)


def _threshold_function(
    tktp: TopKTopP, triton: bool
) -> Callable[[torch.Tensor, torch.Tensor | None, TopKTopP], torch.Tensor]:
    """The Triton kernel (triton_threshold.py) where it serves the device, except where every row has
    a top-k of at most TOP_K_LIMIT: torch.topk's values then give the cuts faster (measured:
    benchmarks/RESULTS.md, "Measured choices")."""
    topk_values = tktp.every_row_top_k and 0 < tktp.max_top_k <= TOP_K_LIMIT
    if triton and not topk_values:
        return triton_top_k_top_p_threshold
    return top_k_top_p_threshold


def warm_up_threshold_kernel(target: WarmUpTarget) -> None:
    """ops/warm_up.py: the threshold kernel on one row of the vocabulary's size, without a min-p floor
    and with one (a row with min-p and top-p, or in a batch where some row has no top-k: no short
    warm-up request reaches the floored one)."""
    device = target.device
    params = TopKTopP(
        index=None,
        top_k=torch.ones(1, dtype=torch.int64, device=device),
        top_p=torch.full((1,), 0.5, device=device),
        max_top_k=1,
        every_row_top_k=False,
        any_top_p=True,
    )
    probs = torch.ones(1, target.vocab_size, device=device)
    for floor in (None, torch.zeros(1, device=device)):
        triton_top_k_top_p_threshold(probs, floor, params)


def gather_logprobs(
    raw_logprobs: torch.Tensor, sampled: torch.Tensor, num_logprobs: int
) -> Logprobs:
    """raw_logprobs [N, V], sampled [N] -> (token_ids [N, 1+K], logprobs [N, 1+K], ranks [N]),
    K = min(num_logprobs, V): a request asking for more than the vocabulary gets all of it."""
    sampled_logprobs = raw_logprobs.gather(1, sampled[:, None])  # [N, 1]
    ranks = (raw_logprobs >= sampled_logprobs).sum(dim=-1)  # [N]
    num_top = min(num_logprobs, raw_logprobs.shape[-1])
    top_logprobs, top_ids = raw_logprobs.topk(num_top, dim=-1)  # [N, K]
    token_ids = torch.cat([sampled[:, None], top_ids], dim=1)
    logprobs = torch.cat([sampled_logprobs, top_logprobs], dim=1)
    return token_ids, logprobs, ranks


def _on_rows(
    logits: torch.Tensor, index: torch.Tensor | None, fn: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    """Apply `fn` to the rows `index` [M] (distinct; None: all) of logits [N, V] only."""
    if index is not None:
        logits.index_copy_(0, index, fn(logits.index_select(0, index)))
        return
    out = fn(logits)
    if out is not logits:
        logits.copy_(out)


def _allow_only(logits: torch.Tensor, allowed_ids: torch.Tensor) -> torch.Tensor:
    """logits [M, V], allowed_ids [M, W]: every other token gets -inf."""
    mask = torch.full_like(logits, float("-inf")).scatter_(1, allowed_ids, 0.0)
    return logits.add_(mask)
