"""The engine core in its own process: receive requests and aborts over ZeroMQ, step the
EngineCore while it has work, send each step's outputs and the scheduler's stats back.

The process never waits on the front end while it has work: inputs are drained without
waiting, outputs are queued without limit. Idle, it waits for inputs. Either way it stops when
the front end is gone (its parent changed, or a send could not be delivered for a while). Once
ready it beats (heartbeat.py) until it stops.

It ignores SIGINT and SIGTERM: the front end alone decides when it stops (a Shutdown message, or
SIGKILL). A supervisor that signals the whole process group (systemd's default KillMode, Ctrl-C in
a terminal) must not end the core while the front end drains the requests in flight."""

from __future__ import annotations

import logging
import os
import signal
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
import zmq

from pagedlm.config import EngineArgs, EngineConfig
from pagedlm.core.sched_output import EngineCoreOutput
from pagedlm.engine import wire
from pagedlm.engine.heartbeat import HeartbeatSender
from pagedlm.errors import InvalidRequest
from pagedlm.logger import configure_logging
from pagedlm.ops.jit_watch import num_compiles_while_serving
from pagedlm.request import Request

if TYPE_CHECKING:
    from pagedlm.engine.engine_core import EngineCore

logger = logging.getLogger("pagedlm.engine.core")

IDLE_POLL_MS = 500  # when idle, how often to check that the parent is still alive
SEND_TIMEOUT_MS = 10_000  # a send that cannot be delivered this long: the front end is gone


@dataclass(frozen=True)
class CoreAddresses:
    """The ZeroMQ addresses the front end binds and the core connects to."""

    input: str
    output: str
    heartbeat: str


def run_core(
    source: EngineConfig | EngineArgs, addresses: CoreAddresses, parent_pid: int, dp_rank: int = 0
) -> None:
    """Process entry point; `dp_rank`: which of data_parallel_size cores this one is."""
    configure_logging()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # see the module's docstring
    ctx = zmq.Context()
    inputs, outputs = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    outputs.setsockopt(zmq.SNDHWM, 0)
    outputs.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
    inputs.connect(addresses.input)
    outputs.connect(addresses.output)
    heartbeat = HeartbeatSender(ctx, addresses.heartbeat)
    encoder = wire.encoder()
    try:
        core = build_core(source, dp_rank)
        heartbeat.start()
        outputs.send(encoder.encode(wire.Ready.of(core.config)))
        CoreLoop(core, core.config.model.eos_token_ids, inputs, outputs, parent_pid).run()
    except zmq.Again:
        logger.error("engine core: the front end stopped reading; exiting")
    except (
        InvalidEngineArgs
    ) as exc:  # the front end, building the same config, reports it: no log here
        outputs.send(encoder.encode(wire.Dead(error=f"invalid engine arguments: {exc}")))
    except Exception:  # noqa: BLE001 - the front end must learn why the core died
        logger.exception("engine core failed")
        outputs.send(encoder.encode(wire.Dead(error=traceback.format_exc(limit=8))))
    finally:
        heartbeat.stop()
        outputs.close(linger=1000)
        inputs.close(linger=0)
        ctx.term()


class InvalidEngineArgs(ValueError):
    """The engine arguments the core was started with do not make a config."""


def build_core(source: EngineConfig | EngineArgs, dp_rank: int = 0) -> EngineCore:
    """From EngineArgs the core builds its own config (as the front end does meanwhile, from the
    same arguments); the config and the weights share one parse of a GGUF file."""
    from pagedlm.engine.engine_core import EngineCore
    from pagedlm.engine.tokenizer import load_tokenizer
    from pagedlm.model.gguf_loader import one_parse

    if isinstance(source, EngineConfig):
        config = _place(source, dp_rank)
        return EngineCore(config, load_tokenizer(config.model))
    with one_parse(source.model):
        try:
            config = _place(source.create_engine_config(), dp_rank)
        except ValueError as exc:
            raise InvalidEngineArgs(str(exc)) from exc
        # the tokenizer for structured outputs' grammars, from the parse the config shares
        return EngineCore(config, load_tokenizer(config.model))


def _place(config: EngineConfig, dp_rank: int) -> EngineConfig:
    """dp rank `dp_rank`'s config: on CUDA its own GPU (cuda:dp_rank, also the process's current
    device, for whatever asks torch without naming one); on the CPU its share of the cores (the
    data_parallel_size processes run side by side)."""
    import torch

    from pagedlm.engine.data_parallel import rank_config

    size = config.parallel.data_parallel_size
    if size > 1 and config.device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
    config = rank_config(config, dp_rank)
    if size > 1 and config.device.type == "cuda":
        torch.cuda.set_device(config.device)
    return config


def core_stats(core: Any) -> wire.CoreStats:
    stats = core.get_stats()  # EngineCore's EngineStats
    return wire.CoreStats(
        num_running=stats.num_running,
        num_waiting=stats.num_waiting,
        kv_cache_usage=float(stats.kv_cache_usage),
        prefix_cache_queries=stats.prefix_cache_queries,
        prefix_cache_hits=stats.prefix_cache_hits,
        num_preemptions=stats.num_preemptions,
        num_kernel_compiles=num_compiles_while_serving(),
        num_grammar_compiles=stats.num_grammar_compiles,
        grammar_compile_seconds=stats.grammar_compile_seconds,
        num_grammar_compile_waits=stats.num_grammar_compile_waits,
        spec_num_drafts=stats.spec_num_drafts,
        spec_num_draft_tokens=stats.spec_num_draft_tokens,
        spec_num_accepted_tokens=stats.spec_num_accepted_tokens,
        spec_accepted_per_pos=stats.spec_accepted_per_pos,
    )


