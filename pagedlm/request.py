"""A request as the engine core sees it: token ids, progress, status, token-level stop checks."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pagedlm.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch

    from pagedlm.structured_outputs.manager import GrammarState


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    # Everything from here on is finished.
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5

    @property
    def finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


@dataclass(slots=True, eq=False)
class Request:
    """One sequence to generate. `num_computed_tokens` counts tokens whose KV is written (or
    will be, by steps already scheduled); `num_output_placeholders` counts tokens that steps
    in flight will sample but whose values the host has not seen yet (async scheduling)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()
    max_tokens: int = 16  # resolved against max_model_len by the engine
    arrival_time: float = field(default_factory=time.time)
    priority: int = 0
    prompt_embeds: torch.Tensor | None = None  # [num_prompt_tokens, hidden_size]
    cache_salt: str | None = None  # prefix-cache hits only between requests with an equal salt
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_output_placeholders: int = 0
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | str | None = None
    num_cached_tokens: int = -1  # prefix-cache hit of the first schedule, in tokens
    num_preemptions: int = 0
    block_hashes: list[bytes] = field(
        default_factory=list
    )  # hash chain of full blocks (core/block_hash.py)
    first_scheduled_time: float | None = None
    # Its constraint's compile and matcher (structured outputs; set by the engine core).
    structured_output: GrammarState | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Tokens whose values the host knows (prompt + received outputs)."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)

    def check_stop(self, max_model_len: int) -> RequestStatus | None:
        """Token-level stop after the last appended token; stop strings are the detokenizer's."""
        params = self.sampling_params
        num_out = self.num_output_tokens
        if num_out >= params.min_tokens and num_out > 0:
            last = self.output_token_ids[-1]
            if not params.ignore_eos and last in self.eos_token_ids:
                self.stop_reason = None
                return RequestStatus.FINISHED_STOPPED
            if last in params.stop_token_ids:
                self.stop_reason = last
                return RequestStatus.FINISHED_STOPPED
        if num_out >= self.max_tokens or self.num_tokens >= max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None
