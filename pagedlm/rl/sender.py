"""The trainer's side of a weight transfer: WeightSender drives vLLM's four phases with an engine
(init_weight_transfer_engine → start_weight_update → update_weights per chunk →
finish_weight_update) and broadcasts the tensors to its workers (pagedlm.rl.transport); to an
engine at tensor_parallel_size > 1 it sends each worker its own slice of every tensor
(distributed/weight_shards.py: the engine tells the slices), never the full tensor.

    from pagedlm import LLM
    from pagedlm.rl import WeightSender, llm_rpc   # or http_rpc("http://host:8000")

    llm = LLM("my-model")
    sender = WeightSender(llm_rpc(llm))            # the trainer is rank 0, the engine's 1..tp
    for step in range(num_steps):
        outputs = llm.generate(prompts, params)
        train(model, outputs)
        sender.send_weights(model.named_parameters(), weight_version=f"step-{step}")
    sender.close()

Two transports. "distributed" (the default): a torch.distributed group, NCCL on CUDA and gloo on
the CPU, for a trainer on other GPUs or hosts. An engine method that joins or receives a
collective blocks until this side takes part, so such a call and this side's part run at once,
each on a thread; if the engine's fails first (a refused update), its error is raised here at once
rather than after the group's timeout. "ipc": a trainer in another process on the engine's own GPU
(NCCL refuses two ranks on one GPU), or on the same host's CPU: each chunk is packed into a bucket
buffer the engine maps once (pagedlm.rl.ipc), one engine call per chunk, nothing broadcast. A
trainer in the engine's own process needs neither: LLM.update_weights_from_tensor.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from pagedlm.distributed.sharding import narrowed_shape
from pagedlm.distributed.weight_shards import RankSlices, layout_slices, split
from pagedlm.rl import ipc
from pagedlm.rl.transport import (
    DEFAULT_TIMEOUT_S,
    ChunkInfo,
    TransferInit,
    broadcast,
    host_store,
    new_group,
    pack,
    pack_into,
)

# (worker method, its kwargs) -> what collective_rpc returns: one result per engine worker
EngineRPC = Callable[[str, dict[str, Any]], list[Any]]

DEFAULT_CHUNK_BYTES = 256 << 20
_SETTLE_S = 1.0  # how long a refusal waits for the other side to finish
_POLL_S = 0.005


TRANSPORTS = ("distributed", ipc.TRANSPORT)


class WeightSender:
    """The trainer's side of transfers to one engine. transport "distributed": rank 0 of a
    transfer group with the engine's workers (ranks 1..world_size - 1; world_size None: 1 + the
    engine's tensor_parallel_size, which the engine tells); master_port 0: a free port, chosen
    here and told to the engine. transport "ipc" (tp = 1 engines): the master_* and world_size
    arguments are not used."""

    def __init__(
        self,
        engine: EngineRPC,
        master_address: str = "127.0.0.1",
        master_port: int = 0,
        world_size: int | None = None,
        device: torch.device | str = "cpu",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: str = "distributed",
    ) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}; got {transport!r}")
        self._engine = engine
        self.device = torch.device(device)
        self._link: _GroupLink | _IpcLink | None
        if transport == ipc.TRANSPORT:
            self._link = _IpcLink(engine, self.device)
        else:
            tp, slices = layout_slices(engine("get_weight_shard_layout", {})[0])
            if world_size not in (None, 1 + tp):
                raise ValueError(
                    f"world_size {world_size}: the engine has {tp} worker(s); the group is the "
                    f"trainer and them ({1 + tp})"
                )
            init = TransferInit(master_address, master_port, 1 + tp, timeout_s=timeout_s)
            self._link = _GroupLink(engine, init, self.device, tp, slices)

    def send_weights(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        weight_version: str | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> str:
        """Sends (Hugging Face name, tensor) pairs, any subset of the weights, in chunks of about
        chunk_bytes (one broadcast or engine call each; at tp > 1 counted over every worker's
        slices, which is what the chunk's buffers hold at once); returns the engine's new weight
        version. A chunk the engine refuses raises here; the chunks before it stay applied."""
        if self._link is None or self._link.broken:
            raise RuntimeError(
                "WeightSender: the transfer group is closed, or broken by an earlier failure "
                "(close() it and make a new WeightSender)"
            )
        self._engine("start_weight_update", {})
        try:
            for chunk in _chunks(named_tensors, chunk_bytes, self._link.sent_bytes):
                self._link.send_chunk(chunk, chunk_bytes)
        except BaseException:
            with contextlib.suppress(Exception):  # end the engine's session; the error matters
                self._engine("finish_weight_update", {})
            raise
        return self._engine("finish_weight_update", {"weight_version": weight_version})[0]

    @property
    def bytes_sent(self) -> list[int]:
        """The tensor bytes sent so far, per engine worker (one entry: all of them alike)."""
        return [] if self._link is None else list(self._link.bytes_sent)

    def close(self) -> None:
        """Ends the engine's side of the transfer, then this one (also after a failure)."""
        if self._link is not None:
            try:
                self._engine("shutdown_weight_transfer_engine", {})
            finally:
                self._link.close()
        self._link = None


class _GroupLink:
    """A torch.distributed group with the engine's workers; a chunk is one broadcast (tp = 1) or
    one send of its slices to each worker (tp > 1)."""

    def __init__(
        self,
        engine: EngineRPC,
        init: TransferInit,
        device: torch.device,
        tp: int,
        slices: RankSlices,
    ) -> None:
        self._engine = engine
        self._device = device
        self._tp, self._slices = tp, slices
        self.bytes_sent = [0] * tp
        self._store = host_store(
            init.master_address, init.master_port, init.world_size, init.timeout_s
        )
        self.init_info = TransferInit(
            init.master_address, self._store.port, init.world_size, 1, init.timeout_s
        )
        self.broken = False  # a collective was left half done: this group cannot go on
        init = self.init_info
        self._group = self._together(
            "init_weight_transfer_engine",
            {"init_info": vars(init).copy()},
            lambda: new_group(init, 0, device, store=self._store),
        )

    def send_chunk(self, chunk: list[tuple[str, torch.Tensor]], chunk_bytes: int) -> None:
        """One broadcast of a buffer of the chunk's own size (chunk_bytes is the IPC bucket's);
        at tp > 1 a buffer of each worker's slices, sent to it alone."""
        if self._tp == 1:
            buffers = [pack(chunk, self._device)]  # [chunk bytes] uint8
            local = functools.partial(_broadcast_and_wait, self._group, buffers[0])
        else:
            # views: pack copies each slice into the rank's buffer (no second copy of the chunk)
            per_rank = split(chunk, self._slices, self._tp, "send_weights", compact=False)
            buffers = [pack(pairs, self._device) for pairs in per_rank]  # [rank's bytes] uint8
            local = functools.partial(_send_each, self._group, buffers)
        update_info = {"update_info": ChunkInfo.of(chunk).to_dict()}  # the full shapes
        self._together("update_weights", update_info, local)
        for rank, buffer in enumerate(buffers):
            self.bytes_sent[rank] += buffer.numel()

    def sent_bytes(self, name: str, tensor: torch.Tensor) -> int:
        return tensor.nbytes if self._tp == 1 else slices_bytes(self._slices, name, tensor)

    def close(self) -> None:
        self._group = None

    def _together(self, method: str, kwargs: dict[str, Any], local: Callable[[], Any]) -> Any:
        """Runs the engine method and `local` (this side's part of the same collective) at once;
        returns local's result. If either fails, raises that error at once: the other side may
        then never complete, so the group is given up (its thread blocks until the timeout)."""
        calls = (_Call(lambda: self._engine(method, kwargs)), _Call(local))
        while True:
            failed = next((call for call in calls if call.error is not None), None)
            finished = all(call.done.is_set() for call in calls)
            if failed is not None:
                # The engine checks a chunk only once it has received all of it, so after its
                # refusal this side's broadcast completes within moments: wait for it briefly
                # before giving the group up.
                finished = all(call.done.wait(_SETTLE_S) for call in calls)
                self.broken = self.broken or not finished
                raise failed.error
            if finished:
                return calls[1].result
            time.sleep(_POLL_S)


class _IpcLink:
    """A bucket the engine maps (pagedlm.rl.ipc); a chunk is packed into it, then one engine call
    copies it out. The bucket holds chunk_bytes, or the largest tensor met if larger (a new
    bucket, shared anew)."""

    broken = False  # each chunk is one engine call: nothing is ever left half done

    def __init__(self, engine: EngineRPC, device: torch.device) -> None:
        self.bytes_sent = [0]
        self._engine = engine
        self._device = device
        self._bucket: ipc.SharedBucket | None = None
        engine("init_weight_transfer_engine", {"init_info": {"transport": ipc.TRANSPORT}})

    def send_chunk(self, chunk: list[tuple[str, torch.Tensor]], chunk_bytes: int) -> None:
        info = ChunkInfo.of(chunk)
        _, num_bytes = info.offsets()
        if self._bucket is None or self._bucket.num_bytes < num_bytes:
            if self._bucket is not None:
                self._bucket.close()  # the engine's mapping outlives this (pagedlm.rl.ipc)
            self._bucket = ipc.SharedBucket(max(num_bytes, chunk_bytes), self._device)
        pack_into(chunk, self._bucket.tensor)
        if self._device.type == "cuda":
            torch.cuda.current_stream(self._device).synchronize()  # the engine reads it next
        update_info = {**info.to_dict(), ipc.BUCKET_KEY: self._bucket.handle}
        self._engine("update_weights", {"update_info": update_info})
        self.bytes_sent[0] += num_bytes

    @staticmethod
    def sent_bytes(name: str, tensor: torch.Tensor) -> int:
        return tensor.nbytes

    def close(self) -> None:
        if self._bucket is not None:
            self._bucket.close()
        self._bucket = None


class _Call:
    """A function running on a daemon thread (one stuck in a collective never holds up exit)."""

    def __init__(self, function: Callable[[], Any]) -> None:
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self._function = function
        threading.Thread(target=self._run, name="pagedlm-weight-transfer", daemon=True).start()

    def _run(self) -> None:
        try:
            self.result = self._function()
        except BaseException as exc:  # raised on the sender's thread
            self.error = exc
        finally:
            self.done.set()


def _broadcast_and_wait(group: Any, buffer: torch.Tensor) -> None:
    broadcast(group, buffer).wait()


def _send_each(group: Any, buffers: list[torch.Tensor]) -> None:
    """buffers[r] to the engine's worker r (group rank r + 1), all sends in flight at once."""
    works = [group.send([buffer], rank + 1, 0) for rank, buffer in enumerate(buffers)]
    for work in works:
        work.wait()


def slices_bytes(slices: RankSlices, name: str, tensor: torch.Tensor) -> int:
    """The bytes of tensor's slices over every worker (a replicated tensor: one copy each)."""
    shape = tuple(tensor.shape)
    return tensor.element_size() * sum(
        math.prod(narrowed_shape(shape, part, name, "send_weights")) for part in slices(name)
    )


def _chunks(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    chunk_bytes: int,
    sent_bytes: Callable[[str, torch.Tensor], int],
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive chunks of at most chunk_bytes as sent_bytes counts them; a tensor larger than
    that goes alone."""
    chunk: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        num_bytes = sent_bytes(name, tensor)
        if chunk and size + num_bytes > chunk_bytes:
            yield chunk
            chunk, size = [], 0
        chunk.append((name, tensor))
        size += num_bytes
    if chunk:
        yield chunk
