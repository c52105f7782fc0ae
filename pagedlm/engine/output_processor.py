"""EngineCoreOutput → RequestOutput: detokenise, check stop strings, gather parallel samples.

A user request with `n` samples is `n` core requests (`f"{id}_{i}"`, or just `id` when n=1);
their outputs are gathered into one RequestOutput whose `outputs[i]` is sample i.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from pagedlm.core.sched_output import EngineCoreOutput, Logprobs
from pagedlm.engine.detokenizer import IncrementalDetokenizer
from pagedlm.engine.tokenizer import Tokenizer
from pagedlm.errors import InvalidRequest
from pagedlm.outputs import (
    CompletionOutput,
    Logprob,
    PromptLogprobs,
    RequestMetrics,
    RequestOutput,
    SampleLogprobs,
    WeightVersionSpan,
)
from pagedlm.sampling_params import SamplingParams
from pagedlm.spec_decode.metrics import RequestSpecStats


def core_request_ids(request_id: str, n: int) -> list[str]:
    return [request_id] if n == 1 else [f"{request_id}_{i}" for i in range(n)]


@dataclass
class _SampleState:
    """One core request: its tokens, text and end."""

    index: int
    detokenizer: IncrementalDetokenizer | None
    want_logprobs: bool
    token_ids: list[int] = field(default_factory=list)
    logprobs: SampleLogprobs = field(default_factory=list)
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    weight_versions: list[WeightVersionSpan] = field(default_factory=list)
    spec: RequestSpecStats | None = None  # speculative decoding's acceptance

    def to_output(self) -> CompletionOutput:
        finished = self.finish_reason is not None
        text = self.detokenizer.output_text(finished) if self.detokenizer else ""
        return CompletionOutput(
            index=self.index,
            text=text,
            token_ids=list(self.token_ids),
            cumulative_logprob=self.cumulative_logprob if self.want_logprobs else None,
            logprobs=list(self.logprobs) if self.want_logprobs else None,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            weight_versions=list(self.weight_versions),
            spec_decode_metrics=None if self.spec is None else self.spec.metrics(),
        )

    def record_version(self, version: str | None, num_before: int) -> None:
        """The tokens appended since num_before came from `version`: extend the last span if it is
        that version's, else open a new one."""
        num_tokens = len(self.token_ids)
        if version is None or num_tokens == num_before:
            return
        spans = self.weight_versions
        if spans and spans[-1].version == version and spans[-1].end == num_before:
            spans[-1] = WeightVersionSpan(version, spans[-1].start, num_tokens)
        else:
            spans.append(WeightVersionSpan(version, num_before, num_tokens))


