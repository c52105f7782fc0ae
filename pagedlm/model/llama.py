"""One model for the Llama family: Llama 2/3, Mistral, Qwen2 (qkv bias), Qwen3 (q/k norm),
SmolLM2 (tied embeddings). Inputs are one ragged batch of tokens; attention goes through
the paged KV cache of an AttentionBackend.

Parameter names follow Hugging Face, except the fused projections: q/k/v live in
`qkv_proj` (rows q, then k, then v) and gate/up in `gate_up_proj` (rows gate, then up).
`checkpoint_layout` says where each checkpoint tensor goes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pagedlm import envs
from pagedlm.attention.backend import AttentionBackend, AttentionMetadata
from pagedlm.attention.prepare_qkv import prepare_qkv
from pagedlm.config import ModelConfig
from pagedlm.core.kv_groups import engine_kv_groups
from pagedlm.distributed import collectives
from pagedlm.distributed.parallel_state import TPGroup, get_tp_group
from pagedlm.distributed.sharding import vocab_shard_rows
from pagedlm.model import layers
from pagedlm.model.gguf_loader import gguf_rope_freqs
from pagedlm.model.layers import Embedding, Linear, RMSNorm, RotaryEmbedding
from pagedlm.model.parallel_layers import RowParallelLinear, VocabParallelEmbedding
from pagedlm.ops import gemv
from pagedlm.ops.gemv import PendingNorm, ResidualSum


@dataclass(frozen=True)
class WeightShard:
    """A checkpoint tensor fills rows [row_start, row_start + num_rows) of a parameter."""

    param: str
    row_start: int
    num_rows: int


def layer_sliding_window(config: ModelConfig, layer: int) -> int | None:
    """Mistral: every layer; Qwen2/3: the layers `layer_types` marks as sliding."""
    layer_types = getattr(config.hf_config, "layer_types", None)
    if config.sliding_window is None or not layer_types:
        return config.sliding_window
    return config.sliding_window if layer_types[layer] == "sliding_attention" else None


def model_kv_groups(config: ModelConfig) -> list[tuple[int | None, list[int]]]:
    """(window, layers) of each KV cache group the engine runs for the model (core/kv_groups.py;
    one group unless full and sliding layers mix and PAGEDLM_FREE_SLIDING_WINDOW is on)."""
    windows = [layer_sliding_window(config, i) for i in range(config.num_layers)]
    return engine_kv_groups(windows, envs.PAGEDLM_FREE_SLIDING_WINDOW)


def o_proj_bias(config: ModelConfig) -> bool:
    """Llama and Qwen3 put `attention_bias` on o_proj too; Qwen2 and Mistral never do."""
    if config.architecture in ("Qwen2ForCausalLM", "MistralForCausalLM"):
        return False
    return bool(getattr(config.hf_config, "attention_bias", False))


def row_linear(
    in_features: int, out_features: int, bias: bool, dtype: torch.dtype, group: TPGroup
) -> Linear:
    """o_proj and down_proj: all-reduced over the ranks at tp > 1."""
    if group.size == 1:
        return Linear(in_features, out_features, bias, dtype)
    return RowParallelLinear(in_features, out_features, bias, dtype, group)


class LlamaAttention(nn.Module):
    """config: this rank's shapes (sharding.local_model_config): its query and KV heads."""

    def __init__(
        self,
        config: ModelConfig,
        layer: int,
        attn_backend: AttentionBackend,
        rotary: RotaryEmbedding,
    ) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self.scale = config.head_dim**-0.5
        self.sliding_window = layer_sliding_window(config, layer)
        self.kv_group = 0  # its KV cache group (LlamaModel sets it)
        self.attn_backend = attn_backend
        self.rotary = rotary
        dtype = config.dtype
        self.qkv_proj = Linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, config.attention_bias, dtype
        )
        self.o_proj = row_linear(
            self.q_size, config.hidden_size, o_proj_bias(config), dtype, get_tp_group()
        )
        # Qwen3: per-head RMSNorm of q and k before RoPE; only their weights are used (prepare_qkv)
        self.q_norm = (
            RMSNorm(config.head_dim, config.rms_norm_eps, dtype) if config.qk_norm else None
        )
        self.k_norm = (
            RMSNorm(config.head_dim, config.rms_norm_eps, dtype) if config.qk_norm else None
        )

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor | PendingNorm,
        residual: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor | ResidualSum:
        """o_proj's output, or its ResidualSum with residual (layers.Linear)."""
        if self.kv_group and attn_metadata.groups:  # its group's slots and block table
            attn_metadata = attn_metadata.groups[self.kv_group - 1]
        qkv = self.qkv_proj(hidden)  # [T, q_size + 2 * kv_size]
        qk_norm, eps = (
            (None, 0.0)
            if self.q_norm is None
            else ((self.q_norm.weight, self.k_norm.weight), self.q_norm.eps)
        )
        q = prepare_qkv(
            qkv,
            positions,
            self.rotary.cos_sin_cache,
            qk_norm,
            eps,
            kv_cache,
            attn_metadata.slot_mapping,
            self.num_heads,
        )  # [T, num_heads, head_dim]; k, v cached
        out = self.attn_backend.attend(q, kv_cache, attn_metadata, self.scale, self.sliding_window)
        return self.o_proj(out.reshape(qkv.shape[0], self.q_size), residual=residual)


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        bias = bool(getattr(config.hf_config, "mlp_bias", False))
        self.gate_up_proj = Linear(
            config.hidden_size, 2 * config.intermediate_size, bias, config.dtype
        )
        self.down_proj = row_linear(
            config.intermediate_size, config.hidden_size, bias, config.dtype, get_tp_group()
        )

    def forward(
        self, hidden: torch.Tensor | PendingNorm, residual: torch.Tensor
    ) -> torch.Tensor | ResidualSum:
        """down_proj's output, or its ResidualSum with residual (layers.Linear)."""
        gated = self.gate_up_proj.gated(
            hidden
        )  # fused with the activation, for prefill-sized batches
        if gated is not None:
            return self.down_proj(gated, residual=residual)
        return self.down_proj(self.gate_up_proj(hidden), act="silu_and_mul", residual=residual)


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        layer: int,
        attn_backend: AttentionBackend,
        rotary: RotaryEmbedding,
    ) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, layer, attn_backend, rotary)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.dtype)
        self.post_attention_layernorm = RMSNorm(
            config.hidden_size, config.rms_norm_eps, config.dtype
        )

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor | ResidualSum,
        residual: torch.Tensor | None,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor | ResidualSum, torch.Tensor]:
        """Returns (this layer's MLP output, the residual stream before it); the next norm adds them,
        unless down_proj already did (a ResidualSum: the norm is then folded into the next GEMV)."""
        normed, residual = self.input_layernorm(hidden, residual)
        attn_out = self.self_attn(positions, normed, residual, kv_cache, attn_metadata)
        normed, residual = self.post_attention_layernorm(attn_out, residual)
        return self.mlp(normed, residual), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, attn_backend: AttentionBackend) -> None:
        super().__init__()
        group = get_tp_group()
        self.embed_tokens = (
            Embedding(config.vocab_size, config.hidden_size, config.dtype)
            if group.size == 1
            else VocabParallelEmbedding(
                vocab_shard_rows(config.vocab_size, group.size),
                config.hidden_size,
                config.dtype,
                group,
            )
        )
        # a GGUF's RoPE factors, kept so that a reload can check it brings the same ones
        self.rope_freq_factors = gguf_rope_freqs(config)  # [head_dim // 2] float32 or None
        # one cos/sin table shared by every layer; not a parameter, so not in the layout
        rotary = RotaryEmbedding(
            config.head_dim,
            config.max_model_len,
            config.rope_theta,
            config.rope_scaling,
            config.dtype,
            self.rope_freq_factors,
        )
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, layer, attn_backend, rotary)
            for layer in range(config.num_layers)
        )
        for group, (_, layer_ids) in enumerate(model_kv_groups(config)):
            for layer in layer_ids:
                self.layers[layer].self_attn.kv_group = group
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.dtype)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer(positions, hidden, residual, kv_cache, attn_metadata)
        normed, _ = self.norm(hidden, residual)
        normed = normed.materialize() if isinstance(normed, PendingNorm) else normed
        # in the model's dtype even when a CPU quantized prefill ran in float32 (quant_linear.py)
        return normed.to(self.norm.weight.dtype)  # [T, hidden_size]


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, attn_backend: AttentionBackend) -> None:
        super().__init__()
        self.config = config
        self.tp_group = get_tp_group()
        self.model = LlamaModel(config, attn_backend)
        # at tp > 1 each rank holds a vocabulary shard of the head (padding rows zero)
        self.vocab_rows = self.model.embed_tokens.weight.shape[0]
        if not config.tie_word_embeddings:
            self.lm_head = Linear(config.hidden_size, self.vocab_rows, False, config.dtype)
            if self.tp_group.size > 1:
                nn.init.zeros_(self.lm_head.weight)
        kv_rows = config.num_kv_heads * config.head_dim
        self._fused_splits = {
            "qkv_proj": (
                ("q_proj", config.num_heads * config.head_dim),
                ("k_proj", kv_rows),
                ("v_proj", kv_rows),
            ),
            "gate_up_proj": (
                ("gate_proj", config.intermediate_size),
                ("up_proj", config.intermediate_size),
            ),
        }

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)  # [T, hidden_size]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata: AttentionMetadata,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        return self.model(positions, hidden, kv_caches, attn_metadata)  # [T, hidden_size]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden_size] -> logits [N, vocab_size] float32 (at tp > 1 all-gathered from
        the ranks' shards; the sampler takes compute_local_logits and its own collectives)."""
        logits = self.compute_local_logits(hidden)
        if self.tp_group.size == 1:
            return logits
        gathered = collectives.all_gather_last_dim(logits, self.tp_group)
        return gathered[:, : self.config.vocab_size]

    def compute_local_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden_size] -> this rank's logits [N, vocab_rows] float32 (at tp = 1 the
        model's [N, vocab_size]). On CUDA in 16-bit the GEMM writes
        float32 itself (cuBLAS epilogue): no 16-bit logits rounded and then copied (at 256 x 151936,
        that copy alone was 0.11 ms a step); at batch 1 the Triton GEMV writes them (4.4-4.5 TB/s
        against cuBLAS's 4.0-4.2 on both LM heads, gemv_bench.py)."""
        head = self.model.embed_tokens if self.config.tie_word_embeddings else self.lm_head
        if head.quant is not None:
            return head.quant(hidden).float()
        weight = head.weight
        if layers.takes_gemv(hidden, weight):
            return gemv.gemv(hidden, weight, out_dtype=torch.float32)
        if hidden.is_cuda and hidden.dtype != torch.float32:
            return torch.mm(hidden, weight.t(), out_dtype=torch.float32)
        return F.linear(hidden, weight).float()

    def checkpoint_layout(self) -> dict[str, WeightShard]:
        """Hugging Face tensor name -> where it goes. Every entry must be filled by a loader."""
        layout: dict[str, WeightShard] = {}
        for name, param in self.named_parameters():
            module, _, leaf = name.rpartition(
                "."
            )  # e.g. "model.layers.0.mlp.gate_up_proj", "weight"
            parent, _, kind = module.rpartition(".")
            if kind not in self._fused_splits:
                layout[name] = WeightShard(name, 0, param.shape[0])
                continue
            row_start = 0
            for part, num_rows in self._fused_splits[kind]:
                layout[f"{parent}.{part}.{leaf}"] = WeightShard(name, row_start, num_rows)
                row_start += num_rows
        return layout
