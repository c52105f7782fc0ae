"""The planner's side of speculative decoding: how many drafts a request verifies in a step, and
what a verify step's output does to it (imports neither torch nor triton).

A decoding request (every token but its last computed, no token in flight) with d drafts held by
the worker (the count came back with its last output) is scheduled 1 + n positions, n = min(d,
k of this batch size, the budget left - 1, max_tokens - outputs - 1, max_model_len - tokens -
1): its last token and n drafts, so it never emits past max_tokens or max_model_len. After the
step it emitted 1 + a tokens (a accepted drafts); num_computed_tokens drops by n - a, so the KV
of the rejected positions is written over by the next step, and the blocks only they took go back
(KVCacheManager.trim; CachedRequestData.num_blocks tells the worker). The prefix cache only
hashes known tokens (KVCacheManager), so never a draft.

Async scheduling: a request that may speculate is not scheduled while a step of it is in flight
(its next positions depend on how many drafts that step accepts), as a constrained request waits
for its token; other requests keep the pipeline full.

Requests with penalties or bad words speculate: the worker's sampler reads each verify
position's history as the outputs plus the drafts before it (sample/state.py make_batch).
Constrained ones (structured outputs) speculate too: their drafts come back with each output, the
longest prefix the grammar accepts is verified (the rest would be rejected anyway), and the engine
core fills a bitmask row for each of its positions (structured_outputs/manager.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedlm.request import Request, RequestStatus
from pagedlm.spec_decode.config import SpeculativeConfig
from pagedlm.spec_decode.metrics import SpecDecodeCounters


def _drafts_in_flight(request: Request) -> bool:
    """Its steps in flight computed positions past the tokens they will sample (their drafts):
    without drafts, num_computed_tokens == num_tokens + placeholders - 1 while decoding."""
    return request.num_computed_tokens >= request.num_tokens + request.num_output_placeholders


@dataclass(slots=True)
class SpecPlanner:
    """The scheduler's speculative state: the drafts the worker holds per request and the
    engine's counters (each request's own acceptance goes out with its outputs)."""

    config: SpeculativeConfig
    max_model_len: int
    counters: SpecDecodeCounters = field(init=False)
    _num_drafts: dict[str, int] = field(default_factory=dict)  # drafts the worker holds
    _draft_ids: dict[str, list[int]] = field(default_factory=dict)  # theirs, constrained requests

    def __post_init__(self) -> None:
        self.counters = SpecDecodeCounters(self.config.num_speculative_tokens)

    def waits(self, request: Request, batch_size: int) -> bool:
        """A request that may speculate waits while a step of it is in flight; one whose step
        in flight verifies drafts waits whatever this batch's k (its next position depends on
        the verdict, even where the batch has grown past speculating)."""
        if request.num_output_placeholders == 0:
            return False
        return _drafts_in_flight(request) or self.config.num_spec_tokens_for_batch(batch_size) > 0

    def num_drafts(self, request: Request, batch_size: int, token_budget: int) -> int:
        """The drafts `request` verifies this step if it decodes (module notes)."""
        held = self._num_drafts.get(request.request_id, 0)
        if (
            held == 0
            or request.num_output_placeholders
            or request.num_computed_tokens != request.num_tokens - 1
        ):
            return 0
        num = max(
            min(
                held,
                self.config.num_spec_tokens_for_batch(batch_size),
                token_budget - 1,
                request.max_tokens - len(request.output_token_ids) - 1,
                self.max_model_len - request.num_tokens - 1,
            ),
            0,
        )
        grammar = request.structured_output
        if grammar is not None and num:  # the drafts its grammar accepts (the bitmask's rows)
            num = grammar.schedule_drafts(self._draft_ids[request.request_id][:num])
        return num

    def verified(
        self,
        request: Request,
        num_drafts: int,
        num_emitted: int,
        num_held_next: int | None,
        held_ids: list[int] | None = None,
    ) -> int:
        """A step of `request` verified num_drafts drafts and emitted num_emitted tokens; the
        worker now holds num_held_next drafts for it (None: none), held_ids (kept for a
        constrained request). Returns the accepted drafts."""
        self._num_drafts[request.request_id] = num_held_next or 0
        if request.structured_output is not None and num_held_next:
            self._draft_ids[request.request_id] = held_ids or []  # none known: none verified
        if num_drafts == 0:
            return 0
        num_accepted = num_emitted - 1
        if not 0 <= num_accepted <= num_drafts:
            raise ValueError(
                f"request {request.request_id}: {num_emitted} tokens for {num_drafts} drafts"
            )
        if request.status == RequestStatus.RUNNING:  # a preempted one recomputes from 0 anyway
            request.num_computed_tokens -= num_drafts - num_accepted
        self.counters.record_one(num_drafts, num_accepted)
        return num_accepted

    def forget(self, req_id: str) -> None:
        """The request left the worker (finished or preempted): its drafts are gone."""
        self._num_drafts.pop(req_id, None)
        self._draft_ids.pop(req_id, None)
