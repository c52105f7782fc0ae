"""DummySteps: steps of made-up requests (prompts of token 0) through the runner's own execute_model,
for its start-up work (the memory profile, profile_run.py; the kernel warm-up, kernel_warmup.py).
ModelRunner.dummy_steps makes one and, on exit, ends every request still in it and restores what it
changed. The requests take blocks from a range of their own: no scheduler knows of them."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagedlm.core.sched_output import (
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from pagedlm.sampling_params import SamplingParams
from pagedlm.worker.input_batch import cdiv

if TYPE_CHECKING:
    from pagedlm.worker.model_runner import ModelRunner


@dataclass(slots=True)
class _Request:
    new: NewRequestData | None  # until its first step, then None
    num_prompt_tokens: int
    block_ids: list[int]
    num_computed: int = 0
    num_sampled: int = (
        0  # tokens sampled (in flight or known): the request's tokens go on past its prompt
    )

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_sampled


class DummySteps:
    """Made-up requests over blocks [first_block, end_block) of the runner's KV cache."""

    def __init__(
        self, runner: ModelRunner, first_block: int, end_block: int, kv_cache_bytes: int
    ) -> None:
        """kv_cache_bytes: those of a KV cache made for these steps (0 on the runner's own)."""
        self._runner = runner
        self.kv_cache_bytes = kv_cache_bytes
        self._free_blocks = list(range(first_block, end_block))
        self._requests: dict[str, _Request] = {}
        self._ids = itertools.count()

    def add(self, num_prompt_tokens: int, params: SamplingParams, num_decodes: int) -> str | None:
        """A request of num_prompt_tokens zeros, with blocks for its prompt and num_decodes decode
        steps -> its id; None (nothing added) where the free blocks cannot hold it."""
        num_blocks = cdiv(num_prompt_tokens + num_decodes, self._runner.block_size)
        if num_blocks > len(self._free_blocks):
            return None
        block_ids, self._free_blocks = (
            self._free_blocks[:num_blocks],
            self._free_blocks[num_blocks:],
        )
        req_id = f"_dummy_{next(self._ids)}"
        groups = self._runner.input_batch.group_tables  # the same blocks in every group
        new = NewRequestData(
            req_id=req_id,
            prompt_token_ids=[0] * num_prompt_tokens,
            output_token_ids=[],
            sampling_params=params,
            block_ids=block_ids,
            num_computed_tokens=0,
            group_block_ids=() if groups is None else (block_ids,) * groups.num_groups,
        )
        self._requests[req_id] = _Request(new, num_prompt_tokens, block_ids)
        return req_id

    def step(self, num_tokens: dict[str, int]) -> ModelRunnerOutput:
        """One step of num_tokens[req_id] tokens of each request (in this order), waited for; a request
        samples where they reach its end."""
        sched = SchedulerOutput(
            new_reqs=[],
            cached_reqs=[],
            num_scheduled_tokens=dict(num_tokens),
            total_num_scheduled_tokens=sum(num_tokens.values()),
        )
        for req_id, count in num_tokens.items():
            request = self._requests[req_id]
            if request.new is not None:
                sched.new_reqs.append(request.new)
                request.new = None
            else:
                sched.cached_reqs.append(CachedRequestData(req_id, [], request.num_computed))
            request.num_computed += count
            if request.num_computed == request.num_tokens:
                sched.sampling_req_ids.add(req_id)
                request.num_sampled += 1
        return self._runner.execute_model(sched).get_output()

    def prefill(self, req_id: str) -> None:
        """The request's prompt in chunks of the step budget, alone; the last chunk samples."""
        budget = self._runner.max_num_tokens
        request = self._requests[req_id]
        while request.num_computed < request.num_prompt_tokens:
            self.step({req_id: min(budget, request.num_prompt_tokens - request.num_computed)})

    def finish(self, *req_ids: str) -> None:
        """The requests leave the runner (a step that finishes them and runs nothing); their blocks
        are free again."""
        self._runner.execute_model(
            SchedulerOutput(
                new_reqs=[],
                cached_reqs=[],
                num_scheduled_tokens={},
                total_num_scheduled_tokens=0,
                finished_req_ids=set(req_ids),
            )
        )
        for req_id in req_ids:
            self._free_blocks += self._requests.pop(req_id).block_ids
        self._free_blocks.sort()

    def finish_all(self) -> None:
        if self._requests:
            self.finish(*self._requests)
