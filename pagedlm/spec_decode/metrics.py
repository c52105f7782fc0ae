"""Acceptance accounting, with vLLM's definitions; numpy and Python only (host side).

A spec step of a request is a step that verified at least one of its drafts; steps without
drafts count nowhere. mean_acceptance_length = 1 + accepted / spec steps (the bonus or
recovered token included), draft_acceptance_rate = accepted / drafted, acceptance_histogram[j]
= spec steps that accepted exactly j drafts (length k + 1). The engine-wide counters are the sums
of the same numbers over requests, so the two reconcile.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

PREFIX = "pagedlm:spec_decode_"
NUM_DRAFTS = PREFIX + "num_drafts"  # spec steps, over requests
NUM_DRAFT_TOKENS = PREFIX + "num_draft_tokens"
NUM_ACCEPTED_TOKENS = PREFIX + "num_accepted_tokens"
NUM_ACCEPTED_TOKENS_PER_POS = PREFIX + "num_accepted_tokens_per_pos"  # label: position


@dataclass(frozen=True, slots=True)
class SpecDecodeMetrics:
    """One request's, as CompletionOutput.spec_decode_metrics and the HTTP response's
    metrics.speculative_decoding."""

    mean_acceptance_length: float
    draft_acceptance_rate: float
    num_spec_steps: int
    num_draft_tokens: int
    num_accepted_draft_tokens: int
    acceptance_histogram: tuple[int, ...]  # [k + 1]
    per_step_accepted: tuple[int, ...] | None = None  # detailed only
    per_step_drafted: tuple[int, ...] | None = None  # detailed only

    def to_dict(self) -> dict:
        out = {
            "mean_acceptance_length": self.mean_acceptance_length,
            "draft_acceptance_rate": self.draft_acceptance_rate,
            "num_spec_steps": self.num_spec_steps,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_draft_tokens": self.num_accepted_draft_tokens,
            "acceptance_histogram": list(self.acceptance_histogram),
        }
        if self.per_step_accepted is not None:
            out["per_step_accepted"] = list(self.per_step_accepted)
            out["per_step_drafted"] = list(self.per_step_drafted or ())
        return out


@dataclass(slots=True)
class RequestSpecStats:
    """A request's running totals; `detailed` also keeps each spec step."""

    num_speculative_tokens: int  # k
    detailed: bool = False
    num_spec_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted: int = 0
    histogram: list[int] = field(default_factory=list)
    per_step_accepted: list[int] = field(default_factory=list)
    per_step_drafted: list[int] = field(default_factory=list)

    def record(self, num_drafts: int, num_accepted: int) -> None:
        if num_drafts <= 0:
            return
        if not 0 <= num_accepted <= num_drafts <= self.num_speculative_tokens:
            raise ValueError(
                f"accepted {num_accepted} of {num_drafts} drafts, k {self.num_speculative_tokens}"
            )
        if not self.histogram:
            self.histogram = [0] * (self.num_speculative_tokens + 1)
        self.num_spec_steps += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted += num_accepted
        self.histogram[num_accepted] += 1
        if self.detailed:
            self.per_step_accepted.append(num_accepted)
            self.per_step_drafted.append(num_drafts)

    def metrics(self) -> SpecDecodeMetrics:
        steps, drafted = self.num_spec_steps, self.num_draft_tokens
        return SpecDecodeMetrics(
            mean_acceptance_length=1.0 + self.num_accepted / steps if steps else 1.0,
            draft_acceptance_rate=self.num_accepted / drafted if drafted else 0.0,
            num_spec_steps=steps,
            num_draft_tokens=drafted,
            num_accepted_draft_tokens=self.num_accepted,
            acceptance_histogram=tuple(self.histogram or [0] * (self.num_speculative_tokens + 1)),
            per_step_accepted=tuple(self.per_step_accepted) if self.detailed else None,
            per_step_drafted=tuple(self.per_step_drafted) if self.detailed else None,
        )


@dataclass(slots=True)
class SpecDecodeCounters:
    """The engine's counters (Prometheus, under the names above), from each request's verdicts
    (the scheduler's, core/spec_plan.py)."""

    num_speculative_tokens: int  # k
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: np.ndarray = field(init=False)  # [k] int64

    def __post_init__(self) -> None:
        self.accepted_per_pos = np.zeros(self.num_speculative_tokens, dtype=np.int64)

    def record_one(self, num_drafts: int, num_accepted: int) -> None:
        """One request's spec step (num_drafts > 0)."""
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        self.accepted_per_pos[:num_accepted] += 1

    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0
