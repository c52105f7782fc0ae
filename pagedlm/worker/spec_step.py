"""SpecWorker: the runner's speculative-decoding part, all on the device, no host sync.

Per step (ModelRunner calls, in order):
- `begin_step`: one upload of the step's draft layout (spec_layout.py) and the sampling
  requests' first positions;
- `write_draft_inputs`: the draft positions' input ids from the DraftStore;
- `sample_and_propose`: a step without drafts samples as without speculation (the runner's own
  `_sample`: graphs' argmax, grammar, every feature), one with drafts runs the rejection sampler
  over each sampling request's 1 + n logits rows with the request's parameters repeated (noise
  keys and min_tokens counting the row's position, penalties and bad words reading the drafts
  before it as outputs); then the proposer gets the emitted tokens
  (proposer.py) and proposes at most the k of the step's batch size (0: it only records them)
  and the next drafts go into the DraftStore; one copy brings [N, k + 3] to pinned
  host memory: the emitted tokens (k + 1 columns, -1 past the emitted), the accepted drafts,
  the drafts now held.

Tokens sampled by rows without drafts are counted by the sampler at once (they may be in flight
under async scheduling), those of rows with drafts when the host records the step (such requests
are never scheduled while a step of theirs is in flight: core/spec_plan.py); the device
histories of penalties and bad words take every row's emitted tokens at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from pagedlm.config import EngineConfig
from pagedlm.sample.grammar_mask import apply_grammar_bitmask
from pagedlm.sample.sampler import Logprobs, SamplingBatch
from pagedlm.sample.tables import upload
from pagedlm.spec_decode.draft_model import (
    DraftModelProposer,
    ModelVerifiedStep,
    empty_verified_step,
)
from pagedlm.spec_decode.ngram import NO_DRAFT
from pagedlm.spec_decode.proposer import DraftStore, VerifiedStep, make_proposer
from pagedlm.spec_decode.rejection_sampler import SyntheticAcceptance, rejection_sample
from pagedlm.spec_decode.triton_scan import triton_accept_scan
from pagedlm.worker.grammar_inputs import GrammarRows
from pagedlm.worker.spec_layout import drafts_before_index
from pagedlm.worker.step_plan import StepPlan

if TYPE_CHECKING:
    from pagedlm.worker.model_runner import ModelRunner


@dataclass(slots=True)
class SpecOutput:
    """A step's results on their way to the host (runner_output.py reads them)."""

    # [N, 2k + 3] int64 (pinned): tokens [k + 1], num_accepted, num_drafts held next, those
    # drafts [k] (NO_DRAFT past them: the engine core checks a constrained request's against
    # its grammar before it verifies them, structured_outputs/manager.py)
    host_np: np.ndarray
    logprobs: Logprobs | None  # over the logits rows (device)
    logits_start_np: np.ndarray  # [N]: each request's first logits row

    @property
    def k(self) -> int:
        return (self.host_np.shape[1] - 3) // 2

    @property
    def emitted_np(self) -> np.ndarray:
        """[N, k + 1] the tokens; the first num_accepted + 1 of each row emitted."""
        return self.host_np[:, : self.k + 1]

    @property
    def num_accepted_np(self) -> np.ndarray:
        return self.host_np[:, self.k + 1]


@dataclass(slots=True)
class _StepTensors:
    first_positions: torch.Tensor  # [N] int64
    draft_token_idx: torch.Tensor | None = None  # [D]
    draft_src: torch.Tensor | None = None  # [D]
    logits_idx: torch.Tensor | None = None  # [T_l]
    cu_num_drafts: torch.Tensor | None = None  # [N]
    logits_start: torch.Tensor | None = None  # [N]


