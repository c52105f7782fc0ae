"""Repetition (CTRL/HF), frequency and presence (OpenAI) penalties, and the per-row token
history they read, kept on the device: the device is the source of truth for what a row has
sampled, since the host copy of a request's outputs can lag a step under async scheduling."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from pagedlm.sample.tables import upload


class PenaltyTables:
    """Which ids each row's prompt holds and how often each id was sampled in the row:
    prompt_mask [num_rows, V] bool, output_counts [num_rows, V] int32. A row is valid only
    while a penalised request holds it; `reset_row` rebuilds it when one arrives."""

    def __init__(self, num_rows: int, vocab_size: int, device: torch.device) -> None:
        self.device = device
        self.vocab_size = vocab_size
        self.prompt_mask = torch.zeros((num_rows, vocab_size), dtype=torch.bool, device=device)
        self.output_counts = torch.zeros((num_rows, vocab_size), dtype=torch.int32, device=device)

    def reset_row(self, row: int, prompt_token_ids: Sequence[int],
                  output_token_ids: Sequence[int]) -> None:
        prompt_ids = upload(np.asarray(prompt_token_ids, dtype=np.int64), self.device)
        output_ids = upload(np.asarray(output_token_ids, dtype=np.int64), self.device)
        self.prompt_mask[row].zero_().index_fill_(0, prompt_ids, True)
        ones = torch.ones_like(output_ids, dtype=torch.int32)
        self.output_counts[row].zero_().index_add_(0, output_ids, ones)

    def record(self, rows: torch.Tensor, sampled_token_ids: torch.Tensor) -> None:
        """Count the tokens just sampled: rows [M] int64 (distinct), sampled_token_ids [M] int64."""
        flat_index = rows * self.vocab_size + sampled_token_ids  # [M]
        ones = torch.ones_like(flat_index, dtype=torch.int32)
        self.output_counts.view(-1).index_add_(0, flat_index, ones)


def apply_penalties(
    logits: torch.Tensor,  # [M, V] float32
    prompt_mask: torch.Tensor,  # [M, V] bool
    output_counts: torch.Tensor,  # [M, V] int32
    repetition: torch.Tensor,  # [M] float32, 1: off
    frequency: torch.Tensor,  # [M] float32, 0: off
    presence: torch.Tensor,  # [M] float32, 0: off
) -> torch.Tensor:  # [M, V]
    """Repetition over prompt and output ids (divide positive logits, multiply the others), then
    `logit -= frequency * count + presence * (count > 0)` over output ids."""
    in_output = output_counts > 0  # [M, V]
    repetition = repetition[:, None]
    scaled = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits = torch.where(prompt_mask | in_output, scaled, logits)
    logits -= frequency[:, None] * output_counts + presence[:, None] * in_output
    return logits
