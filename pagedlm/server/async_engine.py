"""AsyncLLM: the server's front end to the engine cores, each running in its own process (one at
data_parallel_size 1; else one per dp rank, requests balanced over them by remote_core.py).

Here: tokenisation and validation (LLMEngine.process_request), detokenisation, stop strings and
the gathering of parallel samples (the engine's OutputProcessor), admission control, and one
asyncio queue per request that a background task fills from the core's output socket.
There: the EngineCore step loop (core_process.py). Messages go over ZeroMQ (ipc sockets).

Each core is watched: a process that exits, or that sends no heartbeat for
HeartbeatTimeouts.dead_s, is declared dead and every core is killed (a lost dp rank ends the server
as a lost single core does): requests in flight get an error, the cores' gauges go to 0, and
wait_until_dead() returns (the server then exits non-zero for its supervisor to restart it).
Silent for HeartbeatTimeouts.unhealthy_s, a core is stalled: /health and new requests get 503
while those in flight wait for it. Metrics are summed over the cores (kv_cache_usage_perc: their
mean), but for engine_requests_routed_total, labelled per core (`engine`, as vLLM's label)."""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
import traceback
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial

import zmq
import zmq.asyncio

from pagedlm.config import EngineArgs, EngineConfig
from pagedlm.engine import wire
from pagedlm.engine.data_parallel import sum_stats
from pagedlm.engine.heartbeat import HeartbeatTimeouts
from pagedlm.engine.llm_engine import LLMEngine, ProcessedRequest
from pagedlm.engine.output_processor import core_request_ids
from pagedlm.errors import InvalidRequest
from pagedlm.outputs import RequestOutput
from pagedlm.server.core_client import CoreClient, CoreGone
from pagedlm.server.engine_control import EngineControl
from pagedlm.server.metrics import ServerMetrics
from pagedlm.server.remote_core import RemoteCore

logger = logging.getLogger("pagedlm.server")

_CORE_EXIT_TIMEOUT_S = 10.0
_WATCH_INTERVAL_S = 0.5  # how often the core's process and heartbeat are checked
_DRAIN_POLL_S = 0.1
# Messages taken in one batch at most: a batch's work holds the event loop (/health, new
# requests), and a core ahead by many steps is caught up in several batches.
_MAX_MESSAGES_PER_BATCH = 32


class EngineDeadError(RuntimeError):
    """The engine-core process died; no request can be served."""


class RequestAborted(RuntimeError):
    """The server aborted the request (it is shutting down)."""


class Overloaded(RuntimeError):
    """The server takes no new request now; retry later. `code` says why (the 503's code)."""

    def __init__(self, message: str, code: str = "server_overloaded") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class AdmissionLimits:
    max_num_queued_reqs: int | None = None  # core requests in flight (a request with n counts n)
    max_num_queued_tokens: int | None = None  # prompt tokens of core requests still in prefill


