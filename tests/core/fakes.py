"""Test doubles for the planner: a fake model runner with a shadow KV cache, engine loops
(sync and async) and a reference generator that needs no scheduler."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from pagedlm.config import CacheConfig, SchedulerConfig
from pagedlm.core.block_pool import NULL_BLOCK_ID
from pagedlm.core.sched_output import EngineCoreOutput, ModelRunnerOutput, SchedulerOutput
from pagedlm.core.scheduler import Scheduler
from pagedlm.engine.llm_engine import fit_context
from pagedlm.errors import InvalidRequest
from pagedlm.request import Request
from pagedlm.sampling_params import SamplingParams

VOCAB = 50
NextToken = Callable[[list[int]], int]


def mixing_next_token(context: list[int]) -> int:
    """Depends on the whole context, so a wrong KV entry changes what follows."""
    return (31 * context[-1] + 7 * sum(context) + len(context)) % VOCAB


def position_next_token(context: list[int]) -> int:
    """token = its own position % VOCAB: easy to predict by hand."""
    return len(context) % VOCAB


_arrival_clock = itertools.count()


def make_request(
    req_id: str,
    prompt: list[int],
    max_tokens: int = 8,
    *,
    eos: tuple[int, ...] = (),
    priority: int = 0,
    arrival_time: float | None = None,
    **params,
) -> Request:
    """Requests made later arrive later, unless arrival_time says otherwise."""
    if arrival_time is None:
        arrival_time = float(next(_arrival_clock))
    return Request(
        request_id=req_id,
        prompt_token_ids=list(prompt),
        sampling_params=SamplingParams(max_tokens=max_tokens, **params),
        eos_token_ids=frozenset(eos),
        max_tokens=max_tokens,
        priority=priority,
        arrival_time=arrival_time,
    )


def engine_request(
    req_id: str, prompt: list[int], max_tokens: int, max_model_len: int, **kwargs
) -> Request | None:
    """The request as LLMEngine hands it to the scheduler (max_tokens resolved by the engine's
    fit_context), or None when the engine refuses the prompt (empty, or no room to generate)."""
    try:
        max_tokens = fit_context(len(prompt), max_tokens, max_model_len)
    except InvalidRequest:
        return None
    return make_request(req_id, prompt, max_tokens, **kwargs)


def make_scheduler(
    num_blocks: int = 64,
    block_size: int = 8,
    max_model_len: int = 256,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 64,
    policy: str = "fcfs",
    enable_prefix_caching: bool = True,
    growth_reserve: bool = False,
    group_windows: tuple[int | None, ...] = (None,),
) -> Scheduler:
    """growth_reserve=False: admission by the prompt alone, so small pools preempt (what most tests
    here exercise); the reserve has its own tests. group_windows: each KV cache group's window
    (one group of window None: full attention)."""
    sched_config = SchedulerConfig(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, policy=policy
    )
    cache_config = CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching)
    scheduler = Scheduler(
        sched_config, cache_config, num_blocks, max_model_len, group_windows=group_windows
    )
    scheduler.growth.enabled = growth_reserve
    return scheduler


def reference_output(
    request: Request, max_model_len: int, next_token: NextToken
) -> tuple[list[int], str]:
    """What the request must produce: the model run token by token, no scheduler."""
    copy = make_request(
        "ref",
        request.prompt_token_ids,
        request.max_tokens,
        eos=tuple(request.eos_token_ids),
        min_tokens=request.sampling_params.min_tokens,
        stop_token_ids=request.sampling_params.stop_token_ids,
        ignore_eos=request.sampling_params.ignore_eos,
    )
    while True:
        copy.append_output_token(next_token(copy.all_token_ids))
        status = copy.check_stop(max_model_len)
        if status is not None:
            return copy.output_token_ids, status.finish_reason


@dataclass
class _Row:
    token_ids: list[int]
    block_ids: list[int]
    num_computed: int


class FakeRunner:
    """Keeps block tables from SchedulerOutput diffs like the real worker. Writes every computed
    token into a shadow KV cache (slot -> token id), all writes of a step before any read, and
    checks that each sampling request reads exactly its own tokens back."""

    def __init__(self, block_size: int, next_token: NextToken = mixing_next_token) -> None:
        self.block_size = block_size
        self.next_token = next_token
        self.kv: dict[int, int] = {}
        self.rows: dict[str, _Row] = {}

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        self._apply(so)
        for req_id, num_tokens in so.num_scheduled_tokens.items():
            row = self.rows[req_id]
            for pos in range(row.num_computed, row.num_computed + num_tokens):
                assert pos < len(row.token_ids), (
                    f"{req_id}: position {pos} scheduled before its token"
                )
                self.kv[self._slot(row, pos)] = row.token_ids[pos]
            row.num_computed += num_tokens
        req_ids, sampled = [], []
        for req_id in so.num_scheduled_tokens:
            if req_id in so.sampling_req_ids:
                req_ids.append(req_id)
                sampled.append([self._sample(req_id)])
        return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled)

    def _apply(self, so: SchedulerOutput) -> None:
        assert so.total_num_scheduled_tokens == sum(so.num_scheduled_tokens.values())
        assert so.sampling_req_ids <= set(so.num_scheduled_tokens)
        for req_id in so.finished_req_ids:
            self.rows.pop(req_id, None)
        for new in so.new_reqs:
            assert new.req_id not in self.rows
            self.rows[new.req_id] = _Row(
                new.prompt_token_ids + new.output_token_ids,
                list(new.block_ids),
                new.num_computed_tokens,
            )
        for cached in so.cached_reqs:
            row = self.rows[cached.req_id]
            assert row.num_computed == cached.num_computed_tokens
            row.block_ids += cached.new_block_ids
        for row in self.rows.values():
            assert NULL_BLOCK_ID not in row.block_ids
            assert len(set(row.block_ids)) == len(row.block_ids)

    def _sample(self, req_id: str) -> int:
        row = self.rows[req_id]
        assert row.num_computed == len(row.token_ids)
        context = [self.kv[self._slot(row, pos)] for pos in range(row.num_computed)]
        assert context == row.token_ids, f"{req_id}: KV cache holds the wrong tokens"
        token = self.next_token(context)
        row.token_ids.append(token)
        return token

    def _slot(self, row: _Row, pos: int) -> int:
        return row.block_ids[pos // self.block_size] * self.block_size + pos % self.block_size


@dataclass
class Result:
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0


def collect(results: dict[str, Result], outputs: list[EngineCoreOutput]) -> None:
    for out in outputs:
        result = results.setdefault(out.req_id, Result())
        assert result.finish_reason is None, f"{out.req_id}: output after the finish"
        result.token_ids += out.new_token_ids
        result.finish_reason = out.finish_reason
        result.stop_reason = out.stop_reason
        result.num_cached_tokens = out.num_cached_tokens


StepHook = Callable[[Scheduler, SchedulerOutput], None]


def run_engine(
    sched: Scheduler,
    runner: FakeRunner,
    depth: int = 0,
    on_step: StepHook | None = None,
    max_steps: int = 2000,
) -> dict[str, Result]:
    """depth 0: schedule, execute, update (sync). depth d > 0: step N+d is scheduled (and run)
    before step N's output reaches the scheduler (async scheduling; the engine uses d = 1)."""
    results: dict[str, Result] = {}
    in_flight: deque[tuple[SchedulerOutput, ModelRunnerOutput]] = deque()
    for _ in range(max_steps):
        if sched.has_unfinished_requests():
            so = sched.schedule()
            if on_step is not None:
                on_step(sched, so)
            in_flight.append((so, runner.execute(so)))
        while len(in_flight) > depth or (in_flight and not sched.has_unfinished_requests()):
            collect(results, sched.update_from_output(*in_flight.popleft()))
        if not in_flight and not sched.has_unfinished_requests():
            return results
    raise AssertionError(f"not finished after {max_steps} steps")
