"""Repetition (CTRL/HF), frequency and presence (OpenAI) penalties, and the per-row token
history they read, kept on the device: the device is the source of truth for what a row has
sampled, since the host copy of a request's outputs can lag a step under async scheduling.

A step reads and writes only the logits of the ids in each row's history ([M, W], W the longest
history of the batch), never a whole [M, V] row."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from pagedlm.sample.tables import upload

NO_TOKEN = -1  # history slot past the row's length
_MIN_WIDTH = 64


class PenaltyTables:
    """Per row, on the device: the ids of the request's prompt then outputs, in order, NO_TOKEN
    after them (token_ids [num_rows, width], width grows), and how often each id was sampled
    (output_counts [num_rows, V] int32). The host knows each row's length; the sampled ids are
    appended on the device. A row is valid only while a penalised request holds it; `reset_row`
    rebuilds it when one arrives."""

    def __init__(self, num_rows: int, vocab_size: int, device: torch.device) -> None:
        self.device = device
        self.vocab_size = vocab_size
        self.output_counts = torch.zeros((num_rows, vocab_size), dtype=torch.int32, device=device)
        self.token_ids = torch.full(
            (num_rows, _MIN_WIDTH), NO_TOKEN, dtype=torch.int64, device=device
        )
        self.lengths_np = np.zeros(num_rows, dtype=np.int64)  # [num_rows]

    def reset_row(
        self, row: int, prompt_token_ids: Sequence[int], output_token_ids: Sequence[int]
    ) -> None:
        prompt_np = np.asarray(prompt_token_ids, dtype=np.int64)
        output_np = np.asarray(output_token_ids, dtype=np.int64)
        length = prompt_np.size + output_np.size
        self._reserve(length + 1)
        history_np = np.full(self.token_ids.shape[1], NO_TOKEN, dtype=np.int64)
        history_np[: prompt_np.size] = prompt_np
        history_np[prompt_np.size : length] = output_np
        self.token_ids[row] = upload(history_np, self.device)
        self.lengths_np[row] = length
        output_ids = upload(output_np, self.device)
        ones = torch.ones_like(output_ids, dtype=torch.int32)
        self.output_counts[row].zero_().index_add_(0, output_ids, ones)

    def batch(
        self, rows_np: np.ndarray, rows: torch.Tensor, drafts: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The histories of rows [M] (rows_np on the host): token_ids [M, W] with the slots past
        a row's length repeating its first id, counts [M, W] int32, has_history [M] bool (False:
        an empty history, whose slots hold id 0). drafts [M, K] (speculative verification):
        the drafts before each row's position, NO_TOKEN after them; they count as outputs."""
        width = max(1, int(self.lengths_np[rows_np].max()))
        token_ids = self.token_ids[:, :width].index_select(0, rows)  # [M, W]
        if drafts is not None:
            token_ids = torch.cat([token_ids, drafts], dim=1)  # [M, W + K]
        # a row's slots fill from the left in each part: the first id, or its first draft
        first = token_ids[:, :1]  # [M, 1]
        if drafts is not None:
            first = torch.where(first == NO_TOKEN, drafts[:, :1], first)
        token_ids = torch.where(token_ids == NO_TOKEN, first, token_ids).clamp_(min=0)
        counts = self.output_counts[rows[:, None], token_ids]  # [M, W]
        if drafts is not None:  # [M, W + K, K] compares: K is small
            counts += (token_ids[:, :, None] == drafts[:, None, :]).sum(dim=-1, dtype=torch.int32)
        return token_ids, counts, first[:, 0] != NO_TOKEN

    def record(
        self,
        rows: torch.Tensor,
        positions: torch.Tensor,
        sampled_token_ids: torch.Tensor,
        rows_np: np.ndarray,
    ) -> None:
        """Append the tokens just sampled: rows [M] int64 (distinct; rows_np on the host),
        positions [M] (their lengths), sampled_token_ids [M] int64."""
        self._reserve(int(self.lengths_np[rows_np].max()) + 1)
        self.token_ids[rows, positions] = sampled_token_ids
        self.lengths_np[rows_np] += 1
        flat_index = rows * self.vocab_size + sampled_token_ids  # [M]
        ones = torch.ones_like(flat_index, dtype=torch.int32)
        self.output_counts.view(-1).index_add_(0, flat_index, ones)

    def record_emitted(
        self, rows: torch.Tensor, positions: torch.Tensor, token_ids: torch.Tensor, max_end: int
    ) -> None:
        """Append what verification steps emitted: rows [M] int64 (distinct), positions [M]
        (their lengths), token_ids [M, K + 1] int64 (NO_TOKEN past each row's emitted ones, so
        the slots past a row's length stay NO_TOKEN); max_end: the largest position + K + 1.
        The host learns the counts later: SamplingState.count_emitted moves lengths_np."""
        self._reserve(max_end)
        columns = torch.arange(token_ids.shape[1], device=rows.device)  # [K + 1]
        self.token_ids[rows[:, None], positions[:, None] + columns] = token_ids
        emitted = token_ids >= 0  # [M, K + 1]
        flat_index = rows[:, None] * self.vocab_size + token_ids.clamp(min=0)  # [M, K + 1]
        self.output_counts.view(-1).index_add_(
            0, flat_index.view(-1), emitted.view(-1).to(torch.int32)
        )

    def _reserve(self, width: int) -> None:
        """Room for histories of `width` ids (doubling)."""
        current = self.token_ids.shape[1]
        if width <= current:
            return
        extra = max(width, 2 * current) - current
        fill = torch.full(
            (self.token_ids.shape[0], extra), NO_TOKEN, dtype=torch.int64, device=self.device
        )
        self.token_ids = torch.cat([self.token_ids, fill], dim=1)


def apply_penalties(
    logits: torch.Tensor,  # [N, V] float32, modified in place
    index: torch.Tensor | None,  # [M] int64: the rows of logits; None: all
    token_ids: torch.Tensor,  # [M, W] int64: each row's prompt and output ids, repeats allowed
    counts: torch.Tensor,  # [M, W] int32: how often each was sampled
    repetition: torch.Tensor,  # [M] float32, 1: off
    frequency: torch.Tensor,  # [M] float32, 0: off
    presence: torch.Tensor,  # [M] float32, 0: off
) -> None:
    """Repetition over prompt and output ids (divide positive logits, multiply the others), then
    `logit -= frequency * count + presence * (count > 0)` over output ids. A repeated id gets
    the same value from the same logit and count each time: writing all repeats is writing one."""
    rows = torch.arange(logits.shape[0], device=logits.device) if index is None else index
    rows = rows[:, None]  # [M, 1]
    values = logits[rows, token_ids]  # [M, W]
    repetition = repetition[:, None]
    values = torch.where(values > 0, values / repetition, values * repetition)
    values -= frequency[:, None] * counts + presence[:, None] * (counts > 0)
    logits[rows, token_ids] = values
