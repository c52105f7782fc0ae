"""Messages between the front end and the engine-core process (msgpack through msgspec).

Front end -> core: AddRequest, AbortRequests, Shutdown.
Core -> front end: Ready once the model is loaded, CoreOutputs after every step (and after aborts
while idle), Dead if the core fails."""
from __future__ import annotations

import msgspec

from pagedlm.core.sched_output import EngineCoreOutput
from pagedlm.sampling_params import SamplingParams
from pagedlm.server.metrics import CoreStats


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


class Ready(msgspec.Struct, tag=True):
    pass


class CoreOutputs(msgspec.Struct, tag=True):
    outputs: list[EngineCoreOutput]
    stats: CoreStats
    # request id -> when the scheduler first scheduled it (time.time()), sent once per request
    first_scheduled: dict[str, float] = {}
    # request id -> why the core refused it at add time (it never ran)
    errors: dict[str, str] = {}


class Dead(msgspec.Struct, tag=True):
    error: str


ToCore = AddRequest | AbortRequests | Shutdown
FromCore = Ready | CoreOutputs | Dead


def encoder() -> msgspec.msgpack.Encoder:
    return msgspec.msgpack.Encoder()


def to_core_decoder() -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(ToCore)


def from_core_decoder() -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(FromCore)
