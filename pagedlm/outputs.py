"""What users get back: RequestOutput and CompletionOutput, as in vLLM."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedlm.spec_decode.metrics import SpecDecodeMetrics


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# Per position: token id -> Logprob (the sampled token and the top-N).
SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass(slots=True)
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None


@dataclass(slots=True, frozen=True)
class WeightVersionSpan:
    """Output tokens [start, end) were sampled by the weights of `version` (vLLM's shape)."""

    version: str
    start: int
    end: int


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: SampleLogprobs | None = None
    finish_reason: str | None = None  # stop | length | abort
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it
    # which weights sampled which tokens, in token order; spans cover every token, none overlap
    weight_versions: list[WeightVersionSpan] = field(default_factory=list)
    # speculative decoding: this sample's draft acceptance (None: off, or per-request metrics off)
    spec_decode_metrics: SpecDecodeMetrics | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    prompt_logprobs: PromptLogprobs | None = None
    num_cached_tokens: int = 0
    error: str | None = field(default=None)  # set when the request failed on its own
