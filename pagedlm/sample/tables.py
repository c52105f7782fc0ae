"""Per-row host tables of the sampling state, and the one way host data reaches the device."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def upload(array_np: np.ndarray, device: torch.device) -> torch.Tensor:
    """Host array -> device tensor without a host-device sync. On CUDA the data is first copied
    into a pinned block of torch's caching host allocator, which does not hand that block out
    again until the copy reading it has completed: an in-flight copy never sees its source change
    (the double-buffer rule), and the caller may mutate `array_np` right away."""
    tensor = torch.from_numpy(np.ascontiguousarray(array_np))
    if device.type != "cuda":
        return tensor.to(device, copy=True)
    return tensor.pin_memory().to(device, non_blocking=True)


class MirroredTable:
    """A [num_rows, num_cols] host table with a device mirror; changed rows go down on `sync`."""

    def __init__(self, defaults_np: np.ndarray, num_rows: int, device: torch.device) -> None:
        self.device = device
        self.np = np.tile(defaults_np, (num_rows, 1))  # [num_rows, num_cols]
        self.gpu = upload(self.np, device)  # [num_rows, num_cols]
        self._dirty_rows: set[int] = set()

    def set_row(self, row: int, values: Sequence[float | int]) -> None:
        self.np[row] = values
        self._dirty_rows.add(row)

    def sync(self) -> None:
        """Copy the rows changed since the last sync to the device (stream-ordered, no sync)."""
        if not self._dirty_rows:
            return
        rows_np = np.fromiter(sorted(self._dirty_rows), dtype=np.int64)  # [num_dirty]
        self._dirty_rows.clear()
        self.gpu.index_copy_(0, upload(rows_np, self.device), upload(self.np[rows_np], self.device))


class PaddedRows:
    """Variable-length per-row token-id lists (with optional float values), host only, as a
    [num_rows, width] table. A short row is padded with one of its own ids and value 0, so
    scattering a padded row (set, ban, or add its values) does what scattering the list does."""

    def __init__(self, num_rows: int, with_values: bool) -> None:
        self.ids_np = np.zeros((num_rows, 1), dtype=np.int64)  # [num_rows, width]
        self.values_np = np.zeros((num_rows, 1), dtype=np.float32) if with_values else None
        self.lengths_np = np.zeros(num_rows, dtype=np.int64)  # [num_rows]

    def set_row(self, row: int, ids: Sequence[int], values: Sequence[float] | None = None) -> bool:
        """Store the row's list; returns whether it is non-empty."""
        num_ids = len(ids)
        self._ensure_width(num_ids)
        self.lengths_np[row] = num_ids
        if num_ids == 0:
            return False
        self.ids_np[row] = ids[0]
        self.ids_np[row, :num_ids] = ids
        if self.values_np is not None:
            self.values_np[row] = 0.0
            self.values_np[row, :num_ids] = values
        return True

    def gather(self, rows_np: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The lists of `rows_np` (non-empty), cut to the longest: ids [M, W], values [M, W]."""
        width = int(self.lengths_np[rows_np].max())
        ids_np = self.ids_np[rows_np, :width]
        values_np = None if self.values_np is None else self.values_np[rows_np, :width]
        return ids_np, values_np

    def _ensure_width(self, width: int) -> None:
        extra = width - self.ids_np.shape[1]
        if extra <= 0:
            return
        self.ids_np = np.pad(self.ids_np, ((0, 0), (0, extra)), mode="edge")
        if self.values_np is not None:
            self.values_np = np.pad(self.values_np, ((0, 0), (0, extra)))
