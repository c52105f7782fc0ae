"""The engine core's life between steps: collective_rpc, pause / resume, sleep / wake_up and the
prefix-cache reset (vLLM's names). Each runs between steps: the steps in flight are collected
first (EngineCore.drain), their outputs come with the next EngineCore.step().

Pause (`pause("abort" | "keep")`): no step runs until resume(); "abort" first finishes every
request with finish reason "abort", "keep" leaves them where they are (they go on after resume).
vLLM's third mode, "wait", is the front end's: it stops taking requests and waits for those in
flight to finish before pausing (LLMEngine.pause_generation, AsyncLLM.pause_generation).

Sleep (`sleep(level, mode)`, enable_sleep_mode only): the requests go first as the mode says
("abort", vLLM's default; "keep": running requests are preempted and recompute once awake; "wait"
is again the front end's), the prefix cache is reset (its KV is gone), and the worker frees its
memory (pagedlm/worker/sleep.py): level 1 keeps the weights in host memory, level 2 drops them
(reload_weights or a weight update fills them again after wake_up(["weights"])). While any part
sleeps no step runs and a new request is refused (InvalidRequest, code "engine_sleeping").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pagedlm.errors import InvalidRequest
from pagedlm.worker.sleep import SLEEP_TAGS

if TYPE_CHECKING:
    from pagedlm.engine.engine_core import EngineCore
    from pagedlm.executor.base import Executor

PAUSE_MODES = ("abort", "keep")  # the core's; front ends add "wait"
SLEEP_MODES = ("abort", "keep", "wait")
ENGINE_SLEEPING = "engine_sleeping"
ENGINE_SHUT_DOWN = "engine_shut_down"

# What a front end may call on the core by name (the server's core process: wire.UtilityCall).
UTILITY_METHODS = frozenset(
    {
        "collective_rpc",
        "pause",
        "resume",
        "is_paused",
        "sleep",
        "wake_up",
        "is_sleeping",
        "reset_prefix_cache",
    }
)


class EngineLifecycle:
    """The state; each operation takes the core (no reference back to it: an engine must be freed
    by reference counting alone, see EngineCore)."""

    def __init__(self, executor: Executor) -> None:
        self.paused = False
        self.sleep_level = 0  # of the last sleep() while any tag still sleeps
        self.asleep: set[str] = set()  # tags of SLEEP_TAGS now asleep
        self.shut_down = False  # EngineCore.shutdown: nothing runs any more
        # the worker's weights' version (an RPC may change it): what outputs are stamped with
        self.weight_version: str = executor.collective_rpc("get_weight_version")

    @property
    def blocks_steps(self) -> bool:
        return self.paused or bool(self.asleep)

    def call(
        self, core: EngineCore, method: str, args: list | tuple = (), kwargs: dict | None = None
    ) -> Any:
        """A utility by name (UTILITY_METHODS); InvalidRequest for any other."""
        if self.shut_down:
            raise InvalidRequest(f"{method}: the engine was shut down", code=ENGINE_SHUT_DOWN)
        if method not in UTILITY_METHODS:
            raise InvalidRequest(
                f"method: {method!r} is not an engine utility; known: {sorted(UTILITY_METHODS)}",
                param="method",
            )
        return getattr(self, method)(core, *args, **(kwargs or {}))

    def collective_rpc(
        self, core: EngineCore, method: str, args: list | tuple = (), kwargs: dict | None = None
    ) -> list[Any]:
        """A list of rank 0's result (the ranks' results are alike or rank 0's alone counts:
        executor/base.py); see pagedlm/worker/rpc.py."""
        from pagedlm.worker.rpc import WEIGHT_WRITERS

        if method in WEIGHT_WRITERS and "weights" in self.asleep:
            raise InvalidRequest(
                f"method: {method} while the weights are asleep; wake_up(['weights']) first",
                param="method",
                code=ENGINE_SLEEPING,
            )
        core.drain()
        try:
            return [core.executor.collective_rpc(method, args, kwargs)]
        finally:
            self._check_weight_version(core)

    def _check_weight_version(self, core: EngineCore) -> None:
        """New weights (an RPC changed the version): no KV of the old ones may serve again, so the
        running requests recompute (preempted) and the prefix cache is reset; later outputs carry
        the new version."""
        version = core.executor.collective_rpc("get_weight_version")
        if version == self.weight_version:
            return
        self.weight_version = version
        core.scheduler.preempt_all()
        if not core.scheduler.reset_prefix_cache():
            raise AssertionError("a block is still held with no request running")

    def check_accepts_requests(self) -> None:
        if self.shut_down:
            raise InvalidRequest("the engine was shut down", code=ENGINE_SHUT_DOWN)
        if self.asleep:
            raise InvalidRequest(
                f"the engine is sleeping ({', '.join(sorted(self.asleep))} released): call "
                "wake_up() first",
                code=ENGINE_SLEEPING,
            )

    # ---- pause ----

    def pause(self, core: EngineCore, mode: str = "abort") -> None:
        _check_choice("mode", mode, PAUSE_MODES)
        core.drain()
        if mode == "abort":
            core.abort_all()
        self.paused = True

    def resume(self, core: EngineCore) -> None:
        self.paused = False

    def is_paused(self, core: EngineCore) -> bool:
        return self.paused

    def reset_prefix_cache(self, core: EngineCore) -> bool:
        """False (nothing reset) while a request holds KV-cache blocks, as vLLM."""
        core.drain()
        return core.scheduler.reset_prefix_cache()

    # ---- sleep ----

    def sleep(self, core: EngineCore, level: int = 1, mode: str = "abort") -> None:
        if not core.config.enable_sleep_mode:
            raise InvalidRequest(
                "sleep: the engine was started without enable_sleep_mode "
                "(LLM(enable_sleep_mode=True), --enable-sleep-mode)",
                param="enable_sleep_mode",
            )
        if level not in (1, 2) or isinstance(level, bool):
            raise InvalidRequest(f"level must be 1 or 2, got {level!r}", param="level")
        _check_choice("mode", mode, SLEEP_MODES)
        core.drain()
        if mode == "wait" and core.scheduler.has_unfinished_requests():
            raise InvalidRequest(
                "mode: 'wait' needs the requests in flight finished first (the front end "
                "waits for them)",
                param="mode",
            )
        if mode == "abort":
            core.abort_all()
        core.scheduler.preempt_all()  # mode "keep": they recompute once awake
        if not core.scheduler.reset_prefix_cache():
            raise AssertionError("a block is still held with no request running")
        to_sleep = set(SLEEP_TAGS) - self.asleep
        core.executor.sleep(level, to_sleep)
        self.asleep |= to_sleep
        self.sleep_level = max(self.sleep_level, level)

    def wake_up(self, core: EngineCore, tags: list[str] | None = None) -> bool:
        """Wakes the tags given (all by default); True once nothing sleeps any more."""
        tags = list(SLEEP_TAGS) if tags is None else list(tags)
        for tag in tags:
            _check_choice("tags", tag, SLEEP_TAGS)
        waking = self.asleep & set(tags)
        if waking:
            core.executor.wake_up(waking)
            self.asleep -= waking
        if not self.asleep:
            self.sleep_level = 0
        return not self.asleep

    def is_sleeping(self, core: EngineCore) -> bool:
        return bool(self.asleep)


def _check_choice(param: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InvalidRequest(
            f"{param} must be one of {', '.join(choices)}; got {value!r}", param=param
        )
