"""The scheduler: no prefill or decode phase, only tokens to catch up under a token budget.

Each step, RUNNING requests (in priority order) get their tokens still to compute (prompt and
outputs, known or in flight, less `num_computed_tokens`) up to the budget left, then WAITING ones
are admitted (prefix-cache lookup, then allocation) while the budget, `max_num_seqs` and the pool
allow. A request whose scheduled tokens reach the end of its sequence samples this step and gets
a placeholder for the token in flight, so step N+1 may be scheduled before step N's tokens are
back (async scheduling).

Order: `running` is sorted by the policy key (fcfs: arrival order; priority: (priority,
arrival_time, arrival order)), so its last request is the lowest, the one preempted first.
`waiting` is FCFS with preempted requests at the front, or sorted by the priority key.
Preemption is by recompute: blocks freed, `num_computed_tokens = 0`, back to waiting; the
prefix cache usually finds the computed prefix again.

Priority policy (vLLM's rule: the victim is the running request of largest (priority,
arrival_time)): a waiting request that outranks running ones may also take their blocks. The
first waiting request admission would try (no token in flight, a sequence slot free) is given
its rank in the running pass: on reaching the first running request ranked after it (none of
those is scheduled yet this step), if the pool cannot admit it (prefix hit, this step's chunk
and growth reserve counted as admission counts them), the fewest of those, lowest first, that
make room are preempted; none if even all of them would not, or if preempting them would leave
the step idle (nothing else scheduled, no token in flight: sync mode with only them to run).
As a step that preempts admits nobody, the request is admitted the next step, unless running
requests ranked after it grew into the room meanwhile (then that step preempts again).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from pagedlm import envs
from pagedlm.config import CacheConfig, SchedulerConfig
from pagedlm.core.block_pool import NULL_BLOCK_ID
from pagedlm.core.growth import AdmissionReserve, GrowthEstimate
from pagedlm.core.kv_groups import make_kv_cache_manager
from pagedlm.core.prefill_spread import PrefillSpread
from pagedlm.core.sched_output import (
    CachedRequestData,
    EngineCoreOutput,
    Logprobs,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from pagedlm.core.spec_plan import SpecPlanner
from pagedlm.request import Request, RequestStatus
from pagedlm.spec_decode.config import SpeculativeConfig


@dataclass(slots=True)
class SchedulerStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    prefix_cache_queries: int  # tokens
    prefix_cache_hits: int  # tokens
    num_preemptions: int
    # speculative decoding, cumulative (spec_decode/metrics.py: SpecDecodeCounters)
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: tuple[int, ...] = ()


@dataclass(slots=True)
class _StepPlan:
    """What one schedule() call has decided so far."""

    token_budget: int
    # tokens left for requests not yet decoding (core/prefill_spread.py); without a spread it
    # stays the step's whole budget, never below token_budget
    prompt_budget: int
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)  # batch order
    num_draft_tokens: dict[str, int] = field(default_factory=dict)  # of those, drafts
    new_reqs: list[NewRequestData] = field(default_factory=list)
    cached_reqs: list[CachedRequestData] = field(default_factory=list)
    sampling_req_ids: set[str] = field(default_factory=set)
    num_preempted: int = 0


@dataclass(slots=True)
class _Admission:
    """What admitting a waiting request now takes."""

    hit_blocks: list[int]  # its prefix-cache hit
    num_hit_tokens: int
    num_new: int  # tokens it computes this step
    num_reserved: int  # blocks to leave free: its growth and that of the running ranked before it
    own_blocks: int  # its own growth, in blocks


class Scheduler:
    def __init__(
        self,
        sched_config: SchedulerConfig,
        cache_config: CacheConfig,
        num_blocks: int,
        max_model_len: int,
        sliding_window: int | None = None,
        speculative: SpeculativeConfig | None = None,
        group_windows: tuple[int | None, ...] | None = None,
    ) -> None:
        """sliding_window: every layer's window, if all have one (their blocks out of it are freed);
        speculative: drafts verified by decoding requests (core/spec_plan.py); group_windows:
        instead of sliding_window, the window of each KV cache group (core/kv_groups.py)."""
        self.config = sched_config
        self.max_model_len = max_model_len
        if group_windows is None:
            group_windows = (sliding_window,)
        self.kv_cache_manager = make_kv_cache_manager(
            num_blocks,
            cache_config.block_size,
            cache_config.enable_prefix_caching,
            group_windows,
        )
        self.requests: dict[str, Request] = {}  # every unfinished request
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self._sort_keys: dict[str, tuple] = {}
        self._finished_req_ids: set[str] = set()  # left the worker since the last schedule()
        self._running_finished = False  # a request in `running` finished and is still listed
        self._num_prompt_logprobs_sent: dict[str, int] = {}  # prompt-logprob entries delivered
        self._num_added = 0
        self._step_id = 0
        self._scheduled: dict[
            int, dict[str, Request]
        ] = {}  # step_id -> its requests, until updated
        self.num_preemptions = 0
        self.growth = GrowthEstimate(max_model_len, group_windows=group_windows)
        self.spec = None if speculative is None else SpecPlanner(speculative, max_model_len)
        if speculative is not None:
            self.growth.num_draft_positions = speculative.num_speculative_tokens
        self.spread = (
            PrefillSpread(sched_config.max_num_batched_tokens)
            if sched_config.policy == "fcfs" and envs.PAGEDLM_PREFILL_SPREAD
            else None
        )

    # ---- requests in and out ----

    def add_request(self, request: Request) -> None:
        """The request was validated at the engine boundary (LLMEngine.process_request and
        add_processed_request, which raise InvalidRequest); here that is only asserted."""
        req_id = request.request_id
        # LLMEngine's OutputProcessor refuses a request id in use.
        assert req_id not in self.requests, f"request_id {req_id!r} is already in use"
        # LLMEngine.add_processed_request checks the priority.
        assert isinstance(request.priority, int) and not isinstance(request.priority, bool), (
            f"priority must be an integer, got {request.priority!r}"
        )
        self._assert_fits(request)
        if self.config.policy == "priority":
            self._sort_keys[req_id] = (request.priority, request.arrival_time, self._num_added)
        else:
            self._sort_keys[req_id] = (self._num_added,)
        self._num_added += 1
        self.requests[req_id] = request
        request.status = RequestStatus.WAITING
        self._enqueue_waiting(request, front=False)

    def abort_requests(self, req_ids: Iterable[str]) -> list[EngineCoreOutput]:
        """Finishes the requests with reason "abort" and frees their blocks now; unknown ids are
        ignored (they may have finished already)."""
        return [
            EngineCoreOutput(
                req.request_id,
                [],
                finish_reason=req.status.finish_reason,
                num_cached_tokens=max(req.num_cached_tokens, 0),
            )
            for req in self._finish_ids(req_ids, RequestStatus.FINISHED_ABORTED)
        ]

    def finish_requests(self, req_ids: Iterable[str], status: RequestStatus) -> None:
        """Finishes requests for a reason found outside (e.g. the detokenizer saw a stop string)."""
        if not status.finished:
            raise ValueError(f"status must be a finished status, got {status.name}")
        self._finish_ids(req_ids, status)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def reset_prefix_cache(self) -> bool:
        """False while a request holds blocks (vLLM's rule)."""
        return self.kv_cache_manager.reset_prefix_cache()

    def preempt_all(self) -> None:
        """Every running request back to waiting, its blocks freed (it recomputes when scheduled
        again): the KV cache is about to go. No step may be in flight."""
        assert not any(r.num_output_placeholders for r in self.running), "a step is in flight"
        while self.running:
            self._preempt(self.running.pop())

    def get_stats(self) -> SchedulerStats:
        kv = self.kv_cache_manager
        stats = SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_cache_usage=kv.usage,
            prefix_cache_queries=kv.prefix_cache_queries,
            prefix_cache_hits=kv.prefix_cache_hits,
            num_preemptions=self.num_preemptions,
        )
        if self.spec is not None:
            counters = self.spec.counters
            stats.spec_num_drafts = counters.num_drafts
            stats.spec_num_draft_tokens = counters.num_draft_tokens
            stats.spec_num_accepted_tokens = counters.num_accepted_tokens
            stats.spec_accepted_per_pos = tuple(counters.accepted_per_pos.tolist())
        return stats

    # ---- one step ----

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        prompt_budget = (
            budget if self.spread is None else self.spread.plan(self.running, self.waiting)
        )
        plan = _StepPlan(token_budget=budget, prompt_budget=prompt_budget)
        self.kv_cache_manager.begin_step()
        self._schedule_running(plan)
        if plan.num_preempted == 0:  # a step that had to preempt admits nobody new
            self._schedule_waiting(plan)
        self._step_id += 1
        if plan.num_scheduled_tokens:  # an empty step is not launched, so never updated
            self._scheduled[self._step_id] = {
                req_id: self.requests[req_id] for req_id in plan.num_scheduled_tokens
            }
        total = self.config.max_num_batched_tokens - plan.token_budget
        output = SchedulerOutput(
            new_reqs=plan.new_reqs,
            cached_reqs=plan.cached_reqs,
            num_scheduled_tokens=plan.num_scheduled_tokens,
            total_num_scheduled_tokens=total,
            finished_req_ids=self._finished_req_ids,
            sampling_req_ids=plan.sampling_req_ids,
            step_id=self._step_id,
            num_draft_tokens=plan.num_draft_tokens,
        )
        self._finished_req_ids = set()
        return output

    def update_from_output(
        self, sched_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        """Appends the sampled tokens, checks token-level stops, frees finished requests."""
        expected = sched_output.sampling_req_ids
        if set(runner_output.req_ids) != expected:
            raise ValueError(
                f"runner_output.req_ids must be the step's sampling_req_ids; got "
                f"{sorted(runner_output.req_ids)}, expected {sorted(expected)}"
            )
        outputs = []
        # The request objects the step ran: a finished one's id may be in use again by now.
        live = {
            req_id: request
            for req_id, request in self._scheduled.pop(sched_output.step_id, {}).items()
            if not request.is_finished
        }
        prompt_logprobs = self._new_prompt_logprobs(
            sched_output, runner_output.prompt_logprobs, live
        )
        for i, (req_id, token_ids) in enumerate(
            zip(runner_output.req_ids, runner_output.sampled_token_ids)
        ):
            request = live.get(req_id)
            if request is None:  # finished or aborted while the step ran
                continue
            request.num_output_placeholders -= 1
            num_drafts = sched_output.num_draft_tokens.get(req_id, 0)
            num_accepted = self._verified(request, num_drafts, token_ids, runner_output, i)
            logprobs = runner_output.logprobs[i] if runner_output.logprobs is not None else None
            output = self._append_tokens(request, token_ids, logprobs, prompt_logprobs.get(req_id))
            if num_drafts:
                output.num_draft_tokens, output.num_accepted_draft_tokens = num_drafts, num_accepted
                if request.status == RequestStatus.RUNNING and num_accepted < num_drafts:
                    # the rejected tail's blocks go back; the next step writes position
                    # num_computed_tokens
                    self.kv_cache_manager.trim(request, request.num_computed_tokens + 1)
            outputs.append(output)
        for req_id, entries in prompt_logprobs.items():
            if req_id not in sched_output.sampling_req_ids:
                outputs.append(EngineCoreOutput(req_id, [], prompt_logprobs=entries))
        self._drop_finished_running()
        return outputs

    def _verified(
        self,
        request: Request,
        num_drafts: int,
        token_ids: list[int],
        runner_output: ModelRunnerOutput,
        index: int,
    ) -> int:
        """A sampling request's verdict (spec_plan.py): its rejected drafts rolled back; returns
        the accepted drafts."""
        if self.spec is None:
            return 0
        held, held_ids = runner_output.num_draft_tokens, runner_output.draft_token_ids
        return self.spec.verified(
            request,
            num_drafts,
            len(token_ids),
            None if held is None else held[index],
            None if held_ids is None else held_ids[index],
        )

    def _new_prompt_logprobs(
        self,
        sched_output: SchedulerOutput,
        runner_logprobs: dict[str, list[Logprobs | None]],
        live: dict[str, Request],
    ) -> dict[str, list[Logprobs | None]]:
        """The prompt-logprob entries not delivered before, per unfinished request: a request
        recomputed after preemption sends its prompt's entries again. A step that computed
        prompt tokens from `start` sent the entries of tokens from `start + 1` (from 0 when
        start is 0: token 0's entry is None)."""
        if not runner_logprobs:
            return {}
        starts = {new.req_id: new.num_computed_tokens for new in sched_output.new_reqs}
        starts.update(
            (cached.req_id, cached.num_computed_tokens) for cached in sched_output.cached_reqs
        )
        result = {}
        for req_id, entries in runner_logprobs.items():
            if req_id not in live:
                continue
            first = 0 if starts[req_id] == 0 else starts[req_id] + 1
            num_sent = self._num_prompt_logprobs_sent.get(req_id, 0)
            if first + len(entries) > num_sent:
                result[req_id] = entries[max(num_sent - first, 0) :]
                self._num_prompt_logprobs_sent[req_id] = first + len(entries)
        return result

    # ---- scheduling ----

    def _schedule_running(self, plan: _StepPlan) -> None:
        head = self._waiting_head()
        i = 0
        while i < len(self.running) and plan.token_budget > 0:
            request = self.running[i]
            if head is not None and self._sort_key(head) < self._sort_key(request):
                self._preempt_for_waiting(head, i, plan)  # may shorten `running` from the end
                head = None
                continue
            num_new = self._num_new_tokens(request, plan.token_budget)
            if plan.prompt_budget < num_new and _catching_up(request):
                num_new = plan.prompt_budget
            if num_new == 0:
                i += 1
                continue
            num_drafts = 0
            if self.spec is not None:
                num_drafts = self.spec.num_drafts(request, len(self.running), plan.token_budget)
            num_new += num_drafts
            new_blocks = self._allocate_or_preempt(request, num_new, plan)
            if new_blocks is None:  # the request was the lowest and preempted itself
                break
            plan.cached_reqs.append(
                CachedRequestData(
                    request.request_id,
                    new_blocks,
                    request.num_computed_tokens,
                    self.kv_cache_manager.get_num_null_blocks(request.request_id),
                    None
                    if self.spec is None
                    else len(self.kv_cache_manager.get_block_ids(request.request_id)),
                    self.kv_cache_manager.group_updates(request.request_id),
                )
            )
            self._commit(request, num_new, plan, num_drafts)
            i += 1

    def _allocate_or_preempt(
        self, request: Request, num_new: int, plan: _StepPlan
    ) -> list[int] | None:
        """Preempts from the end of `running` (never a request scheduled this step: those sit
        before `request`) until the allocation fits; None if `request` itself had to go."""
        while True:
            new_blocks = self.kv_cache_manager.allocate_slots(request, num_new)
            if new_blocks is not None:
                return new_blocks
            victim = self.running.pop()
            self._preempt(victim)
            plan.num_preempted += 1
            if victim is request:
                return None

    def _waiting_head(self) -> Request | None:
        """Priority policy, a sequence slot free: the waiting request admission tries first."""
        if self.config.policy != "priority" or len(self.running) >= self.config.max_num_seqs:
            return None
        return next(
            (
                request
                for request in self.waiting
                if request.num_output_placeholders == 0 and _grammar_ready(request)
            ),
            None,
        )

    def _preempt_for_waiting(self, head: Request, first_after: int, plan: _StepPlan) -> None:
        """`head` outranks running[first_after:], none of them scheduled this step: preempts the
        fewest of them, from the end, that let the pool admit `head` (module notes)."""
        kv = self.kv_cache_manager
        reserve = self._admission_reserve()
        admission = self._admission(head, plan.token_budget, reserve)
        num_needed = (
            kv.num_blocks_to_take(head, admission.num_new, admission.hit_blocks)
            + admission.num_reserved
        )
        candidates = self.running[first_after:]
        num_victims = self._num_victims(num_needed, admission.hit_blocks, candidates)
        if (
            num_victims == len(candidates)
            and not plan.num_scheduled_tokens
            and not any(request.num_output_placeholders > 0 for request in self.requests.values())
        ):
            return  # the step would idle: nothing else to run, no token in flight
        for _ in range(num_victims):
            self._preempt(self.running.pop())
            plan.num_preempted += 1

    def _num_victims(
        self, num_needed: int, hit_blocks: list[int], candidates: list[Request]
    ) -> int:
        """How many of `candidates`, from the end, must be preempted before `num_needed` blocks outside
        `hit_blocks` are free; 0 if none need be, or if all of them would not do."""
        kv = self.kv_cache_manager
        ref_cnts = kv.pool.ref_cnts
        hits = set(hit_blocks)
        num_free = kv.pool.num_free_blocks - kv.num_free_hits(list(hits))
        num_holders: dict[
            int, int
        ] = {}  # block id -> holders left once the victims so far are gone
        for num_victims, victim in enumerate(reversed(candidates)):
            if num_free >= num_needed:
                return num_victims
            for block_id in kv.all_block_ids(victim.request_id):
                if block_id == NULL_BLOCK_ID:
                    continue
                num_holders[block_id] = num_holders.get(block_id, ref_cnts[block_id]) - 1
                if num_holders[block_id] == 0 and block_id not in hits:
                    num_free += 1
        return len(candidates) if num_free >= num_needed else 0

    def _admission(
        self, request: Request, token_budget: int, reserve: AdmissionReserve
    ) -> _Admission:
        """What admitting the waiting `request` with token_budget left would take (nothing taken yet)."""
        hit_blocks, num_hit_tokens = self.kv_cache_manager.get_computed_blocks(
            request, token_budget
        )
        num_new = min(request.num_tokens - num_hit_tokens, token_budget)
        num_kv_tokens = num_hit_tokens + num_new
        num_held = self.kv_cache_manager.num_held_after_admission(hit_blocks, num_kv_tokens)
        num_reserved, own_blocks = reserve.blocks_to_keep(
            request, self._sort_key(request), num_kv_tokens, num_held
        )
        return _Admission(hit_blocks, num_hit_tokens, num_new, num_reserved, own_blocks)

    def _admission_reserve(self) -> AdmissionReserve:
        kv = self.kv_cache_manager
        return AdmissionReserve(
            self.running,
            self.growth,
            kv.block_size,
            self._sort_key,
            lambda request: kv.num_held_blocks(request.request_id),
        )

    def _schedule_waiting(self, plan: _StepPlan) -> None:
        """Admits while the budget, max_num_seqs and the pool allow, keeping free the blocks the
        admitted request and the running ones ranked before it are expected to grow into
        (core/growth.py)."""
        kv = self.kv_cache_manager
        i = 0
        reserve = None  # built once something may be admitted
        while (
            i < len(self.waiting)
            and min(plan.token_budget, plan.prompt_budget) > 0
            and len(self.running) < self.config.max_num_seqs
        ):
            request = self.waiting[i]
            if request.num_output_placeholders > 0 or not _grammar_ready(request):
                i += 1  # preempted with a token still in flight, or its grammar still compiles
                continue
            if reserve is None:
                reserve = self._admission_reserve()
            admission = self._admission(
                request, min(plan.token_budget, plan.prompt_budget), reserve
            )
            if (
                kv.allocate_slots(
                    request, admission.num_new, admission.hit_blocks, admission.num_reserved
                )
                is None
            ):
                break
            reserve.admit(self._sort_key(request), admission.own_blocks)
            del self.waiting[i]
            self._start_running(request, admission.num_hit_tokens)
            plan.new_reqs.append(
                NewRequestData(
                    req_id=request.request_id,
                    prompt_token_ids=request.prompt_token_ids,
                    output_token_ids=list(request.output_token_ids),
                    sampling_params=request.sampling_params,
                    block_ids=list(kv.get_block_ids(request.request_id)),
                    num_computed_tokens=admission.num_hit_tokens,
                    prompt_embeds=request.prompt_embeds,
                    group_block_ids=kv.other_group_block_ids(request.request_id),
                )
            )
            self._commit(request, admission.num_new, plan)

    def _num_new_tokens(self, request: Request, token_budget: int) -> int:
        """0 when the request's next sample would pass max_tokens or max_model_len, or when it
        speculates and waits for its drafts (core/spec_plan.py). A constrained request runs with
        a token in flight too: the engine core fills its bitmask once that token is back, while
        the device runs the step's forward (engine_core.py)."""
        if self.spec is not None and self.spec.waits(request, len(self.running)):
            return 0
        num_outputs = len(request.output_token_ids) + request.num_output_placeholders
        num_tokens = len(request.prompt_token_ids) + num_outputs  # known and in flight
        if num_outputs >= request.max_tokens or num_tokens >= self.max_model_len:
            return 0
        return min(num_tokens - request.num_computed_tokens, token_budget)

    def _commit(self, request: Request, num_new: int, plan: _StepPlan, num_drafts: int = 0) -> None:
        """num_drafts: the last of the num_new positions are drafts (the request samples)."""
        plan.num_scheduled_tokens[request.request_id] = num_new
        plan.token_budget -= num_new
        if self.spread is not None and _catching_up(request):
            plan.prompt_budget -= num_new
        request.num_computed_tokens += num_new
        if num_drafts:
            plan.num_draft_tokens[request.request_id] = num_drafts
        num_verified = request.num_computed_tokens - num_drafts
        if num_verified == request.num_tokens + request.num_output_placeholders:
            plan.sampling_req_ids.add(request.request_id)
            request.num_output_placeholders += 1

    def _start_running(self, request: Request, num_hit_tokens: int) -> None:
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = num_hit_tokens
        if request.num_cached_tokens < 0:
            request.num_cached_tokens = num_hit_tokens
        if request.first_scheduled_time is None:
            request.first_scheduled_time = time.time()
        bisect.insort(self.running, request, key=self._sort_key)

    def _preempt(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        if self.spec is not None:
            self.spec.forget(request.request_id)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self._finished_req_ids.add(request.request_id)
        self._enqueue_waiting(request, front=True)

    def _enqueue_waiting(self, request: Request, front: bool) -> None:
        if self.config.policy == "priority":
            bisect.insort(self.waiting, request, key=self._sort_key)
        elif front:
            self.waiting.insert(0, request)
        else:
            self.waiting.append(request)

    def _sort_key(self, request: Request) -> tuple:
        return self._sort_keys[request.request_id]

    # ---- finishing ----

    def _append_tokens(
        self,
        request: Request,
        token_ids: list[int],
        logprobs: list[Logprobs] | None,
        prompt_logprobs: list[Logprobs | None] | None,
    ) -> EngineCoreOutput:
        new_token_ids: list[int] = []
        status = None
        grammar = request.structured_output
        for token_id in token_ids:
            request.append_output_token(token_id)
            new_token_ids.append(token_id)
            status = request.check_stop(self.max_model_len)
            if grammar is not None and grammar.accept_token(token_id) and status is None:
                status = RequestStatus.FINISHED_STOPPED  # the grammar ended
            if status is not None:
                self._finish(request, status)
                break
        return EngineCoreOutput(
            req_id=request.request_id,
            new_token_ids=new_token_ids,
            new_logprobs=logprobs[: len(new_token_ids)] if logprobs is not None else None,
            prompt_logprobs=prompt_logprobs,
            finish_reason=request.status.finish_reason,
            stop_reason=request.stop_reason if status is not None else None,
            num_cached_tokens=max(request.num_cached_tokens, 0),
        )

    def _finish_ids(self, req_ids: Iterable[str], status: RequestStatus) -> list[Request]:
        if isinstance(req_ids, str):
            req_ids = [req_ids]
        finished = [
            self.requests[req_id] for req_id in dict.fromkeys(req_ids) if req_id in self.requests
        ]
        for request in finished:
            self._finish(request, status)
        self._drop_finished_running()
        return finished

    def _finish(self, request: Request, status: RequestStatus) -> None:
        """Frees the request; a running one leaves `running` in `_drop_finished_running`."""
        if request.status != RequestStatus.RUNNING:
            self.waiting.remove(request)
        else:
            self._running_finished = True
        request.status = status
        if status != RequestStatus.FINISHED_ABORTED:
            self.growth.observe_finished(request)
        self.kv_cache_manager.free(request)
        if self.spec is not None:
            self.spec.forget(request.request_id)
        del self.requests[request.request_id]
        del self._sort_keys[request.request_id]
        self._num_prompt_logprobs_sent.pop(request.request_id, None)
        self._finished_req_ids.add(request.request_id)

    def _drop_finished_running(self) -> None:
        if self._running_finished:
            self.running = [request for request in self.running if not request.is_finished]
            self._running_finished = False

    def _assert_fits(self, request: Request) -> None:
        """A request can always finish: the engine's fit_context (engine/llm_engine.py) checks
        the prompt against max_model_len and resolves max_tokens to at least 1; EngineCore's
        _check_kv_capacity makes the KV cache hold max_model_len - 1 tokens."""
        num_prompt = request.num_prompt_tokens
        assert 0 < num_prompt < self.max_model_len, (
            f"prompt_token_ids: {num_prompt} tokens, max_model_len={self.max_model_len}"
        )
        assert request.max_tokens >= 1, f"max_tokens must be at least 1, got {request.max_tokens}"
        # The last sampled token needs no KV.
        num_kv_tokens = min(num_prompt + request.max_tokens, self.max_model_len) - 1
        capacity = self.kv_cache_manager.capacity_tokens
        assert num_kv_tokens <= capacity, (
            f"the request may need KV for {num_kv_tokens} tokens, the cache holds {capacity}"
        )


def _catching_up(request: Request) -> bool:
    """Not decoding: more than one known token (prompt, or outputs after a preemption) has no KV."""
    return request.num_tokens - request.num_computed_tokens > 1


def _grammar_ready(request: Request) -> bool:
    """A constrained request is admitted once its grammar is compiled (engine core's pool)."""
    grammar = request.structured_output
    return grammar is None or grammar.is_ready()
