"""The typed messages between the planner (core/) and the executor (worker/).

SchedulerOutput goes down: new requests in full, requests already on the worker as diffs.
ModelRunnerOutput comes back: the tokens each sampling request drew this step.

A constraint of the contract, from a kernel: in a step where every request computes one token, no
request reads a KV block that another request of the same step fills. The split-decode kernel
(attention/triton_decode.py) reads earlier keys before its PDL wait, so possibly before this step's
KV writes (moving the read after the wait cost L2 2.8%: benchmarks/RESULTS.md, "Measured
choices"). KVCacheManager keeps a one-token query off blocks registered in the same step by a
one-token allocation (get_computed_blocks with the step's token_budget; the scheduler calls
begin_step at each step's start).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from pagedlm.sampling_params import SamplingParams

if TYPE_CHECKING:
    import numpy as np
    import torch


@dataclass(slots=True)
class GroupBlockUpdate:
    """A request's block table in KV cache group g >= 1 (core/kv_groups.py), as a diff."""

    new_block_ids: list[int]  # appended once the table is cut to num_blocks - len(new_block_ids)
    num_null_blocks: int  # its leading entries freed out of the group's sliding window
    num_blocks: int  # its entries after this update


@dataclass(slots=True)
class NewRequestData:
    """A request the worker has not seen (or sees again after preemption): everything it needs."""

    req_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # non-empty when resumed after preemption
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int  # tokens whose KV is already in the cache (prefix hit)
    prompt_embeds: torch.Tensor | None = None  # [num_prompt_tokens, hidden_size]
    # Models with several KV cache groups: groups 1.. (block_ids is group 0's), NULL_BLOCK_ID
    # where a group's window no longer needs a block
    group_block_ids: tuple[list[int], ...] = ()


@dataclass(slots=True)
class CachedRequestData:
    """A request already on the worker: only what changed."""

    req_id: str
    new_block_ids: list[int]  # appended to the request's block table
    num_computed_tokens: int  # before this step
    # Its leading block-table entries no longer read (freed out of a sliding window): the worker
    # points them to the null block. Never decreases while the request stays on the worker.
    num_null_blocks: int = 0
    # Its blocks once new_block_ids are appended (None: as many as the worker's plus those): fewer
    # when a speculative step's rejected tail gave blocks back (KVCacheManager.trim).
    num_blocks: int | None = None
    # Models with several KV cache groups: groups 1.. (the fields above are group 0's)
    groups: tuple[GroupBlockUpdate, ...] = ()


@dataclass(slots=True)
class GrammarBitmask:
    """The token bitmask of a step's constrained rows (structured outputs): bit j of row m allows
    token j for the step's `logits_rows[m]`-th sampling request (in batch order). The arrays
    are views of the worker's pinned staging rows for the step (ModelRunner.grammar_bitmask)."""

    logits_rows: np.ndarray  # [M] int64, increasing
    bitmask: np.ndarray  # [M, ceil(vocab_size / 32)] int32


@dataclass(slots=True)
class SchedulerOutput:
    new_reqs: list[NewRequestData]
    cached_reqs: list[CachedRequestData]
    # Tokens to compute this step per request; dict order is the batch order
    # (the worker lays requests out in this order).
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    # Requests that leave the worker before this step (finished, aborted or preempted).
    finished_req_ids: set[str] = field(default_factory=set)
    # Requests whose last scheduled token ends at their sequence end: they sample this step.
    # (A prefill chunk that stops short of the prompt's end does not sample.)
    sampling_req_ids: set[str] = field(default_factory=set)
    step_id: int = 0
    # Speculative decoding: requests whose last scheduled positions are that many drafts (the
    # worker's, verified this step; core/spec_plan.py). They sample.
    num_draft_tokens: dict[str, int] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0

    def __reduce__(self) -> tuple:
        """Pickled with its cached requests as columns (a list per field): TP's broadcast ring
        pickles one a step in the engine core, and a 256-request decode step cost ~0.7 ms as
        objects against ~0.1 ms as columns (2-core CPU)."""
        values = [getattr(self, f.name) for f in fields(self)]
        values[_CACHED_INDEX] = tuple(
            [getattr(request, name) for request in self.cached_reqs] for name in _CACHED_FIELDS
        )
        return _from_columns, tuple(values)


_CACHED_FIELDS = tuple(f.name for f in fields(CachedRequestData))
_CACHED_INDEX = [f.name for f in fields(SchedulerOutput)].index("cached_reqs")


def _from_columns(*values: object) -> SchedulerOutput:
    """SchedulerOutput.__reduce__'s inverse."""
    values = list(values)
    values[_CACHED_INDEX] = [CachedRequestData(*row) for row in zip(*values[_CACHED_INDEX])]
    return SchedulerOutput(*values)


@dataclass(slots=True)
class Logprobs:
    """Per sampled position: the sampled token's logprob and rank, plus the top-N."""

    token_ids: list[int]  # [1 + N]: sampled token first, then the top-N
    logprobs: list[float]  # [1 + N]
    sampled_rank: int  # 1-based rank of the sampled token


@dataclass(slots=True)
class ModelRunnerOutput:
    req_ids: list[str]  # requests that sampled this step, in batch order
    sampled_token_ids: list[list[int]]  # [num_reqs][tokens emitted: 1 + accepted drafts]
    logprobs: list[list[Logprobs]] | None = None  # parallel to sampled_token_ids, when asked
    prompt_logprobs: dict[str, list[Logprobs | None]] = field(default_factory=dict)
    step_id: int = 0
    # Speculative decoding: the drafts the worker now holds per request (parallel to req_ids),
    # and their ids (a constrained request's are checked against its grammar before they are
    # verified: core/spec_plan.py)
    num_draft_tokens: list[int] | None = None
    draft_token_ids: list[list[int]] | None = None


@dataclass(slots=True)
class EngineCoreOutput:
    """What the core reports per request after a step: new tokens, and the end if it came."""

    req_id: str
    new_token_ids: list[int]
    new_logprobs: list[Logprobs] | None = None
    prompt_logprobs: list[Logprobs | None] | None = None
    finish_reason: str | None = None  # stop | length | abort
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0  # prefix-cache hit, in tokens
    weight_version: str | None = None  # of the weights that produced new_token_ids
    error: str | None = None  # why the core failed the request (finish_reason "abort")
    num_draft_tokens: int = 0  # speculative decoding: drafts this step verified
    num_accepted_draft_tokens: int = 0  # of those, accepted

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
