"""The step loop: schedule → execute → update, in process.

Sync mode runs one step at a time. Async mode keeps one step in flight: step N+1 is planned
and launched before step N's sampled tokens reach the host, so the CPU plans while the device
computes. The scheduler accounts for the tokens still in flight (placeholders), so both modes
produce the same tokens.

A step with structured outputs' constrained rows launches its forward first; then step N is
collected (its tokens advance the matchers) and step N+1's bitmask filled while the device runs
that forward, and only then is N+1's sampling launched (vLLM's order). So a constrained request
samples every step as any other, and the device waits on the host only if the collection and the
fill outlast the forward.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

from pagedlm.config import EngineConfig
from pagedlm.core.sched_output import EngineCoreOutput, SchedulerOutput
from pagedlm.core.scheduler import SchedulerStats
from pagedlm.engine.lifecycle import EngineLifecycle
from pagedlm.executor.base import Executor
from pagedlm.request import Request, RequestStatus
from pagedlm.structured_outputs.manager import StructuredOutputManager, StructuredOutputStats

logger = logging.getLogger(__name__)

_MAX_STEPS_IN_FLIGHT = 2


@dataclass(slots=True)
class EngineStats(SchedulerStats):
    """The scheduler's stats and structured outputs' counters (cumulative)."""

    num_grammar_compiles: int = 0
    grammar_compile_seconds: float = 0.0
    num_grammar_compile_waits: int = 0  # the step loop blocked on a compile (nothing else ran)


class EngineCore:
    def __init__(self, config: EngineConfig, tokenizer: Any = None) -> None:
        """tokenizer: what structured outputs compile their grammars for (None: none can)."""
        self.config = config
        self.tokenizer = tokenizer
        self._init_executor()
        self._init_scheduler()
        self.executor.init_kv_cache(self.num_blocks)
        async_scheduling = config.scheduler.async_scheduling
        self._max_steps_in_flight = _MAX_STEPS_IN_FLIGHT if async_scheduling else 1
        self._in_flight: deque[tuple[SchedulerOutput, Any]] = deque()  # (plan, pending output)
        self._drained: list[EngineCoreOutput] = []  # collected between steps, for the next step()
        self.lifecycle = EngineLifecycle(self.executor)  # pause, sleep, RPCs (lifecycle.py)
        self.structured_outputs: StructuredOutputManager | None = None  # made on first use
        # What exists now (the model, imported libraries: ~200k tracked objects) lives as long as the
        # engine: moved out of the cyclic GC's way, a full collection while serving walks only what
        # was made since (one took ~140 ms of a 0.9 s T0-shaped generate on the CPU). Start-up's
        # cyclic garbage is collected first: frozen, it would never be. The engine itself is freed
        # by reference counting when dropped (tests/engine: no cycle may hold it).
        gc.collect()
        gc.freeze()

    def _init_executor(self) -> None:
        from pagedlm.executor import make_executor

        # in process at tp = 1; at tp > 1 its worker processes (pagedlm/executor/)
        self.executor: Executor | None = make_executor(self.config)
        self.num_blocks = self.executor.determine_num_blocks()  # logs the KV cache's size

    @property
    def model_runner(self) -> Any:
        """The in-process ModelRunner (uni, external_launcher; for inspection); None where the
        model runs in worker processes or the core was shut down."""
        return None if self.executor is None else self.executor.runner

    def _init_scheduler(self) -> None:
        from pagedlm.core.scheduler import Scheduler
        from pagedlm.model.llama import model_kv_groups

        max_model_len = self.config.model.max_model_len
        # one group, or several where full and sliding layers mix (core/kv_groups.py); with
        # PAGEDLM_FREE_SLIDING_WINDOW=0 one group keeps every block (the kernels still window)
        group_windows = tuple(window for window, _ in model_kv_groups(self.config.model))
        self.scheduler = Scheduler(
            self.config.scheduler,
            self.config.cache,
            self.num_blocks,
            max_model_len,
            speculative=self.config.speculative,
            group_windows=group_windows,
        )
        _check_kv_capacity(
            self.scheduler.kv_cache_manager.capacity_tokens, max_model_len, self.num_blocks
        )

    def add_request(self, request: Request) -> None:
        self.lifecycle.check_accepts_requests()
        self.scheduler.add_request(request)
        if request.sampling_params.structured_outputs is not None:
            self._structured_outputs().add_request(request)

    def _structured_outputs(self) -> StructuredOutputManager:
        if self.structured_outputs is None:
            self.structured_outputs = StructuredOutputManager(self.config.model, self.tokenizer)
        return self.structured_outputs

    def abort_requests(self, request_ids: list[str]) -> list[EngineCoreOutput]:
        return self.scheduler.abort_requests(request_ids)

    def finish_requests(self, request_ids: list[str]) -> None:
        """Requests a stop string ended (the detokenizer decides): free them."""
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_STOPPED)

    def call_utility(self, method: str, args: list | tuple = (), kwargs: dict | None = None) -> Any:
        """An engine utility by name, between steps (engine/lifecycle.py: collective_rpc, sleep,
        pause, ...)."""
        return self.lifecycle.call(self, method, args, kwargs)

    def shutdown(self) -> None:
        """Every request aborted, the model runner and all it holds freed; the core takes no
        request or utility call afterwards."""
        from pagedlm.worker.sleep import free_engine_memory

        if self.executor is None:
            return
        if self.executor.failed is None:
            self.drain()
        else:  # a TP worker died (executor/multiproc.py): no step in flight can be collected
            self._in_flight.clear()
        self.abort_all()
        self._drained = []
        self.lifecycle.shut_down = True
        if self.structured_outputs is not None:
            self.structured_outputs.shutdown()
        device = self.executor.device
        self.executor.shutdown()
        self.executor = None
        free_engine_memory(device)

    def abort_all(self) -> None:
        """Every request finishes with reason "abort"; their outputs come with the next step()."""
        self._drained += self.abort_requests(list(self.scheduler.requests))

    def has_unfinished_requests(self) -> bool:
        return (
            self.scheduler.has_unfinished_requests() or bool(self._in_flight) or bool(self._drained)
        )

    @property
    def has_drained_outputs(self) -> bool:
        return bool(self._drained)

    def has_work(self) -> bool:
        """step() would do something: outputs to give, steps in flight, or requests it may run
        (not while paused or asleep)."""
        return (
            bool(self._drained)
            or bool(self._in_flight)
            or (not self.lifecycle.blocks_steps and self.scheduler.has_unfinished_requests())
        )

    def drain(self) -> None:
        """Collects every step in flight (between steps: an RPC, a pause); their outputs come with
        the next step()."""
        while self._in_flight:
            sched_output, pending = self._in_flight.popleft()
            self._drained += self._update(sched_output, pending)

    def get_stats(self) -> EngineStats:
        stats = self.scheduler.get_stats()
        manager = self.structured_outputs
        grammars = StructuredOutputStats() if manager is None else manager.stats
        return EngineStats(
            **{f.name: getattr(stats, f.name) for f in dataclasses.fields(stats)},
            num_grammar_compiles=grammars.num_compiles,
            grammar_compile_seconds=grammars.compile_seconds,
            num_grammar_compile_waits=grammars.num_compile_waits,
        )

    def step(self) -> list[EngineCoreOutput]:
        """Launches the next step when there is work and a free slot; collects the oldest step
        once the pipeline is full or nothing new could be launched. Outputs collected between
        steps (drain, abort_all) come first, alone."""
        if self._drained:
            drained, self._drained = self._drained, []
            return drained
        outputs = self._fail_grammars()
        launched = False
        if (
            len(self._in_flight) < self._max_steps_in_flight
            and not self.lifecycle.blocks_steps
            and self.scheduler.has_unfinished_requests()
        ):
            launched = self._launch(outputs)
        if not self._in_flight or (launched and len(self._in_flight) < self._max_steps_in_flight):
            return outputs
        return outputs + self._update(*self._in_flight.popleft())

    def _fail_grammars(self) -> list[EngineCoreOutput]:
        """Aborts the requests whose grammar failed to compile or timed out; their outputs say why."""
        if not self._structured_outputs_pending():
            return []
        failed = self.structured_outputs.take_failed()
        outputs = self.scheduler.abort_requests(list(failed))
        for output in outputs:
            output.error = failed[output.req_id]
            logger.warning("request %s failed: %s", output.req_id, output.error)
        return outputs

    def _update(self, sched_output: SchedulerOutput, pending: Any) -> list[EngineCoreOutput]:
        """A collected step's outputs, stamped with the weights' version (updates run between
        steps, so a step's tokens all come from the version current when it is collected)."""
        outputs = self.scheduler.update_from_output(sched_output, pending.get_output())
        version = self.lifecycle.weight_version
        for output in outputs:
            output.weight_version = version
        return outputs

    def _launch(self, collected: list[EngineCoreOutput]) -> bool:
        """Schedules and launches a step: its forward, then (with constrained rows: after the steps
        in flight are collected into `collected`, advancing the matchers, and the bitmask is filled
        while the device runs the forward) its sampling. True when it has work."""
        sched_output = self.scheduler.schedule()
        if sched_output.is_empty and not sched_output.finished_req_ids:
            if not self._in_flight and self._structured_outputs_pending():
                self.structured_outputs.wait_for_compile()  # nothing else could run
            elif not self._in_flight and self.scheduler.has_unfinished_requests():
                raise RuntimeError(
                    "scheduler: unfinished requests but nothing could be "
                    "scheduled with no step in flight (is the KV cache too small?)"
                )
            return False
        rows = None
        if self.structured_outputs is not None and sched_output.sampling_req_ids:
            rows = self.structured_outputs.constrained_rows(sched_output, self.scheduler.requests)
        self.executor.execute_forward(sched_output)
        mask = None
        if rows is not None:
            while self._in_flight:  # their tokens: the matchers' last before this step
                collected += self._update(*self._in_flight.popleft())
            manager = self.structured_outputs
            mask = manager.fill(rows, self.executor.grammar_bitmask(manager.num_words))
        self._in_flight.append((sched_output, self.executor.sample_tokens(mask)))
        return not sched_output.is_empty

    def _structured_outputs_pending(self) -> bool:
        return self.structured_outputs is not None and self.structured_outputs.has_pending()


def _check_kv_capacity(capacity_tokens: int, max_model_len: int, num_blocks: int) -> None:
    """A request of max_model_len tokens must fit (its last sampled token needs no KV),
    or a long request could never run."""
    if capacity_tokens < max_model_len - 1:
        raise ValueError(
            f"KV cache: {num_blocks} blocks hold {capacity_tokens} tokens, fewer than "
            f"max_model_len={max_model_len} needs ({max_model_len - 1}); raise "
            "num_gpu_blocks_override, kv_cache_memory_gib or gpu_memory_utilization, or lower "
            "max_model_len"
        )