class SpecWorker:
    def __init__(self, config: EngineConfig, num_staging_sets: int) -> None:
        spec = config.speculative
        assert spec is not None
        self.k = spec.num_speculative_tokens
        self._k_for_batch = spec.num_spec_tokens_for_batch
        self.device = config.device
        max_num_reqs = config.scheduler.max_num_seqs
        self.proposer = (
            DraftModelProposer(config)
            if spec.method == "draft_model"
            else make_proposer(spec, max_num_reqs, config.model.max_model_len, self.device)
        )
        self.store = DraftStore(max_num_reqs, self.k, self.device)
        self._rates = None
        if spec.rejection_sample_method == "synthetic":
            self._rates = torch.tensor(spec.synthetic_acceptance_rates, device=self.device)
        self._zeros = torch.zeros(max_num_reqs, dtype=torch.int64, device=self.device)
        pin = self.device.type == "cuda"
        self._host = [
            torch.zeros(max_num_reqs * (2 * self.k + 3), dtype=torch.int64, pin_memory=pin)
            for _ in range(num_staging_sets)
        ]
        self._step: _StepTensors | None = None

    def warm_up(self) -> None:
        """CUDA start-up: the accept scan's specialisation (K = k), so no step compiles it."""
        num_rows = 2 * (self.k + 1)  # two requests of k drafts
        token = torch.zeros(num_rows, dtype=torch.int64, device=self.device)
        cu = torch.arange(1, 3, dtype=torch.int64, device=self.device) * self.k
        triton_accept_scan(token.bool(), token, token, cu, self.k)

    def add_request(self, row: int, token_ids: list[int]) -> None:
        self.proposer.add_request(row, token_ids)

    def remove_request(self, row: int) -> None:
        self.proposer.remove_request(row)

    def begin_step(self, plan: StepPlan) -> None:
        layout = plan.layout
        first_np = layout.sample_positions_np.astype(np.int64)
        spec = layout.spec
        if spec is None:
            self._step = _StepTensors(upload(first_np, self.device)) if first_np.size else None
            return
        packed = upload(np.concatenate([spec.packed_np, first_np]), self.device)
        d, t, n = spec.num_draft_tokens, spec.num_logits_rows, layout.num_samples
        self._step = _StepTensors(
            first_positions=packed[2 * d + t + 2 * n :],
            draft_token_idx=packed[:d],
            draft_src=packed[d : 2 * d],
            logits_idx=packed[2 * d : 2 * d + t],
            cu_num_drafts=packed[2 * d + t : 2 * d + t + n],
            logits_start=packed[2 * d + t + n : 2 * d + t + 2 * n],
        )

    def write_draft_inputs(self, input_ids: torch.Tensor) -> None:
        """input_ids [T]: the draft positions take their drafts."""
        step = self._step
        input_ids.index_copy_(
            0, step.draft_token_idx, self.store.flat_ids.index_select(0, step.draft_src)
        )

    def sample_and_propose(
        self,
        runner: ModelRunner,
        hidden: torch.Tensor,
        plan: StepPlan,
        grammar: GrammarRows | None,
        slot: int,
    ) -> SpecOutput | None:
        layout = plan.layout
        num_samples = layout.num_samples
        if num_samples == 0:
            if self.proposer.runs_model:  # the draft's KV of the chunks
                self.proposer.propose(self._model_step(runner, plan, empty_verified_step(plan)))
            return None
        if layout.spec is None:
            sample, _ = runner._sample(hidden, plan, grammar)
            token_ids = torch.full(
                (num_samples, self.k + 1), NO_DRAFT, dtype=torch.int64, device=self.device
            )
            token_ids[:, 0] = sample.sampled_token_ids[:num_samples]
            num_accepted, logprobs = self._zeros[:num_samples], sample.logprobs
            logits_start_np = np.arange(num_samples)
        else:
            token_ids, num_accepted, logprobs = self._verify(runner, hidden, plan, grammar)
            logits_start_np = layout.spec.logits_start_np
        rows = plan.inputs.prefix("sample_rows", num_samples)  # [N] int64
        step = VerifiedStep(
            rows_np=layout.sample_rows_np.astype(np.int64),
            rows=rows,
            token_ids=token_ids,
            num_accepted=num_accepted,
            first_positions_np=layout.sample_positions_np.astype(np.int64),
            first_positions=self._step.first_positions,
            hidden_states=hidden,
            batch_index_np=_sample_batch_index(layout),
            layout=layout,
            inputs=plan.inputs,
        )
        if self.proposer.runs_model:
            step = self._model_step(runner, plan, step)
        # the next step's k, at this step's batch size (the scheduler's is its running requests)
        drafts = self.proposer.propose(step, self._k_for_batch(layout.num_seqs))
        self.store.store(rows, drafts)
        packed = torch.cat(
            [token_ids, num_accepted[:, None], drafts.num_drafts[:, None], drafts.token_ids], dim=1
        )
        host = self._host[slot][: packed.numel()].view(num_samples, 2 * self.k + 3)
        host.copy_(packed, non_blocking=True)
        return SpecOutput(host.numpy(), logprobs, logits_start_np)  # sync-ok: pinned host view

    def _model_step(
        self, runner: ModelRunner, plan: StepPlan, step: VerifiedStep
    ) -> ModelVerifiedStep:
        """What the draft model reads of the step besides (spec_decode/draft_model.py)."""
        layout = plan.layout
        table = plan.inputs.prefix("block_table", layout.num_seqs, layout.num_block_cols)
        sampling = None
        if self.proposer.probabilistic and not runner.sampler.is_greedy(layout.sample_rows_np):
            sampling = runner.sampler.make_batch(layout.sample_rows_np).random
        graphs = None if runner.graphs is None else runner.graphs.draft  # over the real cache
        meta = runner._attention_metadata(plan, table)
        return ModelVerifiedStep.of(step, meta, sampling, graphs)

    def _verify(
        self, runner: ModelRunner, hidden: torch.Tensor, plan: StepPlan, grammar: GrammarRows | None
    ) -> tuple[torch.Tensor, torch.Tensor, Logprobs | None]:
        """The rejection sampler over the step's logits rows -> emitted tokens [N, k + 1],
        accepted drafts [N], logprobs of the rows' tokens."""
        layout, step, spec = plan.layout, self._step, plan.layout.spec
        logits = runner.lm_head.gathered(runner.model.compute_logits, hidden, step.logits_idx)
        if grammar is not None:  # the rows of each constrained request's positions
            apply_grammar_bitmask(logits, *grammar)
        rows_np = layout.sample_rows_np
        num_rows_np = spec.num_drafts_np + 1  # [N]
        row_rows_np = np.repeat(rows_np, num_rows_np)  # [T_l]
        offsets_np = np.arange(spec.num_logits_rows) - np.repeat(spec.logits_start_np, num_rows_np)
        sampler = runner.sampler
        draft_ids = self.store.flat_ids.index_select(0, step.draft_src)  # [D]
        batch = SamplingBatch()
        if not sampler.is_greedy(rows_np):
            drafts = None
            if sampler.reads_history(rows_np):
                drafts = self._drafts_before(draft_ids, spec.num_drafts_np, offsets_np)
            batch = sampler.make_batch(row_rows_np, offsets_np, drafts)
        synthetic = None
        if self._rates is not None:
            synthetic = SyntheticAcceptance(
                self._rates, sampler.noise_keys(row_rows_np, offsets_np)
            )
        draft_probs = None
        if self.store.probs is not None:
            flat_probs = self.store.probs.view(-1, self.store.probs.shape[-1])
            draft_probs = flat_probs.index_select(0, step.draft_src)  # [D, V]
        out = rejection_sample(
            logits, draft_ids, step.cu_num_drafts, self.k, batch, draft_probs, synthetic
        )
        # the host counts a drafting row's tokens once it reads them (ModelRunner._count_verified)
        sampler.record_verified(rows_np, out.token_ids)
        sampler.count_emitted(rows_np[spec.num_drafts_np == 0], 1)
        last = out.token_ids.gather(1, out.num_accepted[:, None])[:, 0]  # [N]
        runner._last_sampled.index_copy_(
            0, plan.inputs.prefix("sample_rows", layout.num_samples), last
        )
        return out.token_ids, out.num_accepted, out.logprobs

    def _drafts_before(
        self, draft_ids: torch.Tensor, num_drafts_np: np.ndarray, offsets_np: np.ndarray
    ) -> torch.Tensor:
        """[T_l, k] int64: each logits row's drafts before its position, NO_DRAFT after them
        (what penalties and bad words read as the outputs before that row's token)."""
        index = upload(drafts_before_index(num_drafts_np, offsets_np, self.k), self.device)
        padded = torch.cat([draft_ids, draft_ids.new_full((1,), NO_DRAFT)])  # [D + 1]
        return padded[index]


def _sample_batch_index(layout) -> np.ndarray:
    """[N]: each sampling request's index in the step's batch."""
    if layout.sample_batch_idx_np is None:
        return np.arange(layout.num_samples)
    return layout.sample_batch_idx_np