class CoreLoop:
    def __init__(
        self,
        core: Any,
        eos_token_ids: tuple[int, ...],
        inputs: zmq.Socket,
        outputs: zmq.Socket,
        parent_pid: int,
    ) -> None:
        self.core = core
        self.eos_token_ids = frozenset(eos_token_ids)
        self.inputs = inputs
        self.outputs = outputs
        self.parent_pid = parent_pid
        self.encoder = wire.encoder()
        self.decoder = wire.to_core_decoder()
        self.live: dict[str, Request] = {}  # requests added and not yet finished
        self.unreported_schedule: set[str] = set()  # live ids whose first schedule is unsent

    def run(self) -> None:
        while os.getppid() == self.parent_pid:  # else orphaned: the front end is gone
            if not self._receive(block=not self.core.has_work()):
                return
            if self.core.has_work():
                self._step()

    def _receive(self, block: bool) -> bool:
        """Handle every pending message; wait for the first one when `block`. False: stop."""
        errors: dict[str, str] = {}
        aborted = False
        timeout = IDLE_POLL_MS if block else 0
        while self.inputs.poll(timeout):
            timeout = 0
            msg = self.decoder.decode(self.inputs.recv())
            if isinstance(msg, wire.Shutdown):
                return False
            if isinstance(msg, wire.AbortRequests):
                self._abort(msg)
                aborted = True
            elif isinstance(msg, wire.UtilityCall):
                self._utility(msg)
            else:
                self._add(msg, errors)
        if errors or (aborted and not self.core.has_unfinished_requests()):
            self._send([], errors)  # idle: the front end still needs the news and fresh stats
        return True

    def _add(self, msg: wire.AddRequest, errors: dict[str, str]) -> None:
        request = Request(
            request_id=msg.request_id,
            prompt_token_ids=msg.prompt_token_ids,
            sampling_params=msg.sampling_params,
            eos_token_ids=self.eos_token_ids,
            max_tokens=msg.max_tokens,
            arrival_time=msg.arrival_time,
            priority=msg.priority,
            cache_salt=msg.cache_salt,
        )
        try:
            self.core.add_request(request)
        except ValueError as exc:
            errors[msg.request_id] = str(exc)
            return
        self.live[msg.request_id] = request
        self.unreported_schedule.add(msg.request_id)

    def _abort(self, msg: wire.AbortRequests) -> None:
        ids = [i for i in msg.request_ids if i in self.live]
        if ids and msg.stopped:
            self.core.finish_requests(ids)
        elif ids:
            self.core.abort_requests(ids)
        for i in ids:
            del self.live[i]
            self.unreported_schedule.discard(i)

    def _utility(self, msg: wire.UtilityCall) -> None:
        """Runs the call (between steps); the outputs it produced (collected steps, aborts) go
        first, then its result. A failure is the caller's to read: the loop goes on."""
        try:
            result = self.core.call_utility(msg.method, msg.args, msg.kwargs)
            reply = wire.UtilityResult(msg.call_id, result=result)
        except InvalidRequest as exc:
            reply = wire.UtilityResult(
                msg.call_id, error=str(exc), invalid=True, param=exc.param, code=exc.code
            )
        except Exception as exc:  # noqa: BLE001 - the caller gets it; the engine keeps running
            logger.exception("engine core: utility %s failed", msg.method)
            reply = wire.UtilityResult(msg.call_id, error=f"{type(exc).__name__}: {exc}")
        if self.core.has_drained_outputs:
            self._step()  # gives exactly those outputs (EngineCore.step)
        try:
            data = self.encoder.encode(reply)
        except (TypeError, msgspec.EncodeError) as exc:
            data = self.encoder.encode(
                wire.UtilityResult(
                    msg.call_id, error=f"{msg.method}: result not serialisable: {exc}"
                )
            )
        self.outputs.send(data)

    def _step(self) -> None:
        outputs = self.core.step()
        first_scheduled = self._newly_scheduled()
        for out in outputs:
            if out.finished:
                self.live.pop(out.req_id, None)
        errors = {out.req_id: out.error for out in outputs if out.error is not None}
        self._send(outputs, errors, first_scheduled)

    def _newly_scheduled(self) -> dict[str, float]:
        found = {}
        for req_id in list(self.unreported_schedule):
            when = self.live[req_id].first_scheduled_time
            if when is not None:
                found[req_id] = when
                self.unreported_schedule.discard(req_id)
        return found

    def _send(
        self,
        outputs: list[EngineCoreOutput],
        errors: dict[str, str],
        first_scheduled: dict[str, float] | None = None,
    ) -> None:
        msg = wire.CoreOutputs(
            outputs=outputs,
            stats=core_stats(self.core),
            first_scheduled=first_scheduled or {},
            errors=errors,
        )
        self.outputs.send(self.encoder.encode(msg))