class AsyncLLM(EngineControl):
    """collective_rpc, sleep / wake_up, pause / resume, reset_prefix_cache: engine_control.py."""

    def __init__(
        self,
        config: EngineConfig | EngineArgs | None,
        model_name: str,
        limits: AdmissionLimits,
        log_stats_interval_s: float = 5.0,
        heartbeat: HeartbeatTimeouts = HeartbeatTimeouts(),  # noqa: B008 - frozen
    ) -> None:
        """config: an EngineConfig, or the EngineArgs to build it from; then the core process builds
        its own while start() builds this one (a GGUF file's parse takes seconds, so side by side
        rather than one after the other), and self.config is None until start(). None: an engine
        that is never started (tests of the request bookkeeping)."""
        self._config_source = config  # what the core process is started with
        self.config = config if isinstance(config, EngineConfig) else None
        self.limits = limits
        self.heartbeat_timeouts = heartbeat
        self.metrics = ServerMetrics(model_name, _data_parallel_size(config))
        self._log_stats_interval_s = log_stats_interval_s
        self._queues: dict[str, asyncio.Queue] = {}
        self._num_samples: dict[str, int] = {}  # request id -> n
        self._core_to_request: dict[str, str] = {}
        self._tasks: list[asyncio.Task] = []
        self.dead_error: str | None = None
        self._died = asyncio.Event()
        self.stalled: str | None = None  # why the core counts as stalled, while it does
        self.shutting_down = False  # no new requests
        self._ready = False  # the core said Ready: from then on it beats
        self._stopping = False  # shutdown() began: the cores' exits are expected
        self._started = False  # start() began: the core processes exist
        self._init_sockets(self.metrics.num_engines)
        self._core_stats = [wire.CoreStats() for _ in self._cores]  # the latest, per dp rank
        self._init_control()
        self.core = RemoteCore(
            [partial(self._send, client) for client in self._cores], self.metrics
        )
        self.llm_engine: LLMEngine | None = None  # set by start(); its core is self.core

    def _init_sockets(self, num_cores: int) -> None:
        self._ipc_dir = tempfile.mkdtemp(prefix="pagedlm-")
        self._ctx = zmq.Context()
        self._actx = zmq.asyncio.Context()
        self._cores = [
            CoreClient(rank, self._ipc_dir, self._ctx, self._actx) for rank in range(num_cores)
        ]

    def _send(self, client: CoreClient, data: bytes) -> None:
        """Never blocks (no send limit); a core that is gone marks the engine dead instead."""
        if self.dead_error is not None:
            return
        try:
            client.send(data)
        except CoreGone as exc:
            self._on_core_dead(str(exc), client.rank)

    # ---- life cycle ----

    async def start(self) -> None:
        """Starts the core processes, builds the LLMEngine meanwhile (the tokenizer, and the config
        from EngineArgs), waits until every core is ready. A bad engine argument raises ValueError
        here; shutdown() then stops the cores."""
        self._started = True
        for client in self._cores:  # they load side by side
            client.start(self._config_source, len(self._cores))
        # Not in a thread: a signal during start-up (SystemExit) then stops the build at once.
        self.llm_engine = self._build_llm_engine()
        self.config = self.llm_engine.config
        for client in self._cores:
            await self._wait_until_ready(client)
        for client in self._cores:
            client.heartbeat.restart()
        self._ready = True
        self._tasks = [
            *(
                asyncio.create_task(
                    self._output_loop(client), name=f"pagedlm-outputs-{client.rank}"
                )
                for client in self._cores
            ),
            asyncio.create_task(self._watch_core(), name="pagedlm-core-watch"),
            asyncio.create_task(self._log_loop(), name="pagedlm-log-stats"),
        ]

    async def _wait_until_ready(self, client: CoreClient) -> None:
        name = self._core_name(client.rank)
        msg = await client.first_message()
        if msg is None:
            raise RuntimeError(
                f"the {name} process exited with code {client.proc.exitcode} "
                "while starting (see its log above)"
            )
        if not isinstance(msg, wire.Ready):
            raise RuntimeError(f"the {name} failed to start:\n{msg.error}")
        check_same_config(msg, self.config)

    def _core_name(self, rank: int) -> str:
        return (
            "engine core" if len(self._cores) == 1 else f"engine core {rank} of {len(self._cores)}"
        )

    def _build_llm_engine(self) -> LLMEngine:
        source = self._config_source
        if isinstance(source, EngineConfig):
            return LLMEngine(source, self.core)
        return LLMEngine.from_engine_args(source, self.core)

    def stop_accepting(self) -> None:
        """New requests get 503 (and /health); those in flight go on."""
        self.shutting_down = True

    @property
    def num_requests_in_flight(self) -> int:
        return len(self._queues)

    async def drain(self, timeout_s: float) -> bool:
        """Waits until no request is in flight (True), the core dies, or `timeout_s` passes."""
        deadline = time.monotonic() + timeout_s
        while self._queues and self.dead_error is None and time.monotonic() < deadline:
            await asyncio.sleep(_DRAIN_POLL_S)
        return not self._queues

    async def wait_until_dead(self) -> str:
        """Returns (why) once the core has been declared dead."""
        await self._died.wait()
        return self.dead_error

    async def shutdown(self) -> None:
        """Aborts what is in flight, stops the core processes, releases sockets."""
        self.stop_accepting()
        self.abort_all()
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        if self._started:
            await self._stop_cores()
        for client in self._cores:
            client.close()
        self._ctx.term()
        self._actx.term()
        shutil.rmtree(self._ipc_dir, ignore_errors=True)

    def kill_core(self) -> None:
        """Ends every core process at once (a signal while the server stops)."""
        for client in self._cores:
            client.kill()

    async def _stop_cores(self) -> None:
        """Ready, live cores are asked to stop; one still loading, or dead, is killed (it ignores
        SIGTERM)."""
        if self._ready and self.dead_error is None:
            self.core.send_to_all(wire.Shutdown())
            await asyncio.gather(
                *(asyncio.to_thread(c.join, _CORE_EXIT_TIMEOUT_S) for c in self._cores)
            )
            for client in self._cores:
                if client.is_alive():
                    logger.warning(
                        "%s did not stop in %.0f s; killing it",
                        self._core_name(client.rank),
                        _CORE_EXIT_TIMEOUT_S,
                    )
        self.kill_core()
        await asyncio.gather(*(asyncio.to_thread(c.join) for c in self._cores))

    @property
    def health_problem(self) -> str | None:
        """Why /health should answer 503, or None."""
        self._check_core()
        if self.dead_error is not None:
            return f"the engine core died: {self.dead_error}"
        if self.stalled is not None:
            return self.stalled
        if self.shutting_down:
            return "the server is shutting down"
        return None

    # ---- requests ----

    def admit(self, num_requests: int, num_prompt_tokens: int) -> None:
        """Raises Overloaded when adding `num_requests` core requests holding `num_prompt_tokens`
        prompt tokens would pass a cap, ValueError when the request alone is over a cap."""
        self.check_alive()
        if self.shutting_down:
            raise Overloaded("the server is shutting down", code="shutting_down")
        if self.stalled is not None:
            raise Overloaded(f"{self.stalled}; retry later", code="engine_stalled")
        if self.admission_problem is not None:
            raise Overloaded(*self.admission_problem)
        for cap, name, current, new in (
            (
                self.limits.max_num_queued_reqs,
                "max_num_queued_reqs",
                self.core.num_in_flight,
                num_requests,
            ),
            (
                self.limits.max_num_queued_tokens,
                "max_num_queued_tokens",
                self.core.num_prefill_tokens,
                num_prompt_tokens,
            ),
        ):
            if cap is None:
                continue
            if new > cap:
                raise ValueError(f"the request needs {new} of {name}={cap} on its own")
            if current + new > cap:
                self.metrics.observe_rejected(name)
                raise Overloaded(
                    f"server overloaded: {current} in use + {new} requested > "
                    f"{name}={cap}; retry later"
                )

    def check_alive(self) -> None:
        self._check_core()
        if self.dead_error is not None:
            raise EngineDeadError(f"the engine core died: {self.dead_error}")

    def _check_core(self) -> None:
        """Declares the cores dead when a process has exited or has been silent too long;
        stalled while one has been silent a while."""
        if not self._started or self.dead_error is not None or self._stopping:
            return  # not started, already dead, or their exits are expected
        for client in self._cores:
            if not client.is_alive():
                self._on_core_dead(
                    f"the process exited with code {client.proc.exitcode}", client.rank
                )
                return
        if self._ready:
            self._check_heartbeat(max(client.heartbeat.silent_s() for client in self._cores))

    def _check_heartbeat(self, silent_s: float) -> None:
        timeouts = self.heartbeat_timeouts
        if silent_s >= timeouts.dead_s:
            self._on_core_dead(
                f"no heartbeat for {silent_s:.1f} s (--stall-timeout "
                f"{timeouts.dead_s:g}): the process is stopped or hung; killed"
            )
        elif silent_s >= timeouts.unhealthy_s:
            if self.stalled is None:
                logger.warning(
                    "engine core: no heartbeat for %.1f s (--heartbeat-timeout %g): "
                    "/health and new requests get 503 until it beats again; declared "
                    "dead after %g s",
                    silent_s,
                    timeouts.unhealthy_s,
                    timeouts.dead_s,
                )
            self.stalled = f"the engine core has sent no heartbeat for {silent_s:.1f} s"
        elif self.stalled is not None:
            logger.info("engine core: beating again; healthy")
            self.stalled = None

    def add_request(
        self,
        request_id: str,
        processed: ProcessedRequest,
        priority: int = 0,
        final_only: bool = False,
    ) -> None:
        """Adds the request at once (call admit() first); read it with outputs(request_id).
        final_only: no output until it finishes (a client that does not stream)."""
        self.check_alive()
        if request_id in self._queues:
            raise InvalidRequest(f"request_id {request_id!r} is already in use", param="request_id")
        self._queues[request_id] = asyncio.Queue()  # first: a death while adding reaches it
        self._num_samples[request_id] = processed.params.n
        for core_id in core_request_ids(request_id, processed.params.n):
            self._core_to_request[core_id] = request_id
        try:
            with self.core.one_rank():  # its samples share the prompt's blocks
                self.llm_engine.add_processed_request(
                    request_id, processed, priority, final_only=final_only
                )
        except ValueError:
            self.release(request_id)
            raise

    async def outputs(self, request_id: str) -> AsyncIterator[RequestOutput]:
        """The request's cumulative outputs up to the last one; then (or when the iterator is
        closed early) the request is released."""
        queue = self._queues[request_id]
        try:
            while True:
                output = _latest(await queue.get(), queue)
                yield output
                if output.finished:
                    return
        finally:
            self.release(request_id)

    def release(self, request_id: str) -> None:
        """Forgets the request and aborts it in the engine if unfinished; idempotent."""
        if self._queues.pop(request_id, None) is None:
            return
        for core_id in core_request_ids(request_id, self._num_samples.pop(request_id)):
            self._core_to_request.pop(core_id, None)
        if self.dead_error is None:
            self.llm_engine.abort_request(request_id)  # a no-op when it has finished

    def abort_all(self) -> None:
        for request_id, queue in list(self._queues.items()):
            if self.dead_error is None:
                self.llm_engine.abort_request(request_id)
            queue.put_nowait(RequestAborted("the server is shutting down"))

    # ---- background tasks ----

    async def _output_loop(self, client: CoreClient) -> None:
        """Takes every message already there at once: when the front end fell behind, several
        steps' outputs become one output per request, and one event per stream. Then the
        streams write before the next batch: a ready socket's recv() completes without yielding
        to the event loop, so without the sleep a core that keeps up holds every stream back."""
        decoder = wire.from_core_decoder()
        while self.dead_error is None:
            frames = [await client.output.recv()]
            while len(frames) < _MAX_MESSAGES_PER_BATCH:
                try:
                    frames.append(await client.output.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
            self._on_messages([decoder.decode(frame) for frame in frames], client.rank)
            await asyncio.sleep(0)

    def _on_messages(self, messages: list[wire.FromCore], rank: int) -> None:
        """In order; each run of CoreOutputs as one (wire.join_outputs)."""
        run: list[wire.CoreOutputs] = []
        for msg in messages:
            if isinstance(msg, wire.CoreOutputs):
                run.append(msg)
                continue
            if run:
                self._on_message(wire.join_outputs(run), rank)
                run = []
            self._on_message(msg, rank)
        if run:
            self._on_message(wire.join_outputs(run), rank)

    def _on_message(self, msg: wire.FromCore, rank: int = 0) -> None:
        """`rank`: the dp rank of the core that sent it."""
        if self.dead_error is not None:  # sent before it was declared dead: news no longer
            return
        if isinstance(msg, wire.Dead):
            self._on_core_dead(msg.error, rank)
            return
        if isinstance(msg, wire.UtilityResult):
            self._on_utility_result(msg, rank)
            return
        try:
            self._on_outputs(msg, rank)
        except Exception:  # else every request would hang while /health still said 200
            self._on_core_dead(
                f"the server failed on the core's outputs:\n{traceback.format_exc()}", rank
            )

    def _on_outputs(self, msg: wire.CoreOutputs, rank: int = 0) -> None:
        self._on_stats(msg.stats, rank)
        self.core.on_outputs(msg)
        for core_id, error in msg.errors.items():
            request_id = self._core_to_request.get(core_id)
            if request_id is not None:
                self.llm_engine.abort_request(request_id)
                self._queues[request_id].put_nowait(ValueError(error))
        processed = self.llm_engine.output_processor.process_outputs(msg.outputs)
        if processed.reqs_to_finish:
            self.core.finish_requests(processed.reqs_to_finish)
        for output in processed.request_outputs:
            queue = self._queues.get(output.request_id)
            if queue is not None:
                queue.put_nowait(output)

    def _on_stats(self, stats: wire.CoreStats, rank: int) -> None:
        """The metrics show the sum over the cores."""
        self._core_stats[rank] = stats
        self.metrics.update_core_stats(
            stats if len(self._core_stats) == 1 else sum_stats(self._core_stats)
        )

    async def _watch_core(self) -> None:
        while self.dead_error is None:
            await asyncio.sleep(_WATCH_INTERVAL_S)
            self._check_core()

    def _on_core_dead(self, error: str, rank: int = 0) -> None:
        """Logs the whole story; clients get its last line. Every process still there (stalled,
        or a live dp rank) is killed: nothing it would send is wanted, and it holds the
        accelerator."""
        if self.dead_error is not None:
            return
        name = self._core_name(rank)
        logger.error("%s died: %s", name, error)
        self.dead_error = error.strip().splitlines()[-1]
        if len(self._cores) > 1:
            self.dead_error += f" (dp rank {rank})"
        self.stalled = None
        self.metrics.clear_core_state()
        self.kill_core()
        for queue in self._queues.values():
            queue.put_nowait(EngineDeadError(f"the engine core died: {self.dead_error}"))
        self._fail_calls(EngineDeadError(f"the engine core died: {self.dead_error}"))
        self._died.set()

    async def _log_loop(self) -> None:
        while True:
            await asyncio.sleep(self._log_stats_interval_s)
            self.metrics.log_line()


def _latest(item: RequestOutput | Exception, queue: asyncio.Queue) -> RequestOutput:
    """Outputs are cumulative: of several queued ones only the newest matters."""
    while True:
        if isinstance(item, Exception):
            raise item
        if item.finished or queue.empty():
            return item
        item = queue.get_nowait()


def check_same_config(ready: wire.Ready, config: EngineConfig) -> None:
    """The core process and this one built their configs from the same arguments; what requests
    are checked against here must be what the core runs."""
    mine = wire.Ready.of(config)
    if ready != mine:
        raise RuntimeError(
            f"the engine core's config differs from the server's: {ready} against {mine}"
        )


def _data_parallel_size(config: EngineConfig | EngineArgs | None) -> int:
    if isinstance(config, EngineConfig):
        return config.parallel.data_parallel_size
    return 1 if config is None else config.data_parallel_size