@dataclass
class _RequestState:
    """One user request: its prompt and its n samples."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    samples: list[_SampleState]
    metrics: RequestMetrics
    want_prompt_logprobs: bool
    final_only: bool  # no RequestOutput until it finishes (offline generate)
    prompt_logprobs: PromptLogprobs = field(default_factory=list)
    num_cached_tokens: int = 0
    error: str | None = None  # a sample the core failed (e.g. its grammar did not compile)

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.samples)

    def to_output(self) -> RequestOutput:
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=[s.to_output() for s in self.samples],
            finished=self.finished,
            metrics=self.metrics,
            prompt_logprobs=self.prompt_logprobs if self.want_prompt_logprobs else None,
            num_cached_tokens=self.num_cached_tokens,
            error=self.error,
        )


@dataclass
class ProcessedOutputs:
    request_outputs: list[RequestOutput]
    # Core requests a stop string finished: the core must free them.
    reqs_to_finish: list[str]


class OutputProcessor:
    def __init__(
        self, tokenizer: Tokenizer | None, spec_metrics: tuple[int, str] | None = None
    ) -> None:
        """spec_metrics: (k, none | summary | detailed) with speculative decoding."""
        self._tokenizer = tokenizer
        self._spec_metrics = (
            None if spec_metrics is None or spec_metrics[1] == "none" else spec_metrics
        )
        self._requests: dict[str, _RequestState] = {}
        # core request id -> (its user request, its sample)
        self._samples: dict[str, tuple[_RequestState, _SampleState]] = {}

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float,
        prime_token_ids: list[int],
        final_only: bool = False,
    ) -> list[str]:
        """Registers a user request; returns its core request ids. `prime_token_ids`: the
        prompt tokens the detokenizer decodes the first output tokens after."""
        core_ids = core_request_ids(request_id, params.n)
        if request_id in self._requests or any(core_id in self._samples for core_id in core_ids):
            raise InvalidRequest(f"request_id {request_id!r} is already in use", param="request_id")
        samples = [self._new_sample(i, params, prime_token_ids) for i in range(params.n)]
        state = _RequestState(
            request_id=request_id,
            prompt=prompt,
            prompt_token_ids=prompt_token_ids,
            samples=samples,
            metrics=RequestMetrics(arrival_time=arrival_time),
            want_prompt_logprobs=params.prompt_logprobs is not None,
            final_only=final_only,
        )
        self._requests[request_id] = state
        for core_id, sample in zip(core_ids, samples):
            self._samples[core_id] = (state, sample)
        return core_ids

    def _new_sample(
        self, index: int, params: SamplingParams, prime_token_ids: list[int]
    ) -> _SampleState:
        detokenizer = None
        if self._tokenizer is not None and params.detokenize:
            detokenizer = IncrementalDetokenizer(self._tokenizer, prime_token_ids, params)
        spec = None
        if self._spec_metrics is not None:
            k, mode = self._spec_metrics
            spec = RequestSpecStats(k, detailed=mode == "detailed")
        return _SampleState(
            index=index,
            detokenizer=detokenizer,
            want_logprobs=params.logprobs is not None,
            spec=spec,
        )

    def num_unfinished_requests(self) -> int:
        return len(self._requests)

    def abort_requests(self, request_ids: list[str]) -> list[str]:
        """Forgets the user requests; returns their unfinished core request ids."""
        core_ids = []
        for request_id in request_ids:
            state = self._requests.pop(request_id, None)
            if state is None:
                continue
            n = len(state.samples)
            for core_id in core_request_ids(request_id, n):
                if self._samples.pop(core_id, None) is not None:
                    core_ids.append(core_id)
        return core_ids

    def process_outputs(self, core_outputs: list[EngineCoreOutput]) -> ProcessedOutputs:
        now = time.time()
        updated: dict[str, _RequestState] = {}
        reqs_to_finish: list[str] = []
        for out in core_outputs:
            entry = self._samples.get(out.req_id)
            if entry is None:  # finished by a stop string or aborted while a step was in flight
                continue
            state, sample = entry
            state.error = state.error or out.error
            self._update_request(state, out, now)
            if self._update_sample(sample, out) and not out.finished:
                reqs_to_finish.append(out.req_id)
            if sample.finish_reason is not None:
                del self._samples[out.req_id]
                updated[state.request_id] = state
            elif not state.final_only:  # a final-only request has nothing to emit yet
                updated[state.request_id] = state
        return ProcessedOutputs(self._emit(updated.values(), now), reqs_to_finish)

    def _emit(self, states: Iterable[_RequestState], now: float) -> list[RequestOutput]:
        outputs = []
        for state in states:
            if state.finished:
                state.metrics.finished_time = now
                del self._requests[state.request_id]
            elif state.final_only:
                continue  # building outputs every step costs O(length) per request
            outputs.append(state.to_output())
        return outputs

    def _update_request(self, state: _RequestState, out: EngineCoreOutput, now: float) -> None:
        metrics = state.metrics
        if out.new_token_ids:
            if metrics.first_token_time is None:
                metrics.first_token_time = now
            metrics.last_token_time = now
        state.num_cached_tokens = max(state.num_cached_tokens, out.num_cached_tokens)
        if out.prompt_logprobs is not None and state.want_prompt_logprobs:
            state.prompt_logprobs.extend(self._to_logprob_dict(lp) for lp in out.prompt_logprobs)

    def _update_sample(self, sample: _SampleState, out: EngineCoreOutput) -> bool:
        """Appends the new tokens up to a stop string; True when a stop string ended it."""
        num_before = len(sample.token_ids)
        if sample.spec is not None and out.num_draft_tokens:
            sample.spec.record(out.num_draft_tokens, out.num_accepted_draft_tokens)
        stopped = self._append_tokens(sample, out)
        sample.record_version(out.weight_version, num_before)
        return stopped

    def _append_tokens(self, sample: _SampleState, out: EngineCoreOutput) -> bool:
        for i, token_id in enumerate(out.new_token_ids):
            sample.token_ids.append(token_id)
            if sample.want_logprobs and out.new_logprobs is not None:
                self._append_logprobs(sample, out.new_logprobs[i])
            # the core stopped at this token: EOS (stop_reason None) or a stop token id
            ends_request = (
                out.finish_reason == "stop"
                and i == len(out.new_token_ids) - 1
                and out.stop_reason in (None, token_id)
            )
            stop = sample.detokenizer.push(token_id, ends_request) if sample.detokenizer else None
            if stop is not None:
                sample.finish_reason, sample.stop_reason = "stop", stop
                return True
        if out.finished:
            sample.finish_reason, sample.stop_reason = out.finish_reason, out.stop_reason
        return False

    def _append_logprobs(self, sample: _SampleState, logprobs: Logprobs) -> None:
        sample.logprobs.append(self._to_logprob_dict(logprobs))
        sample.cumulative_logprob += logprobs.logprobs[0]

    def _to_logprob_dict(self, logprobs: Logprobs | None) -> dict[int, Logprob] | None:
        """Sampled token (with its rank) first, then the top-N ranked 1..N."""
        if logprobs is None:
            return None
        ranks = [logprobs.sampled_rank] + list(range(1, len(logprobs.token_ids)))
        result: dict[int, Logprob] = {}
        for token_id, logprob, rank in zip(logprobs.token_ids, logprobs.logprobs, ranks):
            if token_id not in result:
                result[token_id] = Logprob(
                    logprob=logprob, rank=rank, decoded_token=self._decode_token(token_id)
                )
        return result

    def _decode_token(self, token_id: int) -> str | None:
        return self._tokenizer.decode([token_id]) if self._tokenizer is not None else None
