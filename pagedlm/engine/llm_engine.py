"""LLMEngine: prompts in, RequestOutputs out; the engine core runs in the same process."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from pagedlm.config import EngineArgs, EngineConfig
from pagedlm.engine.engine_core import EngineCore
from pagedlm.engine.output_processor import OutputProcessor
from pagedlm.engine.tokenizer import bad_words_token_ids, encode_prompt, load_tokenizer
from pagedlm.errors import CONTEXT_LENGTH_EXCEEDED, InvalidRequest
from pagedlm.model.gguf_loader import one_parse
from pagedlm.outputs import RequestOutput
from pagedlm.request import Request
from pagedlm.sampling_params import SamplingParams
from pagedlm.structured_outputs.grammars import check_structured_outputs

if TYPE_CHECKING:
    from pagedlm.engine.data_parallel import DataParallelCores

# A string, token ids, {"prompt": str}, {"prompt_token_ids": [...]} (optionally with "prompt"),
# or {"prompt_embeds": Tensor [num_tokens, hidden_size]}; a dict may add "cache_salt": a non-empty
# string (vLLM's): prefix-cache hits only between requests with an equal salt (or none).
PromptType = str | list[int] | dict[str, Any]
_PROMPT_KEYS = {"prompt", "prompt_token_ids", "prompt_embeds", "cache_salt"}


@dataclass
class ProcessedRequest:
    """A validated request, ready to enter the engine."""

    prompt: str | None
    prompt_token_ids: list[int]
    prompt_embeds: torch.Tensor | None  # [num_prompt_tokens, hidden_size]
    params: SamplingParams
    max_tokens: int
    cache_salt: str | None = None


class LLMEngine:
    def __init__(self, config: EngineConfig, engine_core: EngineCore | None = None) -> None:
        """engine_core: the in-process core by default; the server passes a proxy to its core
        processes (same add/abort/step interface), which does the data parallelism itself."""
        self.config = config
        self.model_config = config.model
        self.tokenizer = load_tokenizer(config.model)
        self.engine_core = (
            engine_core if engine_core is not None else _make_core(config, self.tokenizer)
        )
        spec = config.speculative
        self.output_processor = OutputProcessor(
            self.tokenizer,
            None
            if spec is None
            else (spec.num_speculative_tokens, config.per_request_spec_decode_metrics),
        )
        self._held_outputs: list[RequestOutput] = []  # stepped by wait_for_requests, not yet given

    @classmethod
    def from_engine_args(cls, args: EngineArgs, engine_core: EngineCore | None = None) -> LLMEngine:
        """The config, the tokenizer and the model (an in-process core's) share one parse of a GGUF
        file."""
        with one_parse(args.model):
            return cls(args.create_engine_config(), engine_core)

    def process_request(
        self, prompt: PromptType, params: SamplingParams, *, reject_over_context: bool = False
    ) -> ProcessedRequest:
        """Validates and tokenises without touching the engine; raises InvalidRequest. A
        max_tokens past max_model_len is cut to the room the prompt leaves (the offline rule), or
        with `reject_over_context` refused (the OpenAI server's rule)."""
        if not isinstance(params, SamplingParams):
            raise InvalidRequest(
                f"sampling_params must be a SamplingParams, got {type(params).__name__}",
                param="sampling_params",
            )
        text, token_ids, embeds = self._parse_prompt(prompt)
        max_tokens = fit_context(
            len(token_ids), params.max_tokens, self.model_config.max_model_len, reject_over_context
        )
        params = self._resolve_params(params)
        if embeds is not None and params.prompt_logprobs is not None:
            raise InvalidRequest(
                "prompt_logprobs: a prompt_embeds prompt has no prompt token ids "
                "to score; leave prompt_logprobs None",
                param="prompt_logprobs",
            )
        return ProcessedRequest(text, token_ids, embeds, params, max_tokens, _cache_salt(prompt))

    def _parse_prompt(
        self, prompt: PromptType
    ) -> tuple[str | None, list[int], torch.Tensor | None]:
        if isinstance(prompt, str):
            return prompt, self._encode(prompt), None
        if isinstance(prompt, list):
            return None, self._check_token_ids(prompt), None
        if not isinstance(prompt, dict):
            raise InvalidRequest(
                "prompt must be a string, a list of token ids or a dict with "
                "'prompt', 'prompt_token_ids' or 'prompt_embeds'; got "
                f"{type(prompt).__name__}",
                param="prompt",
            )
        unknown = set(prompt) - _PROMPT_KEYS
        if unknown:
            raise InvalidRequest(
                f"prompt: unknown keys {sorted(unknown)}; allowed: {sorted(_PROMPT_KEYS)}",
                param="prompt",
            )
        text = prompt.get("prompt")
        if "prompt_embeds" in prompt:
            embeds = self._check_embeds(prompt["prompt_embeds"])
            return text, [0] * embeds.shape[0], embeds  # placeholder ids, one per embedding
        if "prompt_token_ids" in prompt:
            return text, self._check_token_ids(prompt["prompt_token_ids"]), None
        if isinstance(text, str):
            return text, self._encode(text), None
        raise InvalidRequest(
            "prompt: a dict prompt needs 'prompt' (a string), 'prompt_token_ids' "
            "or 'prompt_embeds'",
            param="prompt",
        )

    def _encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise InvalidRequest(
                "prompt: a text prompt needs a tokenizer, but "
                "skip_tokenizer_init=True; give prompt_token_ids instead",
                param="prompt",
            )
        return encode_prompt(self.tokenizer, text)

    def _check_token_ids(self, token_ids: Any) -> list[int]:
        vocab_size = self.model_config.vocab_size
        if not isinstance(token_ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in token_ids
        ):
            raise InvalidRequest("prompt_token_ids must be a list of integers", param="prompt")
        bad = [t for t in token_ids if not 0 <= t < vocab_size]
        if bad:
            raise InvalidRequest(
                f"prompt_token_ids must be in [0, vocab_size={vocab_size}), got {bad[:5]}",
                param="prompt",
            )
        return list(token_ids)

    def _check_embeds(self, embeds: Any) -> torch.Tensor:
        hidden_size = self.model_config.hidden_size
        if (
            not isinstance(embeds, torch.Tensor)
            or embeds.dim() != 2
            or embeds.shape[1] != hidden_size
        ):
            shape = (
                tuple(embeds.shape) if isinstance(embeds, torch.Tensor) else type(embeds).__name__
            )
            raise InvalidRequest(
                f"prompt_embeds must be a tensor [num_tokens, "
                f"hidden_size={hidden_size}], got {shape}",
                param="prompt_embeds",
            )
        return embeds

    def _resolve_params(self, params: SamplingParams) -> SamplingParams:
        """A private copy, checked against the vocabulary and the tokenizer."""
        params = dataclasses.replace(params)
        detokenizes = self.tokenizer is not None and params.detokenize
        if params.stop and not detokenizes:
            raise InvalidRequest(
                "stop: stop strings need detokenisation (a tokenizer and detokenize=True)",
                param="stop",
            )
        if params.bad_words:
            if self.tokenizer is None:
                raise InvalidRequest(
                    "bad_words: needs a tokenizer, but skip_tokenizer_init=True", param="bad_words"
                )
            params.bad_words_token_ids = bad_words_token_ids(self.tokenizer, params.bad_words)
        params.check_vocab(self.model_config.vocab_size)  # the ids bad_words became, too
        if params.structured_outputs is not None and self.tokenizer is None:
            raise InvalidRequest(
                "structured_outputs: needs a tokenizer, but skip_tokenizer_init=True",
                param="structured_outputs",
            )
        check_structured_outputs(params.structured_outputs)
        return params

    def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams,
        priority: int = 0,
        arrival_time: float | None = None,
        final_only: bool = False,
    ) -> None:
        """`final_only`: step() reports the request only once it finished (no streaming)."""
        self.add_processed_request(
            request_id, self.process_request(prompt, params), priority, arrival_time, final_only
        )

    def add_processed_request(
        self,
        request_id: str,
        processed: ProcessedRequest,
        priority: int = 0,
        arrival_time: float | None = None,
        final_only: bool = False,
    ) -> None:
        """All of a request's samples enter the core, or none (the error is raised)."""
        _check_priority(priority)
        arrival_time = time.time() if arrival_time is None else arrival_time
        params = processed.params
        prime_ids = [] if processed.prompt_embeds is not None else processed.prompt_token_ids
        core_ids = self.output_processor.add_request(
            request_id,
            processed.prompt,
            processed.prompt_token_ids,
            params,
            arrival_time,
            prime_ids,
            final_only,
        )
        try:
            for index, core_id in enumerate(core_ids):
                self.engine_core.add_request(
                    Request(
                        request_id=core_id,
                        prompt_token_ids=list(processed.prompt_token_ids),
                        sampling_params=_sample_params(params, index),
                        eos_token_ids=frozenset(self.model_config.eos_token_ids),
                        max_tokens=processed.max_tokens,
                        arrival_time=arrival_time,
                        priority=priority,
                        prompt_embeds=processed.prompt_embeds,
                        cache_salt=processed.cache_salt,
                    )
                )
        except BaseException:
            self.abort_request(request_id)
            raise

    def abort_request(self, request_ids: str | list[str]) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        core_ids = self.output_processor.abort_requests(ids)
        if core_ids:
            self.engine_core.abort_requests(core_ids)

    def step(self) -> list[RequestOutput]:
        """One engine step; outputs of every request that got new tokens or finished (first those
        wait_for_requests held)."""
        if self._held_outputs:
            held, self._held_outputs = self._held_outputs, []
            return held
        return self._step()

    def call_core(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """An engine-core utility between steps (engine/lifecycle.py), in process."""
        return self.engine_core.call_utility(method, args, kwargs)

    def wait_for_requests(self) -> None:
        """Steps until every request finished (mode "wait" of a pause or a sleep); step() gives
        their outputs afterwards."""
        while self.engine_core.has_unfinished_requests():
            if not self.engine_core.has_work():
                raise InvalidRequest(
                    "mode: 'wait' while paused would wait forever; resume_generation() first",
                    param="mode",
                )
            self._held_outputs += self._step()

    def _step(self) -> list[RequestOutput]:
        processed = self.output_processor.process_outputs(self.engine_core.step())
        if processed.reqs_to_finish:
            self.engine_core.finish_requests(processed.reqs_to_finish)
        return processed.request_outputs

    def has_unfinished_requests(self) -> bool:
        """Requests in the core, or steps still in flight (async scheduling)."""
        return self.engine_core.has_unfinished_requests()

    def get_stats(self) -> Any:
        return self.engine_core.get_stats()

    def get_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise ValueError("tokenizer: none was loaded (skip_tokenizer_init=True)")
        return self.tokenizer


def fit_context(
    num_prompt_tokens: int,
    max_tokens: int | None,
    max_model_len: int,
    reject_over_context: bool = False,
) -> int:
    """The request's max_tokens within max_model_len (see process_request). The one check of a
    prompt's length against the context: the scheduler asserts it."""
    if num_prompt_tokens == 0:
        raise InvalidRequest("prompt is empty: at least one token is needed", param="prompt")
    if num_prompt_tokens >= max_model_len:
        raise InvalidRequest(
            f"prompt has {num_prompt_tokens} tokens but max_model_len is {max_model_len}: a "
            f"prompt may have at most {max_model_len - 1} tokens, leaving room for one "
            "generated token",
            param="prompt",
            code=CONTEXT_LENGTH_EXCEEDED,
        )
    room = max_model_len - num_prompt_tokens
    if max_tokens is None:
        return room
    if reject_over_context and max_tokens > room:
        raise InvalidRequest(
            f"This model's maximum context length is {max_model_len} tokens (max_model_len), "
            f"but {num_prompt_tokens + max_tokens} tokens were requested ({num_prompt_tokens} "
            f"in the prompt, {max_tokens} for the completion). Reduce the prompt or max_tokens.",
            param="max_tokens",
            code=CONTEXT_LENGTH_EXCEEDED,
        )
    return min(max_tokens, room)


def _cache_salt(prompt: PromptType) -> str | None:
    """A dict prompt's `cache_salt`; None (absent or None) leaves the request unsalted."""
    salt = prompt.get("cache_salt") if isinstance(prompt, dict) else None
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise InvalidRequest(
            f"cache_salt must be a non-empty string or None, got {salt!r}", param="cache_salt"
        )
    return salt


def _check_priority(priority: Any) -> None:
    """Checked here, not in the scheduler (it asserts): the priority policy orders by it."""
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise InvalidRequest(f"priority must be an integer, got {priority!r}", param="priority")


def _sample_params(params: SamplingParams, index: int) -> SamplingParams:
    """Sample `index` of a parallel-sampling request: n=1, seed + index when seeded; only
    sample 0 computes the prompt logprobs (the others take its prompt blocks from the cache)."""
    if params.n == 1:
        return params
    seed = None if params.seed is None else params.seed + index
    prompt_logprobs = params.prompt_logprobs if index == 0 else None
    return dataclasses.replace(params, n=1, seed=seed, prompt_logprobs=prompt_logprobs)


def _make_core(config: EngineConfig, tokenizer: Any) -> EngineCore | DataParallelCores:
    """The in-process core; at data_parallel_size > 1 one per dp rank (engine/data_parallel.py)."""
    if config.parallel.data_parallel_size == 1:
        return EngineCore(config, tokenizer)
    from pagedlm.engine.data_parallel import DataParallelCores

    return DataParallelCores(config, tokenizer)
