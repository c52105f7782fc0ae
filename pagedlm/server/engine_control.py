"""AsyncLLM's engine utilities over the core process (wire.UtilityCall / UtilityResult):
collective_rpc, sleep / wake_up, pause / resume, reset_prefix_cache, with the offline LLM's
names and rules (engine/lifecycle.py). At data_parallel_size > 1 a call goes to every core and
their answers are combined as the offline engine's (data_parallel.combine_utility_results); the
first core's error is the call's. Mode "wait" is done here: new requests get 503 while the
requests in flight finish, then the core pauses or sleeps. While the engine is paused or asleep
new requests get 503 (`admission_problem`)."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Any

from pagedlm.engine import wire
from pagedlm.engine.data_parallel import combine_utility_results
from pagedlm.engine.lifecycle import ENGINE_SLEEPING
from pagedlm.errors import InvalidRequest
from pagedlm.llm_lifecycle import ENGINE_PAUSED, PAUSE_MODES
from pagedlm.worker.rpc import WorkerMethodError

_WAIT_POLL_S = 0.05


@dataclass
class _Call:
    method: str
    future: asyncio.Future
    results: dict[int, Any] = field(default_factory=dict)  # dp rank -> its core's answer


class EngineControl:
    """Mixed into AsyncLLM: needs its `core` (RemoteCore), `_queues` and `check_alive()`."""

    def _init_control(self) -> None:
        self._call_ids = itertools.count()
        self._calls: dict[int, _Call] = {}
        self._paused = False
        self._sleeping = False
        self._waiting_to_pause = False  # mode "wait": the requests in flight are finishing

    async def call_utility(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """An engine-core utility; its error raised here (InvalidRequest for the caller's)."""
        self.check_alive()
        call_id = next(self._call_ids)
        call = _Call(method, asyncio.get_running_loop().create_future())
        self._calls[call_id] = call
        try:
            self.core.send_to_all(wire.UtilityCall(call_id, method, list(args), kwargs))
            return await call.future
        finally:
            self._calls.pop(call_id, None)

    def _on_utility_result(self, msg: wire.UtilityResult, rank: int = 0) -> None:
        call = self._calls.get(msg.call_id)
        if call is None or call.future.done():
            return
        future = call.future
        if msg.error is None:
            call.results[rank] = msg.result
            num_cores = self.core.num_ranks
            if len(call.results) == num_cores:
                results = [call.results[r] for r in range(num_cores)]
                future.set_result(combine_utility_results(call.method, results))
        elif msg.invalid:
            future.set_exception(InvalidRequest(msg.error, param=msg.param, code=msg.code))
        else:
            future.set_exception(WorkerMethodError(msg.error))

    def _fail_calls(self, error: Exception) -> None:
        for call in self._calls.values():
            if not call.future.done():
                call.future.set_exception(error)

    @property
    def admission_problem(self) -> tuple[str, str] | None:
        """(why, code) new requests get 503 now, or None."""
        if self._sleeping:
            return "the engine is sleeping; POST /wake_up first", ENGINE_SLEEPING
        if self._paused or self._waiting_to_pause:
            return "generation is paused; POST /resume first", ENGINE_PAUSED
        return None

    async def collective_rpc(
        self, method: str, args: list | tuple = (), kwargs: dict | None = None
    ) -> list[Any]:
        return await self.call_utility("collective_rpc", method, list(args), kwargs or {})

    async def pause_generation(self, mode: str = "abort") -> None:
        if mode not in PAUSE_MODES:
            raise InvalidRequest(
                f"mode must be one of {', '.join(PAUSE_MODES)}; got {mode!r}", param="mode"
            )
        if mode == "wait":
            await self._wait_for_requests()
        self._paused = True  # before the call: a request sent meanwhile gets 503, not the core's no
        try:
            await self.call_utility("pause", "keep" if mode == "wait" else mode)
        except BaseException:
            self._paused = False
            raise

    async def resume_generation(self) -> None:
        await self.call_utility("resume")
        self._paused = False

    def is_paused(self) -> bool:
        return self._paused

    async def sleep(self, level: int = 1, mode: str = "abort") -> None:
        if mode == "wait":
            await self._wait_for_requests()
        self._sleeping = True  # as in pause_generation
        try:
            await self.call_utility("sleep", level, mode)
        except BaseException:
            self._sleeping = False
            raise
        self.metrics.set_sleep_level(level)

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        """True once nothing sleeps any more."""
        awake = await self.call_utility("wake_up", tags)
        self._sleeping = not awake
        if awake:
            self.metrics.set_sleep_level(0)
        return awake

    def is_sleeping(self) -> bool:
        return self._sleeping

    async def reset_prefix_cache(self) -> bool:
        return await self.call_utility("reset_prefix_cache")

    async def _wait_for_requests(self) -> None:
        """New requests get 503 while those in flight finish."""
        self._waiting_to_pause = True
        try:
            while self._queues:
                self.check_alive()
                await asyncio.sleep(_WAIT_POLL_S)
        finally:
            self._waiting_to_pause = False
