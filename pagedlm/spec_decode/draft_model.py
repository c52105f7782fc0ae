"""The draft_model proposer: a smaller model of the target's vocabulary drafts k tokens a request.

It owns the draft model and its KV cache, one tensor per draft layer with the target's block
count and block size, addressed with the target's block tables (draft_inputs.py): the pool's
blocks hold both models' KV, so a block costs target + draft bytes (`kv_bytes_per_block`,
counted by worker/memory.py) and the scheduler knows nothing new but k lookahead slots.

After the target's step is verified, `propose` runs the draft's first forward over the step's
inputs and each sampling request's next token, then k - 1 single-token steps, all on the device
with fixed shapes (no host sync). Drafts are the argmax (`draft_sample_method` greedy, or a greedy
request), or draws from q = softmax(draft logits / the request's temperature) (probabilistic,
random requests): the rejection sampler then needs q at each draft (`DraftProposal.probs`).
The draws use the sampler's counter-based noise (sample/noise.py) under a salt of their own,
so a seeded request drafts the same in any batch and its drafts are independent of the
verifier's accept test and residual draw."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedlm.attention.backend import get_attention_backend
from pagedlm.config import EngineConfig, ModelConfig
from pagedlm.model.llama import LlamaForCausalLM
from pagedlm.model.loader import load_model
from pagedlm.sample.gumbel import gumbel_draw
from pagedlm.sample.noise import mix64_, to_int64
from pagedlm.sample.sampler import RandomParams
from pagedlm.spec_decode.draft_inputs import (
    DraftBatch,
    DraftStep,
    first_forward_inputs,
    single_step_inputs,
    single_steps,
)
from pagedlm.worker.memory import kv_cache_bytes_per_block

_DRAFT_SALT = to_int64(0x5D2A_F7C1_93E4_6B08)  # the drafts' noise, apart from the verifier's


@dataclass(slots=True)
class DraftProposal:
    token_ids: torch.Tensor  # [S, k] int64: each sampling request's drafts
    # [S * k, V] float32, normalised, request-major (the rejection sampler's draft_probs rows):
    # q at each draft; None when every draft is an argmax (q one-hot)
    probs: torch.Tensor | None = None


class DraftModelRunner:
    """The draft model, its KV cache and the proposal loop of one worker."""

    def __init__(self, config: EngineConfig) -> None:
        if config.draft_model is None or config.speculative is None:
            raise ValueError("DraftModelRunner needs speculative_config method draft_model")
        self.config: ModelConfig = config.draft_model
        self.device = config.device
        self.block_size = config.cache.block_size
        self.num_spec_tokens = config.speculative.num_speculative_tokens
        self.probabilistic = config.speculative.draft_sample_method == "probabilistic"
        self.max_model_len = config.model.max_model_len
        self.attention_backend = config.attention_backend
        self.model: LlamaForCausalLM | None = None
        self.kv_caches: list[torch.Tensor] = []  # per draft layer [2, blocks, B, Hkv, D]

    def kv_bytes_per_block(self) -> int:
        return kv_cache_bytes_per_block(self.config, self.block_size)

    def load_model(self) -> None:
        backend = get_attention_backend(self.attention_backend, self.device)
        self.model = load_model(self.config, backend, self.device)

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """Beside the target's cache of num_blocks blocks (the same block ids)."""
        config = self.config
        shape = (2, num_blocks, self.block_size, config.num_kv_heads, config.head_dim)
        self.kv_caches = [
            torch.zeros(shape, dtype=config.dtype, device=self.device)
            for _ in range(config.num_layers)
        ]

    def propose(self, step: DraftStep, sampling: RandomParams | None) -> DraftProposal:
        """k drafts for each of the step's S sampling requests (none: an empty proposal).
        sampling: the S requests' random parameters as the sampler builds them
        (SamplingState.make_batch(rows).random; None: every request greedy)."""
        k, num_samples = self.num_spec_tokens, step.sample_seqs_np.shape[0]
        first = first_forward_inputs(step, self.block_size, k, self.max_model_len)
        if num_samples == 0:
            self._forward(first)  # prefill chunks: the draft's KV of their tokens
            return DraftProposal(step.input_ids.new_empty((0, k)))
        drafts, probs = [], []
        batch = first
        shared = single_steps(step, first)
        for j in range(k):
            if j > 0:
                batch = single_step_inputs(
                    shared, drafts[-1], j, self.block_size, self.max_model_len
                )
            logits = self._logits(batch)  # [S, V]
            token_ids, q = draw_drafts(logits, sampling, j, self.probabilistic)
            drafts.append(token_ids)
            probs.append(q)
        token_ids = torch.stack(drafts, dim=1)  # [S, k]
        if probs[0] is None:
            return DraftProposal(token_ids)
        return DraftProposal(token_ids, torch.stack(probs, dim=1).view(num_samples * k, -1))

    def _forward(self, batch: DraftBatch) -> torch.Tensor:
        """[N, hidden_size]: the draft over one batch, its KV written at batch's slots."""
        return self.model(batch.input_ids, batch.positions, self.kv_caches, batch.meta)

    def _logits(self, batch: DraftBatch) -> torch.Tensor:
        """[S, V] float32 at the batch's draft rows."""
        hidden = self._forward(batch)
        return self.model.compute_logits(hidden.index_select(0, batch.logits_rows))


def draw_drafts(
    logits: torch.Tensor, sampling: RandomParams | None, j: int, probabilistic: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Draft j + 1 of each request [S] from the draft's logits [S, V] float32 and, when
    probabilistic and some request draws at random, q [S, V] (normalised; greedy requests take
    the argmax, their verification ignores q)."""
    greedy = logits.argmax(dim=-1)  # [S]
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
