"""LLM: the offline API (vLLM's names): generate for many prompts, chat, with a progress bar."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from pagedlm.beam_search import BeamSearchOutput, BeamSearchParams, beam_search
from pagedlm.config import EngineArgs
from pagedlm.engine.llm_engine import LLMEngine, ProcessedRequest, PromptType
from pagedlm.engine.tokenizer import Conversation, apply_chat_template
from pagedlm.errors import InvalidRequest
from pagedlm.llm_lifecycle import LifecycleMixin
from pagedlm.logger import configure_logging
from pagedlm.outputs import RequestOutput
from pagedlm.sampling_params import SamplingParams


class LLM(LifecycleMixin):
    """`LLM(model=None, **engine_args)`: the keywords are exactly the EngineArgs fields
    (dtype, max_model_len, max_num_seqs, enable_prefix_caching, ...); no model: the default.
    collective_rpc, sleep / wake_up, pause / resume, reset_prefix_cache: llm_lifecycle.py."""

    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        unknown = sorted(set(engine_args) - EngineArgs.field_names())
        if unknown:
            raise TypeError(
                f"LLM() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
                f"accepted: {', '.join(sorted(EngineArgs.field_names()))}"
            )
        configure_logging()
        self.llm_engine = LLMEngine.from_engine_args(EngineArgs(model=model, **engine_args))
        self._request_counter = itertools.count()

    def get_tokenizer(self) -> Any:
        return self.llm_engine.get_tokenizer()

    def get_stats(self) -> Any:
        """The scheduler's counters (running, waiting, KV usage, prefix hits, preemptions)."""
        return self.llm_engine.get_stats()

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Outputs in the order of the prompts. Every prompt is checked before any runs; an
        error names the index of the prompt at fault."""
        self.check_generating()
        prompt_list = _as_prompt_list(prompts)
        params_list = _per_prompt(
            sampling_params or SamplingParams(), len(prompt_list), "sampling_params"
        )
        priorities = [0] * len(prompt_list) if priority is None else list(priority)
        if len(priorities) != len(prompt_list):
            raise InvalidRequest(
                f"priority: got {len(priorities)} values for {len(prompt_list)} prompts",
                param="priority",
            )
        processed = []
        for index, (prompt, params) in enumerate(zip(prompt_list, params_list)):
            try:
                processed.append(self.llm_engine.process_request(prompt, params))
            except InvalidRequest as exc:
                raise exc.prefixed(f"prompt {index}: ") from exc
        return self._run(processed, priorities, use_tqdm)

    def beam_search(
        self, prompts: PromptType | Sequence[PromptType], params: BeamSearchParams
    ) -> list[BeamSearchOutput]:
        """vLLM's beam search (see pagedlm/beam_search.py): one output per prompt, its
        beam_width best sequences first."""
        return beam_search(self, _as_prompt_list(prompts), params)

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[RequestOutput]:
        """One conversation (a list of {'role', 'content'} dicts) or a list of them. `tools`:
        OpenAI's function definitions, for the chat template (vLLM's LLM.chat argument)."""
        conversations = [messages] if _is_conversation(messages) else list(messages)
        tokenizer = self.get_tokenizer()
        prompts: list[PromptType] = []
        for conversation in conversations:
            text, token_ids = apply_chat_template(
                tokenizer, conversation, chat_template_kwargs, tools
            )
            prompts.append({"prompt": text, "prompt_token_ids": token_ids})
        return self.generate(prompts, sampling_params, use_tqdm)

    def _run(
        self, processed: list[ProcessedRequest], priorities: list[int], use_tqdm: bool
    ) -> list[RequestOutput]:
        request_ids = [f"llm-{next(self._request_counter)}" for _ in processed]
        pending = set()
        try:
            for request_id, request, priority in zip(request_ids, processed, priorities):
                self.llm_engine.add_processed_request(
                    request_id, request, priority, final_only=True
                )
                pending.add(request_id)
            finished = self._drain(pending, use_tqdm)
        except BaseException:
            self.llm_engine.abort_request(sorted(pending))
            raise
        return [finished[request_id] for request_id in request_ids]

    def _drain(self, pending: set[str], use_tqdm: bool) -> dict[str, RequestOutput]:
        """Steps the engine until every pending request finished; empties `pending`."""
        finished: dict[str, RequestOutput] = {}
        with tqdm(total=len(pending), desc="Processed prompts", disable=not use_tqdm) as bar:
            while pending:
                if not self.llm_engine.has_unfinished_requests():
                    raise RuntimeError(f"engine: {len(pending)} requests lost without an output")
                for output in self.llm_engine.step():
                    if output.finished and output.request_id in pending:
                        pending.discard(output.request_id)
                        finished[output.request_id] = output
                        bar.update(1)
        return finished


def _as_prompt_list(prompts: PromptType | Sequence[PromptType]) -> list[PromptType]:
    """A single prompt (a string, a dict, or a list of ints) or a sequence of prompts."""
    if isinstance(prompts, (str, dict)):
        return [prompts]
    prompt_list = list(prompts)
    if prompt_list and all(isinstance(t, int) for t in prompt_list):
        return [prompt_list]
    return prompt_list


def _per_prompt(value: Any, num_prompts: int, name: str) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        return [value] * num_prompts
    if len(value) != num_prompts:
        raise InvalidRequest(
            f"{name}: got {len(value)} values for {num_prompts} prompts", param=name
        )
    return list(value)


def _is_conversation(messages: Any) -> bool:
    return isinstance(messages, list) and (not messages or isinstance(messages[0], dict))
