"""Every row's tokens on the device, for proposers that read them (the draft model's inputs):
written at add_request, extended with each step's emitted tokens on the device, no host sync."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from pagedlm.sample.tables import upload


class TokenTable:
    def __init__(self, max_num_reqs: int, max_model_len: int, device: torch.device) -> None:
        self.width = max_model_len
        # [rows, max_model_len + 1] int32: the last column takes the writes past a row's tokens
        self.ids = torch.zeros(max_num_reqs, max_model_len + 1, dtype=torch.int32, device=device)

    def add(self, row: int, token_ids: Sequence[int]) -> None:
        ids = np.asarray(token_ids, dtype=np.int32)[: self.width]
        self.ids[row, : ids.shape[0]] = upload(ids, self.ids.device)

    def record(
        self,
        rows: torch.Tensor,
        token_ids: torch.Tensor,
        num_accepted: torch.Tensor,
        first_positions: torch.Tensor,
    ) -> None:
        """rows [R] took the emitted tokens token_ids[:, : num_accepted + 1] ([R, K + 1])
        at first_positions [R] on."""
        offsets = torch.arange(token_ids.shape[1], device=rows.device)  # [K + 1]
        positions = first_positions[:, None] + offsets[None, :]  # [R, K + 1]
        emitted = offsets[None, :] <= num_accepted[:, None]
        columns = torch.where(emitted & (positions < self.width), positions, self.width)
        self.ids.index_put_((rows[:, None].expand_as(columns), columns), token_ids.to(torch.int32))
