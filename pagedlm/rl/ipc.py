"""The wire of a colocated weight transfer (transport "ipc"), shared by the trainer
(pagedlm.rl.sender) and the engine's worker (pagedlm.worker.weight_update): the trainer packs each
chunk into a bucket buffer the engine maps once, and the engine copies the chunk out of it.

NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so a trainer sharing the engine's GPU
cannot use the broadcast of pagedlm.rl.transport. Instead the bucket is shared by handle, vLLM's
"ipc" backend and SGLang's update_weights_from_tensor:

- on CUDA, a CUDA IPC handle of the bucket's allocation (torch.multiprocessing's own reduction);
- on the CPU, a file in shared memory (/dev/shm) both processes map.

A bucket's handle is a dict of strings, numbers and booleans only (bytes in base64), so it travels
through any collective_rpc, the server's msgpack wire and JSON included; reading it unpickles
nothing. Like every weight-writing method, it trusts its caller (offline code, or a client of
the server's --enable-dev-endpoints): a CUDA handle names shared memory the engine then maps. Each update_weights carries the handle of the bucket its chunk is in (a chunk larger than
the bucket makes the trainer allocate a larger one); the engine keeps the last bucket it opened
and opens another only when the handle changes. The two sides take turns: the trainer's copy into
the bucket is complete before it calls update_weights, and the engine's copy out of it is complete
before update_weights returns, so the bucket is refilled only once nothing reads it.
"""

from __future__ import annotations

import base64
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

TRANSPORT = "ipc"
BUCKET_KEY = "bucket"  # update_info's key for the handle, beside ChunkInfo's
_FILE_PREFIX = "pagedlm-bucket-"


class SharedBucket:
    """The trainer's bucket: a uint8 buffer [num_bytes] on `device` and the handle the engine maps
    it with. close() releases this side's part (the engine's mapping stays valid until it drops
    it: CUDA keeps an allocation another process has open, a mapped file outlives its name)."""

    def __init__(self, num_bytes: int, device: torch.device) -> None:
        self.num_bytes = num_bytes
        self._path: Path | None = None
        if device.type == "cuda":
            self.tensor = torch.empty(num_bytes, dtype=torch.uint8, device=device)
            self.handle = _cuda_handle(self.tensor)
        elif device.type == "cpu":
            self._path = _new_shared_file(num_bytes)
            self.tensor = torch.from_file(
                str(self._path), shared=True, size=num_bytes, dtype=torch.uint8
            )
            self.handle = {"kind": "file", "path": str(self._path), "num_bytes": num_bytes}
        else:
            raise ValueError(f"transport 'ipc': no shared buffers on a {device.type} device")

    def close(self) -> None:
        if self._path is not None:
            self._path.unlink(missing_ok=True)
            self._path = None
        on_cuda = self.tensor.device.type == "cuda"
        self.tensor = torch.empty(0, dtype=torch.uint8)
        if on_cuda:
            # torch keeps a shared block until every process that opened it has let go; this
            # frees it now if the engine has (WeightSender closes the engine's side first)
            torch.cuda.ipc_collect()


def open_bucket(handle: Any, device: torch.device) -> torch.Tensor:
    """The engine's view [num_bytes] uint8 of the trainer's bucket; ValueError naming what is
    wrong with a handle (not a bucket, another GPU than the engine's, a CUDA bucket for a CPU
    engine). A file bucket may feed a CUDA engine (the copy then goes through the host)."""
    if not isinstance(handle, dict) or handle.get("kind") not in ("cuda", "file"):
        raise ValueError(f"update_info: {BUCKET_KEY!r} must be a bucket handle (SharedBucket)")
    if handle["kind"] == "file":
        return _open_file(handle)
    if device.type != "cuda":
        raise ValueError(
            f"transport 'ipc': the trainer's bucket is CUDA memory, this engine runs on {device}; "
            "a CPU trainer shares a file bucket (WeightSender(device='cpu'))"
        )
    return _open_cuda(handle, device)


def _cuda_handle(tensor: torch.Tensor) -> dict[str, Any]:
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(tensor)
    (_, _, _, tensor_offset, _, _, device, handle, storage_bytes, storage_offset) = args[:10]
    ref_counter, ref_counter_offset, event, event_sync_required = args[11:15]
    return {
        "kind": "cuda",
        "device_uuid": str(torch.cuda.get_device_properties(device).uuid),
        "num_bytes": tensor.numel(),
        "tensor_offset": tensor_offset,
        "handle": _b64(handle),
        "storage_bytes": storage_bytes,
        "storage_offset": storage_offset,
        "ref_counter": _b64(ref_counter),
        "ref_counter_offset": ref_counter_offset,
        "event": None if event is None else _b64(event),
        "event_sync_required": bool(event_sync_required),
    }


def _open_cuda(handle: dict[str, Any], device: torch.device) -> torch.Tensor:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    engine_uuid = str(torch.cuda.get_device_properties(device).uuid)
    if handle.get("device_uuid") != engine_uuid:
        raise ValueError(
            f"transport 'ipc': the trainer's bucket is on GPU {handle.get('device_uuid')}, the "
            f"engine on {engine_uuid} ({device}): IPC shares one GPU; between two GPUs use the "
            "'distributed' transport (NCCL)"
        )
    try:
        return rebuild_cuda_tensor(
            torch.Tensor,
            torch.Size([handle["num_bytes"]]),
            (1,),
            handle["tensor_offset"],
            torch.UntypedStorage,
            torch.uint8,
            device.index if device.index is not None else torch.cuda.current_device(),
            _unb64(handle["handle"]),
            handle["storage_bytes"],
            handle["storage_offset"],
            False,
            _unb64(handle["ref_counter"]),
            handle["ref_counter_offset"],
            None if handle["event"] is None else _unb64(handle["event"]),
            handle["event_sync_required"],
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"update_info: a malformed CUDA bucket handle ({exc})") from exc
    except RuntimeError as exc:  # CUDA refused the handle: stale (the trainer gone) or forged
        raise ValueError(
            f"transport 'ipc': the trainer's bucket could not be opened ({exc}); is the trainer "
            "alive, and on this GPU?"
        ) from exc


def _open_file(handle: dict[str, Any]) -> torch.Tensor:
    path, num_bytes = Path(str(handle.get("path"))), handle.get("num_bytes")
    if not path.name.startswith(_FILE_PREFIX) or not isinstance(num_bytes, int):
        raise ValueError(f"update_info: {handle!r} is not a file bucket of a SharedBucket")
    if not path.is_file() or path.stat().st_size < num_bytes:
        raise ValueError(f"update_info: the bucket file {path} is gone or shorter than {num_bytes}")
    return torch.from_file(str(path), shared=True, size=num_bytes, dtype=torch.uint8)


def _new_shared_file(num_bytes: int) -> Path:
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    fd, name = tempfile.mkstemp(prefix=_FILE_PREFIX, dir=folder)
    try:
        os.ftruncate(fd, num_bytes)
    finally:
        os.close(fd)
    return Path(name)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)
