"""Level-1 sleep's host copy of the weights: one flat page-locked buffer for all of them.

A pinned tensor per weight cost more than the copies: torch's pinned allocator rounds each one up
to a power of two and takes it from the driver one cudaHostAlloc at a time (benchmarks/RESULTS.md,
"Sleep mode", has the figures). Here the buffer is allocated pageable at the
exact size, its pages first touched by torch's threads in parallel, then page-locked in place
(cudaHostRegister, as torch.distributed.checkpoint's staging does), so every weight's copy out
and back is an asynchronous DMA into a view of it and one synchronisation waits for them all.
Where the registration fails the buffer stays pageable: the copies still work, more slowly.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from collections.abc import Sequence

import torch

logger = logging.getLogger("pagedlm")

_ALIGN_BYTES = 256  # every tensor's view starts at a multiple: any dtype, aligned DMA


class HostCopy:
    """The values of device tensors in one host buffer; views() has a view per tensor, of its
    shape and dtype. free() unlocks and drops the buffer (also on garbage collection)."""

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        self._offsets, total = _layout(tensors)
        self._shapes = [(t.shape, t.dtype) for t in tensors]
        self.buffer = torch.empty(total, dtype=torch.uint8)  # [total bytes], pageable so far
        self.buffer.zero_()  # faults the pages in on every intra-op thread, not the driver's one
        devices = {t.device for t in tensors if t.device.type == "cuda"}
        self.locked = bool(devices) and _register(self.buffer)
        for tensor, view in zip(tensors, self.views()):
            view.copy_(tensor, non_blocking=self.locked)
        for device in devices:
            torch.cuda.synchronize(device)

    def views(self) -> list[torch.Tensor]:
        return [
            self.buffer[offset : offset + _num_bytes(shape, dtype)].view(dtype).view(shape)
            for offset, (shape, dtype) in zip(self._offsets, self._shapes)
        ]

    def free(self) -> None:
        """After the copies back have completed (the caller synchronised)."""
        if self.locked:
            _unregister(self.buffer)
            self.locked = False
        self.buffer = torch.empty(0, dtype=torch.uint8)

    def __del__(self) -> None:
        if not sys.is_finalizing():  # at exit the process's memory goes anyway
            self.free()


def _layout(tensors: Sequence[torch.Tensor]) -> tuple[list[int], int]:
    offsets, end = [], 0
    for tensor in tensors:
        start = -(-end // _ALIGN_BYTES) * _ALIGN_BYTES
        offsets.append(start)
        end = start + _num_bytes(tensor.shape, tensor.dtype)
    return offsets, end


def _num_bytes(shape: torch.Size, dtype: torch.dtype) -> int:
    return shape.numel() * dtype.itemsize


def _register(buffer: torch.Tensor) -> bool:
    if buffer.numel() == 0:
        return False
    error = int(torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), buffer.numel(), 0))
    if error != 0:
        _clear_last_cuda_error()
        logger.warning(
            "sleep: cudaHostRegister failed (error %d): the host copy is pageable", error
        )
    return error == 0


def _clear_last_cuda_error() -> None:
    """A failed runtime call stays the runtime's last error, which torch's next kernel-launch
    check would raise as its own: read it once (cudaGetLastError resets it), through the
    libcudart torch loaded (torch binds no cudaGetLastError)."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libcudart.so" in line}
    for path in paths:
        ctypes.CDLL(path).cudaGetLastError()


def _unregister(buffer: torch.Tensor) -> None:
    error = int(torch.cuda.cudart().cudaHostUnregister(buffer.data_ptr()))
    if error != 0:
        logger.warning("sleep: cudaHostUnregister failed (error %d)", error)
