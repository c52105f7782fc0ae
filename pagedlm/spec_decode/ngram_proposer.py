"""NgramProposer: prompt-lookup drafts (ngram.py's matching) behind the Proposer boundary.

It keeps its own table of every row's tokens on the runner's device, written at add_request and
extended with each step's emitted tokens on the device. Where the matching runs (module notes of
ngram.py and ngram_device.py): on a CPU device the host numpy version over the same memory (the
engine runs synchronously there; numpy is 4-400x faster than the fixed-shape torch ops on this
CPU), on CUDA the fixed-shape torch version, so that no step waits for the host.

Under rejection_sample_method synthetic (benchmarking: acceptance is drawn at configured rates
whatever the drafts are) every request drafts k tokens each step, its last token repeated where
the lookup finds nothing, so the measured speed is that of the configured acceptance.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from pagedlm.sample.tables import upload
from pagedlm.spec_decode.config import SpeculativeConfig
from pagedlm.spec_decode.ngram import propose_ngram
from pagedlm.spec_decode.ngram_device import propose_ngram_device
from pagedlm.spec_decode.proposer import Drafts, VerifiedStep, no_drafts


class NgramProposer:
    runs_model = False

    def __init__(
        self, config: SpeculativeConfig, max_num_reqs: int, max_model_len: int, device: torch.device
    ) -> None:
        self.num_speculative_tokens = config.num_speculative_tokens
        self._min_n, self._max_n = config.prompt_lookup_min, config.prompt_lookup_max
        self._width = max_model_len
        # [rows, max_model_len + 1] int32: the last column takes the writes past a row's tokens
        self._table = torch.zeros(max_num_reqs, max_model_len + 1, dtype=torch.int32, device=device)
        self._lengths = torch.zeros(max_num_reqs, dtype=torch.int64, device=device)  # [rows]
        self._on_host = device.type == "cpu"
        self._always_draft = config.rejection_sample_method == "synthetic"

    def add_request(self, row: int, token_ids: Sequence[int]) -> None:
        """Uploads only (a host scalar written into a device tensor would sync)."""
        num = len(token_ids)
        device = self._table.device
        self._table[row, :num] = upload(np.asarray(token_ids, dtype=np.int32), device)
        self._lengths[row : row + 1] = upload(np.array([num], dtype=np.int64), device)

    def remove_request(self, row: int) -> None:
        """Nothing to free: add_request overwrites what the row's next request reads."""

    def propose(self, step: VerifiedStep, k: int | None = None) -> Drafts:
        """Proposer.propose: the table learns the emitted tokens whatever k; at k = 0 no lookup."""
        self._record(step)
        if k == 0:
            return no_drafts(step.rows_np.shape[0], self.num_speculative_tokens, step.rows.device)
        k = self.num_speculative_tokens
        if self._on_host:  # CPU tensors: the numpy views share their memory
            drafts = propose_ngram(
                self._table.numpy(),
                self._lengths.numpy(),
                step.rows_np,
                k,
                self._min_n,
                self._max_n,
            )
            token_ids = torch.from_numpy(drafts.token_ids)
            num_drafts = torch.from_numpy(drafts.num_drafts)
        else:
            table = self._table.index_select(0, step.rows)[:, : self._width]  # [R, W]
            token_ids, num_drafts = propose_ngram_device(
                table, self._lengths.index_select(0, step.rows), k, self._min_n, self._max_n
            )
        if self._always_draft:
            token_ids, num_drafts = self._fill_missing(step.rows, token_ids, num_drafts)
        return Drafts(token_ids, num_drafts)

    def _fill_missing(
        self, rows: torch.Tensor, token_ids: torch.Tensor, num_drafts: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Synthetic acceptance: a request without drafts drafts its last token k times."""
        last_at = (self._lengths.index_select(0, rows) - 1).clamp_(min=0)  # [R]
        last = self._table[rows, last_at].to(torch.int64)  # [R]
        token_ids = torch.where(num_drafts[:, None] > 0, token_ids, last[:, None])
        return token_ids, torch.full_like(num_drafts, self.num_speculative_tokens)

    def _record(self, step: VerifiedStep) -> None:
        """The emitted tokens [R, K + 1] into the table at first_positions + j, j <= num_accepted."""
        offsets = torch.arange(step.token_ids.shape[1], device=step.rows.device)  # [K + 1]
        positions = step.first_positions[:, None] + offsets[None, :]  # [R, K + 1]
        emitted = offsets[None, :] <= step.num_accepted[:, None]
        columns = torch.where(emitted & (positions < self._width), positions, self._width)
        rows = step.rows[:, None].expand_as(columns)
        self._table.index_put_((rows, columns), step.token_ids.to(torch.int32))
        lengths = (step.first_positions + step.num_accepted + 1).clamp_(max=self._width)
        self._lengths.index_copy_(0, step.rows, lengths)
