"""Messages between the front end and the engine-core process (msgpack through msgspec).

Front end -> core: AddRequest, AbortRequests, UtilityCall, Shutdown.
Core -> front end: Ready once the model is loaded, CoreOutputs after every step (and after aborts
while idle), UtilityResult for each UtilityCall (after the outputs the call produced), Dead if the
core fails."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from pagedlm.core.sched_output import EngineCoreOutput
from pagedlm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from pagedlm.config import EngineConfig


@dataclass(slots=True)
class CoreStats:
    """The scheduler's state after a step; the prefix-cache and preemption counts are cumulative."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0  # in [0, 1]
    prefix_cache_queries: int = 0  # tokens looked up
    prefix_cache_hits: int = 0  # tokens found
    num_preemptions: int = 0
    num_kernel_compiles: int = 0  # Triton compiles a step waited for (pagedlm.ops.jit_watch)
    # structured outputs (pagedlm/structured_outputs/manager.py), cumulative
    num_grammar_compiles: int = 0
    grammar_compile_seconds: float = 0.0
    num_grammar_compile_waits: int = 0  # the step loop blocked on a compile (nothing else ran)
    # speculative decoding (spec_decode/metrics.py), cumulative
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: tuple[int, ...] = ()


class AddRequest(msgspec.Struct, tag=True):
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    max_tokens: int  # resolved: never more than max_model_len - len(prompt_token_ids)
    arrival_time: float
    priority: int = 0
    cache_salt: str | None = None


class AbortRequests(msgspec.Struct, tag=True):
    request_ids: list[str]
    stopped: bool = False  # finished by a stop string in the front end, not aborted


class Shutdown(msgspec.Struct, tag=True):
    pass


class UtilityCall(msgspec.Struct, tag=True):
    """An engine utility between steps (engine/lifecycle.py UTILITY_METHODS: collective_rpc,
    sleep, pause, ...); arguments and result as msgpack carries them."""

    call_id: int
    method: str
    args: list[Any] = []
    kwargs: dict[str, Any] = {}


class UtilityResult(msgspec.Struct, tag=True):
    call_id: int
    result: Any = None
    error: str | None = None  # the call failed: why
    invalid: bool = False  # ... from the caller's arguments (InvalidRequest: param and code)
    param: str | None = None
    code: str | None = None


class Ready(msgspec.Struct, tag=True):
    """The core's engine config as the front end's requests depend on it: the front end, which built
    its own from the same arguments, checks that the two agree."""

    max_model_len: int
    vocab_size: int
    eos_token_ids: list[int]

    @classmethod
    def of(cls, config: EngineConfig) -> Ready:
        model = config.model
        return cls(
            max_model_len=model.max_model_len,
            vocab_size=model.vocab_size,
            eos_token_ids=sorted(model.eos_token_ids),
        )


class CoreOutputs(msgspec.Struct, tag=True):
    outputs: list[EngineCoreOutput]
    stats: CoreStats
    # request id -> when the scheduler first scheduled it (time.time()), sent once per request
    first_scheduled: dict[str, float] = {}
    # request id -> why the core refused it at add time (it never ran)
    errors: dict[str, str] = {}


def join_outputs(messages: list[CoreOutputs]) -> CoreOutputs:
    """Several steps' messages as one: their outputs in step order, the last stats."""
    if len(messages) == 1:
        return messages[0]
    return CoreOutputs(
        outputs=[out for msg in messages for out in msg.outputs],
        stats=messages[-1].stats,
        first_scheduled={k: v for msg in messages for k, v in msg.first_scheduled.items()},
        errors={k: v for msg in messages for k, v in msg.errors.items()},
    )


class Dead(msgspec.Struct, tag=True):
    error: str


ToCore = AddRequest | AbortRequests | UtilityCall | Shutdown
FromCore = Ready | CoreOutputs | UtilityResult | Dead


def encoder() -> msgspec.msgpack.Encoder:
    return msgspec.msgpack.Encoder()


def to_core_decoder() -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(ToCore)


def from_core_decoder() -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(FromCore)
