"""The offline LLM's memory-lifecycle and RL methods (vLLM's names): collective_rpc, sleep /
wake_up, pause / resume, reset_prefix_cache, shutdown. Each runs between steps, in process; the
rules are engine/lifecycle.py's."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pagedlm.errors import InvalidRequest

if TYPE_CHECKING:
    import torch

    from pagedlm.engine.llm_engine import LLMEngine

PAUSE_MODES = ("abort", "wait", "keep")
ENGINE_PAUSED = "engine_paused"


class LifecycleMixin:
    llm_engine: LLMEngine

    def collective_rpc(
        self, method: str, args: tuple | list = (), kwargs: dict[str, Any] | None = None
    ) -> list[Any]:
        """Runs a registered worker method (pagedlm/worker/rpc.py) on every worker; one result
        per worker."""
        return self.llm_engine.call_core("collective_rpc", method, args, kwargs)

    def update_weights_from_tensor(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], weight_version: str | None = None
    ) -> str:
        """A colocated trainer's tensors (Hugging Face names; a subset is fine) copied in place
        (pagedlm/worker/weight_update.py); returns the new weight version."""
        return self.collective_rpc(
            "update_weights_from_tensor",
            kwargs={"named_tensors": list(named_tensors), "weight_version": weight_version},
        )[0]

    # vLLM's four-phase weight transfer (pagedlm/worker/weight_update.py; pagedlm.rl for the
    # trainer): init_weight_transfer_engine -> start_weight_update -> update_weights (repeated)
    # -> finish_weight_update. update_weights blocks until the trainer broadcasts.
    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.collective_rpc("init_weight_transfer_engine", (init_info,))

    def start_weight_update(self) -> None:
        self.collective_rpc("start_weight_update")

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.collective_rpc("update_weights", (update_info,))

    def finish_weight_update(self, weight_version: str | None = None) -> str:
        """The new weights' version (outputs' weight_versions spans name it)."""
        return self.collective_rpc("finish_weight_update", (weight_version,))[0]

    def update_weight_version(self, weight_version: str) -> str:
        return self.collective_rpc("update_weight_version", (weight_version,))[0]

    def get_weight_version(self) -> str:
        return self.collective_rpc("get_weight_version")[0]

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        """Frees the KV cache and the weights' device memory (level 1: weights kept in host
        memory; level 2: discarded). Requests in flight: "abort" (vLLM's default), "wait" for them
        to finish, or "keep" them (they recompute after wake_up)."""
        if mode == "wait":
            self.llm_engine.wait_for_requests()
        self.llm_engine.call_core("sleep", level, mode)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """tags: "weights", "kv_cache" (default both); after level 2, wake "weights", reload them,
        then "kv_cache"."""
        self.llm_engine.call_core("wake_up", tags)

    def is_sleeping(self) -> bool:
        return self.llm_engine.call_core("is_sleeping")

    def reset_prefix_cache(self) -> bool:
        """False (nothing reset) while requests hold KV-cache blocks."""
        return self.llm_engine.call_core("reset_prefix_cache")

    def pause_generation(self, mode: str = "abort") -> None:
        """No step runs until resume_generation(). Requests in flight: "abort" them, "wait" for
        them to finish, or "keep" them (they go on after resume)."""
        if mode not in PAUSE_MODES:
            raise InvalidRequest(
                f"mode must be one of {', '.join(PAUSE_MODES)}; got {mode!r}", param="mode"
            )
        if mode == "wait":
            self.llm_engine.wait_for_requests()
        self.llm_engine.call_core("pause", "keep" if mode == "wait" else mode)

    def resume_generation(self) -> None:
        self.llm_engine.call_core("resume")

    def is_paused(self) -> bool:
        return self.llm_engine.call_core("is_paused")

    def shutdown(self) -> None:
        """Aborts what runs and frees all the engine's memory, device memory included; the LLM
        serves nothing afterwards. Idempotent."""
        self.llm_engine.engine_core.shutdown()

    def __del__(self) -> None:
        """A dropped LLM frees its memory by reference counting; on CUDA also what a reference
        cycle held after the engine's gc.freeze() and the cached blocks (shutdown)."""
        engine = getattr(self, "llm_engine", None)  # None: __init__ failed
        if engine is not None and not sys.is_finalizing() and engine.config.device.type == "cuda":
            self.shutdown()

    def check_generating(self) -> None:
        """generate() and chat() refuse while paused: nothing would run."""
        if self.is_paused():
            raise InvalidRequest(
                "the engine is paused: call resume_generation() first", code=ENGINE_PAUSED
            )
