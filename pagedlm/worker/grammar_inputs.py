"""A step's structured-outputs bitmask on its way to the device: the engine core fills the step's
pinned staging pair (one per staging set, reused with it two steps later) in place, then one
non-blocking copy each takes it into the device pair the sampler's mask reads."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from pagedlm.core.sched_output import GrammarBitmask

if TYPE_CHECKING:
    from pagedlm.config import EngineConfig

GrammarRows = tuple[torch.Tensor, torch.Tensor]  # logits rows [M] int64, bitmask [M, W] int32
# (the staging pairs: rows [max_rows], bitmask flat [max_rows * ceil(vocab / 32)])


def max_grammar_rows(config: EngineConfig) -> int:
    """The most constrained logits rows a step has: one a request, 1 + k where it speculates."""
    max_num_seqs, spec = config.scheduler.max_num_seqs, config.speculative
    return max_num_seqs if spec is None else spec.max_logits_rows(max_num_seqs)


def new_grammar_rows(config: EngineConfig, num_words: int) -> GrammarBitmask:
    """Plain host rows [max_grammar_rows, num_words] for the engine core to fill (an executor
    whose workers copy them into their own pinned rows)."""
    rows = max_grammar_rows(config)
    return GrammarBitmask(
        np.zeros(rows, dtype=np.int64), np.zeros((rows, num_words), dtype=np.int32)
    )


class GrammarInputs:
    def __init__(self, max_rows: int, vocab_size: int, device: torch.device, num_sets: int) -> None:
        self.max_rows = max_rows
        self.num_words = (vocab_size + 31) // 32
        self.device = device
        self.num_sets = num_sets
        self._host: list[GrammarRows] | None = None  # by staging set; made on first use
        self._device: GrammarRows | None = None

    def host_rows(self, slot: int, num_words: int) -> GrammarBitmask:
        """The staging set's pinned pair as numpy arrays, the bitmask [max_rows, num_words]
        (num_words at most the vocabulary's: the words past it ban their tokens): the engine core
        fills the first M rows, then `stage` sends them."""
        assert num_words <= self.num_words, (num_words, self.num_words)
        if self._host is None:
            self._allocate()
        indices, bitmask = self._host[slot]
        rows = bitmask[: self.max_rows * num_words].view(self.max_rows, num_words)
        return GrammarBitmask(indices.numpy(), rows.numpy())  # sync-ok: host memory

    def stage(self, mask: GrammarBitmask | None, slot: int) -> GrammarRows | None:
        """The step's rows on the device (None without constrained rows); never waits. `mask`:
        `host_rows(slot, W)`'s first M rows, filled."""
        if mask is None:
            return None
        num_rows, num_words = mask.bitmask.shape
        host_indices, host_bitmask = self._rows(self._host[slot], num_rows, num_words)
        assert mask.bitmask.ctypes.data == host_bitmask.data_ptr(), "not this slot's rows"
        if self.device.type == "cpu":  # the host pair is the device pair
            return host_indices, host_bitmask
        indices, bitmask = self._rows(self._device, num_rows, num_words)
        indices.copy_(host_indices, non_blocking=True)
        bitmask.copy_(host_bitmask, non_blocking=True)
        return indices, bitmask

    @staticmethod
    def _rows(pair: GrammarRows, num_rows: int, num_words: int) -> GrammarRows:
        """[M] indices and the flat bitmask's first M * W words as [M, W] (contiguous)."""
        indices, bitmask = pair
        return indices[:num_rows], bitmask[: num_rows * num_words].view(num_rows, num_words)

    def _allocate(self) -> None:
        pin = self.device.type == "cuda"
        rows = self.max_rows

        def pair(device: torch.device, pin_memory: bool) -> GrammarRows:
            return (
                torch.zeros(rows, dtype=torch.int64, device=device, pin_memory=pin_memory),
                torch.zeros(
                    rows * self.num_words, dtype=torch.int32, device=device, pin_memory=pin_memory
                ),  # flat: rows of any width up to num_words
            )

        cpu = torch.device("cpu")
        self._host = [pair(cpu, pin) for _ in range(self.num_sets)]
        if self.device.type != "cpu":
            self._device = pair(self.device, False)
