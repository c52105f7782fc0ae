"""The draft_model proposer: a smaller model of the target's vocabulary drafts k tokens a request.

It owns the draft model and its KV cache, one tensor per draft layer with the target's block
count and block size, addressed with the target's block tables (draft_inputs.py): the pool's
blocks hold both models' KV, so a block costs target + draft bytes (memory.pool_bytes_per_block)
and the scheduler knows nothing new: a request's draft positions past the blocks it holds go to
scratch blocks of the draft's own (draft_inputs.Scratch).

After each target step is verified, `propose` records the emitted tokens and runs the draft's
first forward over the step's inputs and each sampling request's next token, then k - 1
single-token steps, all on the device with fixed shapes (no host sync). On CUDA they replay the
draft's graphs (draft_graphs.py) where the runner holds them (the step's `graphs`): the single
steps, and the first forward of a uniform step (every request sampling, with as many inputs);
a ragged first forward, or a shape with no graph, runs eagerly. Drafts are the argmax
(`draft_sample_method` greedy, or a greedy request), or draws from q = softmax(draft logits /
the request's temperature) (probabilistic, random requests): the rejection sampler then needs q
at each draft (`Drafts.probs`).
The draws use the sampler's counter-based noise (sample/noise.py) under a salt of their own,
so a seeded request drafts the same in any batch and its drafts are independent of the
verifier's accept test and residual draw.

Behind the worker's Proposer boundary (proposer.py), with more of the step than a VerifiedStep
holds (`ModelVerifiedStep`); like the n-gram proposer it keeps every row's tokens on the device
(token_table.py), from which the draft's inputs are read."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np
import torch

from pagedlm.attention.backend import AttentionMetadata, get_attention_backend
from pagedlm.config import EngineConfig, ModelConfig
from pagedlm.distributed.parallel_state import single_rank
from pagedlm.model.llama import LlamaForCausalLM
from pagedlm.model.loader import load_model
from pagedlm.sample.gumbel import gumbel_draw
from pagedlm.sample.noise import mix64_, to_int64
from pagedlm.sample.sampler import RandomParams
from pagedlm.sample.tables import upload
from pagedlm.spec_decode.draft_config import draft_scratch_blocks
from pagedlm.spec_decode.draft_graphs import DraftGraphs, Shape
from pagedlm.spec_decode.draft_inputs import (
    DraftBatch,
    DraftStep,
    Scratch,
    SingleSteps,
    first_forward_inputs,
    max_table_cols,
    single_step_inputs,
    single_steps,
)
from pagedlm.spec_decode.ngram import NO_DRAFT
from pagedlm.spec_decode.proposer import Drafts, VerifiedStep, no_drafts
from pagedlm.spec_decode.token_table import TokenTable

if TYPE_CHECKING:
    from pagedlm.worker.step_plan import StepPlan

_DRAFT_SALT = to_int64(0x5D2A_F7C1_93E4_6B08)  # the drafts' noise, apart from the verifier's


@dataclass(frozen=True, slots=True)
class ModelVerifiedStep(VerifiedStep):
    """A VerifiedStep with what a proposer that runs a model over the whole step needs too. The
    worker hands one over after every step, also a step where no request samples (R = 0: the
    draft still writes the KV of its prefill chunks)."""

    attn_metadata: AttentionMetadata  # the target's step (device tensors and host copies)
    input_ids: torch.Tensor  # [T] int64: the step's inputs, right at least where none samples
    sampling: RandomParams | None = None  # the R requests' (probabilistic drafts; None: greedy)
    graphs: DraftGraphs | None = None  # the draft's, over its cache; None: it runs eagerly

    @classmethod
    def of(
        cls,
        step: VerifiedStep,
        attn_metadata: AttentionMetadata,
        sampling: RandomParams | None = None,
        graphs: DraftGraphs | None = None,
    ) -> ModelVerifiedStep:
        """The worker's VerifiedStep with the rest of the step; the input ids from its device
        inputs (step_buffers.py): a request that does not sample has no placeholder, so its ids
        are right even after the step's sampling wrote the ids table's head."""
        base = {f.name: getattr(step, f.name) for f in fields(VerifiedStep)}
        num_tokens, inputs = step.layout.num_tokens, step.inputs
        if step.layout.num_placeholders:
            src = inputs.prefix("input_src", num_tokens)
            input_ids = inputs.tensors["ids_table"].index_select(0, src)
        else:
            input_ids = inputs.prefix("input_ids", num_tokens)
        return cls(
            **base,
            attn_metadata=attn_metadata,
            input_ids=input_ids,
            sampling=sampling,
            graphs=graphs,
        )


class DraftModelProposer:
    """The draft model, its KV cache, a token table of every row and the proposal loop."""

    runs_model = True

    def __init__(self, config: EngineConfig) -> None:
        if config.draft_model is None or config.speculative is None:
            raise ValueError("DraftModelProposer needs speculative_config method draft_model")
        self.config: ModelConfig = config.draft_model
        self.device = config.device
        self.block_size = config.cache.block_size
        self.num_speculative_tokens = config.speculative.num_speculative_tokens
        self.probabilistic = config.speculative.draft_sample_method == "probabilistic"
        self.max_model_len = config.model.max_model_len
        self.attention_backend = config.attention_backend
        self.num_scratch_blocks = draft_scratch_blocks(config)  # past the pool's (Scratch)
        self._pool_blocks = 0
        self.tokens = TokenTable(config.scheduler.max_num_seqs, self.max_model_len, self.device)
        self.model: LlamaForCausalLM | None = None
        self.kv_caches: list[torch.Tensor] = []  # per draft layer [2, blocks, B, Hkv, D]

    def load_model(self) -> None:
        """Whole on every rank at tp > 1 (replicated: each rank drafts the same by itself)."""
        backend = get_attention_backend(self.attention_backend, self.device)
        with single_rank():
            self.model = load_model(self.config, backend, self.device)

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """Beside the target's cache of num_blocks blocks (the same block ids), and the scratch
        blocks past them."""
        self._pool_blocks = num_blocks
        self.kv_caches = [self._new_kv_cache(num_blocks) for _ in range(self.config.num_layers)]

    @contextlib.contextmanager
    def dummy_kv_cache(self, num_blocks: int) -> Iterator[int]:
        """For the runner's dummy steps on a cache of their own: one of num_blocks blocks for
        every layer (their values matter to no one), the real one back on exit. Yields its
        bytes."""
        saved = self.kv_caches, self._pool_blocks
        cache = self._new_kv_cache(num_blocks)
        self.kv_caches, self._pool_blocks = [cache] * self.config.num_layers, num_blocks
        try:
            yield cache.numel() * cache.element_size()
        finally:
            self.kv_caches, self._pool_blocks = saved

    def new_graphs(self, kv_caches: list[torch.Tensor] | None, shapes: list[Shape]) -> DraftGraphs:
        """Uncaptured graphs of these shapes (draft_graph_shapes) over kv_caches (None: a trial
        cache of one block, for the capture's bytes before the KV cache is sized: no graph
        reads or writes it)."""
        if kv_caches is None:
            kv_caches = [self._new_kv_cache(1)] * self.config.num_layers
        k = self.num_speculative_tokens
        return DraftGraphs(
            self.model,
            kv_caches,
            shapes,
            max_table_cols(self.max_model_len, self.block_size, k),
            self.block_size,
            self.max_model_len,
            keep_logits=self.probabilistic,
        )

    def _new_kv_cache(self, num_blocks: int) -> torch.Tensor:
        """[2, num_blocks + the scratch blocks, block_size, Hkv, D]."""
        config = self.config
        num_blocks += self.num_scratch_blocks
        shape = (2, num_blocks, self.block_size, config.num_kv_heads, config.head_dim)
        return torch.zeros(shape, dtype=config.dtype, device=self.device)

    def add_request(self, row: int, token_ids: Sequence[int]) -> None:
        self.tokens.add(row, token_ids)

    def remove_request(self, row: int) -> None:
        """Nothing to free: add_request overwrites what the row's next request reads."""

    def propose(self, step: VerifiedStep, k: int | None = None) -> Drafts:
        """k drafts (None: num_speculative_tokens) for each of the step's R sampling requests
        (module doc), in [R, num_speculative_tokens] (NO_DRAFT past k). k = 0 (a batch size that
        decodes plainly): none, the first forward only, which keeps the draft's KV of every
        token."""
        if not isinstance(step, ModelVerifiedStep):
            raise TypeError("the draft model proposer needs a ModelVerifiedStep")
        self.tokens.record(step.rows, step.token_ids, step.num_accepted, step.first_positions)
        width, num_samples = self.num_speculative_tokens, step.rows_np.shape[0]
        k = width if k is None else k
        draft_step = self._draft_step(step)
        drafting = num_samples > 0 and k > 0
        scratch = Scratch(self._pool_blocks, -(-k // self.block_size) if drafting else 0)
        first = first_forward_inputs(draft_step, self.block_size, self.max_model_len, scratch)
        if not drafting:
            self._forward(first)
            return no_drafts(num_samples, width, step.token_ids.device)
        graphs = step.graphs
        shape = None if graphs is None else graphs.first_shape(first, num_samples)
        if shape is None:
            token_ids, q = draw_drafts(self._logits(first), step.sampling, 0, self.probabilistic)
        else:
            graphs.load_first(first)
            token_ids, q = self._replayed_step(graphs, shape, num_samples, step.sampling, 0)
        drafts, probs = [token_ids], [q]
        if k > 1:
            shared = single_steps(draft_step, first, self.max_model_len)
            self._single_steps(shared, step, drafts, probs, k)
        token_ids = torch.stack(drafts, dim=1)  # [R, k]
        num_drafts = torch.full_like(token_ids[:, 0], k)  # [R]
        q = None if probs[0] is None else torch.stack(probs, 1)  # [R, k, V]
        if k < width:  # the DraftStore's width
            token_ids = torch.nn.functional.pad(token_ids, (0, width - k), value=NO_DRAFT)
            q = None if q is None else torch.nn.functional.pad(q, (0, 0, 0, width - k))
        return Drafts(token_ids, num_drafts, q)

    def _draft_step(self, step: ModelVerifiedStep) -> DraftStep:
        sample_seqs_np = step.batch_index_np.astype(np.int64)
        return DraftStep(
            meta=step.attn_metadata,
            input_ids=step.input_ids,
            token_table=self.tokens.ids,
            sample_rows=step.rows,
            sample_seqs=upload(sample_seqs_np, self.device),
            sample_seqs_np=sample_seqs_np,
            next_positions=step.first_positions + step.num_accepted,
        )

    def _single_steps(
        self,
        shared: SingleSteps,
        step: ModelVerifiedStep,
        drafts: list[torch.Tensor],
        probs: list[torch.Tensor | None],
        k: int,
    ) -> None:
        """Drafts 2..k ([R] each, and q) appended to drafts and probs: replays of the step's
        draft graphs where one holds its R rows, else eager single steps."""
        graphs, num_rows = step.graphs, drafts[0].shape[0]
        shape = None if graphs is None else graphs.single_shape(num_rows)
        if shape is not None:
            graphs.load_single(shared, drafts[0])
        for j in range(1, k):
            if shape is None:
                batch = single_step_inputs(
                    shared, drafts[-1], j, self.block_size, self.max_model_len
                )
                logits = self._logits(batch)
                token_ids, q = draw_drafts(logits, step.sampling, j, self.probabilistic)
            else:
                token_ids, q = self._replayed_step(graphs, shape, num_rows, step.sampling, j)
            drafts.append(token_ids)
            probs.append(q)

    def _replayed_step(
        self,
        graphs: DraftGraphs,
        shape: Shape,
        num_rows: int,
        sampling: RandomParams | None,
        j: int,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft j + 1 [R] (and q) from a replay of the loaded graph of `shape`: its argmax
        are the greedy drafts; draws go over them, as a single step's next inputs."""
        logits = graphs.replay(shape)  # [P, V] float32, or None (greedy drafts)
        greedy = graphs.ids(num_rows)  # [R]
        rows = None if logits is None else logits[:num_rows]
        token_ids, q = draw_drafts(rows, sampling, j, self.probabilistic, greedy)
        if q is None:  # the argmax: the buffer's, until the next replay
            return token_ids.clone(), None
        greedy.copy_(token_ids)
        return token_ids, q

    def _forward(self, batch: DraftBatch) -> torch.Tensor:
        """[N, hidden_size]: the draft over one batch, its KV written at batch's slots."""
        return self.model(batch.input_ids, batch.positions, self.kv_caches, batch.meta)

    def _logits(self, batch: DraftBatch) -> torch.Tensor:
        """[S, V] float32 at the batch's draft rows."""
        hidden = self._forward(batch)
        return self.model.compute_logits(hidden.index_select(0, batch.logits_rows))


def empty_verified_step(plan: StepPlan) -> VerifiedStep:
    """The VerifiedStep of a step where no request samples (prefill chunks only)."""
    device = plan.inputs.tensors["ids_table"].device
    none = torch.zeros(0, dtype=torch.int64, device=device)
    none_np = np.zeros(0, dtype=np.int64)
    return VerifiedStep(
        rows_np=none_np,
        rows=none,
        token_ids=none.view(0, 1),
        num_accepted=none,
        first_positions_np=none_np,
        first_positions=none,
        hidden_states=none,
        batch_index_np=none_np,
        layout=plan.layout,
        inputs=plan.inputs,
    )


def draft_proposer(proposer: object) -> DraftModelProposer | None:
    """The runner's draft model proposer, if speculation runs one."""
    return proposer if isinstance(proposer, DraftModelProposer) else None


def draw_drafts(
    logits: torch.Tensor | None,
    sampling: RandomParams | None,
    j: int,
    probabilistic: bool,
    greedy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Draft j + 1 of each request [S] from the draft's logits [S, V] float32 and, when
    probabilistic and some request draws at random, q [S, V] (normalised; greedy requests take
    the argmax, their verification ignores q). greedy: the logits' argmax [S] where known (a
    graph's), returned as the drafts when q is None (logits may then be None)."""
    greedy = logits.argmax(dim=-1) if greedy is None else greedy  # [S]
    if not probabilistic or sampling is None:
        return greedy, None
    temperature = sampling.temperature
    scaled = logits if temperature is None else logits / temperature[:, None]
    q = torch.softmax(scaled, dim=-1)  # [S, V]
    drawn = gumbel_draw(q, draft_noise_keys(sampling.noise_keys, j))
    if sampling.is_greedy is not None:
        drawn = torch.where(sampling.is_greedy, greedy, drawn)
    return drawn, q


def draft_noise_keys(keys: torch.Tensor, j: int) -> torch.Tensor:
    """[S] int64: the noise keys of draft j + 1 from the requests' sampling keys [S] (seed and
    tokens sampled so far), salted apart from the verifier's streams and from each other."""
    return mix64_((keys ^ _DRAFT_SALT) + j)
