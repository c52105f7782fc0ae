"""collective_rpc's worker side: the methods a caller may run on every worker, by name.

Registering a method is one line in WORKER_METHODS: its public name -> "module:function". The
function is called as `function(model_runner, *args, **kwargs)` and its return value is that
worker's result (`LLM.collective_rpc` returns one per worker). It runs between steps, never inside
one: the engine core collects the steps in flight first (EngineCore.collective_rpc). Across the
server's core process the arguments and the result travel as msgpack (engine/wire.py), so keep
them to None, bools, numbers, strings, lists and dicts there; in process (offline `LLM`) any
Python object goes, tensors included. A module is imported on the first call of one of its
methods, so a method's module may import what it needs freely.

Errors: an unknown method raises InvalidRequest(param="method"); a ValueError or TypeError from the
method (bad arguments: a wrong shape, a missing file) raises InvalidRequest(param="args"); anything
else raises WorkerMethodError. Either way the engine keeps running.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from pagedlm.errors import InvalidRequest

WORKER_METHODS: dict[str, str] = {
    "memory_footprint": "pagedlm.worker.sleep:memory_footprint",
    "reload_weights": "pagedlm.worker.weight_update:reload_weights",
    "update_weights_from_tensor": "pagedlm.worker.weight_update:update_weights_from_tensor",
    "init_weight_transfer_engine": "pagedlm.worker.weight_update:init_weight_transfer_engine",
    "start_weight_update": "pagedlm.worker.weight_update:start_weight_update",
    "update_weights": "pagedlm.worker.weight_update:update_weights",
    "finish_weight_update": "pagedlm.worker.weight_update:finish_weight_update",
    "get_weight_version": "pagedlm.worker.weight_update:get_weight_version",
    "get_weight_shard_layout": "pagedlm.worker.weight_update:get_weight_shard_layout",
    "update_weight_version": "pagedlm.worker.weight_update:update_weight_version",
    "shutdown_weight_transfer_engine": (
        "pagedlm.worker.weight_update:shutdown_weight_transfer_engine"
    ),
}
# The methods that write the weights: refused while the weights sleep (vLLM: "asleep").
WEIGHT_WRITERS = frozenset(
    {
        "reload_weights",
        "update_weights_from_tensor",
        "start_weight_update",
        "update_weights",
        "finish_weight_update",
    }
)


class WorkerMethodError(RuntimeError):
    """A worker method failed for a reason other than its arguments."""


def resolve(method: Any) -> Callable[..., Any]:
    """The registered function of `method`; InvalidRequest when there is none."""
    target = WORKER_METHODS.get(method) if isinstance(method, str) else None
    if target is None:
        raise InvalidRequest(
            f"method: {method!r} is not a worker method; registered: {sorted(WORKER_METHODS)}",
            param="method",
        )
    module_name, function_name = target.split(":")
    return getattr(importlib.import_module(module_name), function_name)


def call_worker_method(
    model_runner: Any, method: str, args: tuple | list = (), kwargs: dict | None = None
) -> Any:
    """Runs one registered method on this process's worker; errors as the module says (an
    executor's collective_rpc calls it on every rank)."""
    function = resolve(method)
    if not isinstance(args, (tuple, list)) or not isinstance(kwargs or {}, dict):
        raise InvalidRequest("args must be a list and kwargs a dict", param="args")
    try:
        return function(model_runner, *args, **(kwargs or {}))
    except InvalidRequest:
        raise
    except (ValueError, TypeError) as exc:
        raise InvalidRequest(f"{method}: {exc}", param="args") from exc
    except Exception as exc:
        raise WorkerMethodError(f"{method} failed: {type(exc).__name__}: {exc}") from exc
