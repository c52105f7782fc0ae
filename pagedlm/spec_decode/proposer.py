"""The boundary between the worker and a draft proposer (n-gram here, a draft model elsewhere).

After every step that samples, the worker hands the proposer the step's verified tokens
(`VerifiedStep`: what each sampling request emitted, where it lands, and the step's own inputs)
and gets back the drafts the next step verifies (`Drafts`), all on the device: nothing here
waits for the host. The worker keeps the drafts by persistent row (`DraftStore`) and gathers a
request's drafts into the next step's input ids; how many drafts a request has goes back to the
scheduler with the step's output, so it schedules exactly 1 + that many positions.

Rows: a proposer sees a request from `add_request` (its prompt and outputs so far, also after a
preemption) until `remove_request`; between the two, every token the request emits reaches
`propose` once, in order (a step's `first_positions` are the next positions the proposer has not
seen for those rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

if TYPE_CHECKING:
    from pagedlm.spec_decode.config import SpeculativeConfig
    from pagedlm.worker.batch_layout import BatchLayout
    from pagedlm.worker.step_buffers import Sections


@dataclass(frozen=True, slots=True)
class VerifiedStep:
    """One sampling step's results, as the worker hands them to the proposer (R = the step's
    sampling requests in batch order; K = the most drafts any of them verified this step)."""

    rows_np: np.ndarray  # [R] int64 (host): the requests' persistent rows
    rows: torch.Tensor  # [R] int64 (device): the same
    token_ids: torch.Tensor  # [R, K + 1] int64: the emitted tokens (accepted drafts, then the
    # target's own token), NO_DRAFT (-1) past num_accepted
    num_accepted: torch.Tensor  # [R] int64: accepted drafts; a request emitted num_accepted + 1
    first_positions_np: np.ndarray  # [R] int64 (host): the sequence position of token_ids[:, 0]
    first_positions: torch.Tensor  # [R] int64 (device): the same
    # The step as it ran, for proposers that run a model (a draft model, EAGLE heads):
    hidden_states: torch.Tensor  # [>= num_tokens, hidden] the target's final hidden states
    batch_index_np: np.ndarray  # [R] int64: each sampling request's index in the step's batch
    layout: BatchLayout  # host facts of the step (num_tokens, num_seqs, ...)
    inputs: Sections  # the step's device inputs: positions, slot_mapping, seq_lens,
    # query_start_loc, block_table (inputs.prefix(name, ...)), laid out by `layout`


@dataclass(frozen=True, slots=True)
class Drafts:
    """The next step's drafts of a VerifiedStep's R requests, on the device."""

    token_ids: torch.Tensor  # [R, k] int64, NO_DRAFT (-1) past num_drafts
    num_drafts: torch.Tensor  # [R] int64 in [0, k]
    probs: torch.Tensor | None = None  # [R, k, vocab] float32: q (probabilistic drafts only)


class Proposer(Protocol):
    """What the worker calls; `num_speculative_tokens` (k) is the most drafts it proposes.
    `runs_model`: it runs a model over the step (a draft model), so it takes a ModelVerifiedStep
    (draft_model.py) after every step, also one where no request samples."""

    num_speculative_tokens: int
    runs_model: bool

    def add_request(self, row: int, token_ids: Sequence[int]) -> None:
        """The request in `row` has these tokens (prompt, then outputs so far)."""

    def remove_request(self, row: int) -> None:
        """The row's request left the worker."""

    def propose(self, step: VerifiedStep, k: int | None = None) -> Drafts:
        """Records the step's emitted tokens and proposes at most k drafts a request for the next
        step (None: num_speculative_tokens; 0: the batch size decodes plainly, nothing proposed,
        the tokens still recorded); no host sync."""


def no_drafts(num_requests: int, k: int, device: torch.device) -> Drafts:
    """Drafts of none of num_requests requests (token_ids [R, k] all NO_DRAFT)."""
    token_ids = torch.full((num_requests, k), -1, dtype=torch.int64, device=device)
    return Drafts(token_ids, torch.zeros(num_requests, dtype=torch.int64, device=device))


class DraftStore:
    """The drafts of every persistent row, on the device, from one step to the next."""

    def __init__(self, max_num_reqs: int, k: int, device: torch.device) -> None:
        self.k = k
        self.token_ids = torch.full((max_num_reqs, k), -1, dtype=torch.int64, device=device)
        self.flat_ids = self.token_ids.view(-1)  # [max_num_reqs * k]: row * k + j
        self.probs: torch.Tensor | None = None  # [max_num_reqs, k, vocab], made on first use

    def store(self, rows: torch.Tensor, drafts: Drafts) -> None:
        """rows [R] int64 (device) take drafts' [R, k] ids (and probs)."""
        self.token_ids.index_copy_(0, rows, drafts.token_ids)
        if drafts.probs is not None:
            if self.probs is None:
                shape = (self.token_ids.shape[0], self.k, drafts.probs.shape[-1])
                self.probs = torch.zeros(shape, device=self.token_ids.device)
            self.probs.index_copy_(0, rows, drafts.probs)


def make_proposer(
    config: SpeculativeConfig, max_num_reqs: int, max_model_len: int, device: torch.device
) -> Proposer:
    """The proposer of config.method."""
    if config.method == "ngram":
        from pagedlm.spec_decode.ngram_proposer import NgramProposer

        return NgramProposer(config, max_num_reqs, max_model_len, device)
    raise ValueError(f"speculative_config.method: {config.method} has no proposer yet")
