"""The memory-lifecycle and RL routes, served with --enable-dev-endpoints only (vLLM serves them
under VLLM_SERVER_DEV_MODE=1), behind the API key like every route but /health.

vLLM's:  POST /sleep?level=1&mode=abort, POST /wake_up?tags=weights&tags=kv_cache,
         GET /is_sleeping, POST /reset_prefix_cache, POST /pause?mode=abort|wait|keep,
         POST /resume, GET /is_paused,
         POST /collective_rpc {"method": str, "args": [...], "kwargs": {...}} -> {"results": [...]}.
         Weight transfer (vLLM's, over collective_rpc: pagedlm/worker/weight_update.py):
         POST /init_weight_transfer_engine {"init_info": {...}}, /start_weight_update,
         /update_weights {"update_info": {...}} (answers once the trainer's broadcast landed),
         /finish_weight_update {"weight_version": ...}, /update_weight_version
         {"new_version": ...}, GET /weight_info -> {"weight_version": ...}.
SGLang's aliases: POST /update_weights_from_disk {"model_path": ...} (reload_weights),
         POST /release_memory_occupation {"tags": [...] | null} (sleep level 1),
         POST /resume_memory_occupation {"tags": [...] | null}, POST /flush_cache,
         POST /pause_generation {"mode": "abort" | "in_place" | "retract"}, POST /continue_generation.

While asleep or paused, generation requests get 503 (AsyncLLM.admit); /health stays 200, as
vLLM's: the process is alive. A caller's mistake is a 400 naming the parameter."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from pagedlm.errors import InvalidRequest
from pagedlm.server.async_engine import AsyncLLM, EngineDeadError
from pagedlm.server.serving import APIError
from pagedlm.worker.rpc import WorkerMethodError

ParseBody = Callable[[Request, type[BaseModel]], Awaitable[Any]]
# SGLang's pause modes as ours: "retract" moves running requests back to waiting, which a "keep"
# pause does too in effect (they go on where they were).
_SGLANG_PAUSE_MODES = {"abort": "abort", "in_place": "keep", "retract": "keep"}


class CollectiveRPCRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    method: str
    args: list[Any] = []
    kwargs: dict[str, Any] = {}


class InitWeightTransferRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    init_info: dict[str, Any]


class UpdateWeightsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    update_info: dict[str, Any]


class FinishWeightUpdateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    weight_version: str | None = None


class WeightVersionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    new_version: str


class UpdateFromDiskRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model_path: str
    weight_version: str | None = None


class MemoryOccupationRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    tags: list[str] | None = None


class PauseGenerationRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    mode: str = "abort"


async def _engine_call(call: Awaitable[Any]) -> Any:
    """The engine's answer, or its error as the API's."""
    try:
        return await call
    except InvalidRequest as exc:
        raise APIError(400, str(exc), param=exc.param, code=exc.code) from None
    except WorkerMethodError as exc:
        raise APIError(500, str(exc), code="worker_method_failed") from None
    except EngineDeadError as exc:
        raise APIError(503, str(exc), code="engine_dead") from None


def _query_level(raw: Request) -> int:
    text = raw.query_params.get("level", "1")
    if text not in ("1", "2"):
        raise APIError(400, f"level must be 1 or 2, got {text!r}", param="level")
    return int(text)


def add_dev_routes(app: FastAPI, engine: AsyncLLM, parse_body: ParseBody) -> None:
    _add_sleep_routes(app, engine)
    _add_pause_routes(app, engine)
    _add_rpc_routes(app, engine, parse_body)
    _add_weight_routes(app, engine, parse_body)
    _add_sglang_aliases(app, engine, parse_body)


def _add_sleep_routes(app: FastAPI, engine: AsyncLLM) -> None:
    @app.post("/sleep")
    async def sleep(raw: Request) -> dict[str, Any]:
        level = _query_level(raw)
        await _engine_call(engine.sleep(level, raw.query_params.get("mode", "abort")))
        return {"status": "sleeping", "level": level}

    @app.post("/wake_up")
    async def wake_up(raw: Request) -> dict[str, Any]:
        tags = raw.query_params.getlist("tags") or None
        awake = await _engine_call(engine.wake_up(tags))
        return {"status": "awake" if awake else "sleeping", "tags": tags}

    @app.get("/is_sleeping")
    async def is_sleeping() -> dict[str, bool]:
        return {"is_sleeping": engine.is_sleeping()}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> dict[str, bool]:
        """success false: requests hold KV-cache blocks (vLLM's rule), nothing was reset."""
        return {"success": await _engine_call(engine.reset_prefix_cache())}


def _add_pause_routes(app: FastAPI, engine: AsyncLLM) -> None:
    @app.post("/pause")
    async def pause(raw: Request) -> dict[str, str]:
        mode = raw.query_params.get("mode", "abort")
        await _engine_call(engine.pause_generation(mode))
        return {"status": "paused", "mode": mode}

    @app.post("/resume")
    async def resume() -> dict[str, str]:
        await _engine_call(engine.resume_generation())
        return {"status": "resumed"}

    @app.get("/is_paused")
    async def is_paused() -> dict[str, bool]:
        return {"is_paused": engine.is_paused()}


def _add_rpc_routes(app: FastAPI, engine: AsyncLLM, parse_body: ParseBody) -> None:
    @app.post("/collective_rpc")
    async def collective_rpc(raw: Request) -> dict[str, list[Any]]:
        body = await parse_body(raw, CollectiveRPCRequest)
        results = await _engine_call(engine.collective_rpc(body.method, body.args, body.kwargs))
        return {"results": results}


async def _worker_call(engine: AsyncLLM, method: str, *args: Any) -> Any:
    """The first (today the only) worker's result of a registered worker method."""
    return (await _engine_call(engine.collective_rpc(method, list(args))))[0]


def _add_weight_routes(app: FastAPI, engine: AsyncLLM, parse_body: ParseBody) -> None:
    @app.post("/init_weight_transfer_engine")
    async def init_weight_transfer_engine(raw: Request) -> dict[str, str]:
        body = await parse_body(raw, InitWeightTransferRequest)
        await _worker_call(engine, "init_weight_transfer_engine", body.init_info)
        return {"status": "ok"}

    @app.post("/start_weight_update")
    async def start_weight_update() -> dict[str, str]:
        await _worker_call(engine, "start_weight_update")
        return {"status": "ok"}

    @app.post("/update_weights")
    async def update_weights(raw: Request) -> dict[str, str]:
        body = await parse_body(raw, UpdateWeightsRequest)
        await _worker_call(engine, "update_weights", body.update_info)
        return {"status": "ok"}

    @app.post("/finish_weight_update")
    async def finish_weight_update(raw: Request) -> dict[str, str]:
        body = await parse_body(raw, FinishWeightUpdateRequest)
        version = await _worker_call(engine, "finish_weight_update", body.weight_version)
        return {"weight_version": version}

    @app.post("/update_weight_version")
    async def update_weight_version(raw: Request) -> dict[str, str]:
        body = await parse_body(raw, WeightVersionRequest)
        return {
            "weight_version": await _worker_call(engine, "update_weight_version", body.new_version)
        }

    @app.get("/weight_info")
    async def weight_info() -> dict[str, str]:
        return {"weight_version": await _worker_call(engine, "get_weight_version")}


def _add_sglang_aliases(app: FastAPI, engine: AsyncLLM, parse_body: ParseBody) -> None:
    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(raw: Request) -> dict[str, Any]:
        body = await parse_body(raw, UpdateFromDiskRequest)
        version = await _worker_call(engine, "reload_weights", body.model_path, body.weight_version)
        return {"success": True, "weight_version": version}

    @app.post("/release_memory_occupation")
    async def release_memory_occupation(raw: Request) -> dict[str, Any]:
        body = await parse_body(raw, MemoryOccupationRequest)
        if body.tags is not None and set(body.tags) != {"weights", "kv_cache"}:
            raise APIError(
                400, "tags: only all of them (null, or weights and kv_cache) sleep", param="tags"
            )
        await _engine_call(engine.sleep(1))
        return {"success": True}

    @app.post("/resume_memory_occupation")
    async def resume_memory_occupation(raw: Request) -> dict[str, Any]:
        body = await parse_body(raw, MemoryOccupationRequest)
        await _engine_call(engine.wake_up(body.tags))
        return {"success": True}

    @app.post("/flush_cache")
    async def flush_cache() -> JSONResponse:
        success = await _engine_call(engine.reset_prefix_cache())
        return JSONResponse({"success": success}, status_code=200 if success else 400)

    @app.post("/pause_generation")
    async def pause_generation(raw: Request) -> dict[str, Any]:
        body = await parse_body(raw, PauseGenerationRequest)
        if body.mode not in _SGLANG_PAUSE_MODES:
            raise APIError(
                400, f"mode must be one of {', '.join(_SGLANG_PAUSE_MODES)}", param="mode"
            )
        await _engine_call(engine.pause_generation(_SGLANG_PAUSE_MODES[body.mode]))
        return {"success": True}

    @app.post("/continue_generation")
    async def continue_generation() -> dict[str, Any]:
        await _engine_call(engine.resume_generation())
        return {"success": True}
