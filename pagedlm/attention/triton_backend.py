"""The Triton attention backend: the varlen paged kernel, or for decode-only batches the
flash-decoding split path (small batches with long contexts: every sequence splits; large ones:
the longest sequences split). Every choice is made from host ints."""

from __future__ import annotations

from typing import NamedTuple

import torch

from pagedlm import envs
from pagedlm.attention.backend import AttentionMetadata
from pagedlm.attention.triton_decode import (
    DEFAULT_NUM_SMS,
    choose_num_splits,
    choose_split_seqs,
    split_decode_attention,
)
from pagedlm.attention.triton_paged import varlen_attention
from pagedlm.ops.device_info import num_sms
from pagedlm.ops.warm_up import WarmUpTarget

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256
# read once (decode_split runs at every attention call of an eager step); an A/B script in one
# process may set it between engines, before their CUDA graphs are captured
SPLIT_LARGE_BATCHES = envs.PAGEDLM_SPLIT_LARGE_DECODE


class DecodeSplit(NamedTuple):
    """The split decode's shape for a decode-only batch (triton_decode's choose_* functions)."""

    num_splits: int  # programs per split sequence and KV head; 1: the varlen kernel
    split_seqs: int  # the longest sequences (decode_order) that split; the others take one program

    def kind(self, num_seqs: int) -> tuple[int, bool]:
        """What a CUDA graph of num_seqs rows launches: the split count and whether only the
        longest sequences split (a large batch)."""
        return self.num_splits, self.num_splits > 1 and self.split_seqs < num_seqs


def decode_split(num_seqs: int, kv_cache: torch.Tensor, max_seq_len: int) -> DecodeSplit:
    """The split decode of a decode-only batch of these host ints (a large batch's is (1, num_seqs),
    the varlen kernel, where SPLIT_LARGE_BATCHES is off)."""
    sms = num_sms(kv_cache.device, DEFAULT_NUM_SMS)
    num_kv_heads = kv_cache.shape[3]
    split_seqs = choose_split_seqs(num_seqs, num_kv_heads, sms)
    if split_seqs < num_seqs and not SPLIT_LARGE_BATCHES:
        return DecodeSplit(1, num_seqs)
    return DecodeSplit(choose_num_splits(num_seqs, num_kv_heads, max_seq_len, sms), split_seqs)


def decode_kind(num_seqs: int, kv_cache: torch.Tensor, max_seq_len: int) -> tuple[int, bool]:
    """The attention kernel a decode-only batch of these host ints takes (DecodeSplit.kind)."""
    return decode_split(num_seqs, kv_cache, max_seq_len).kind(num_seqs)


class TritonAttentionBackend:
    def attend(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None,
        out: torch.Tensor | None = None,  # [T, num_heads, head_dim], like q; allocated when None
    ) -> torch.Tensor:  # [T, num_heads, head_dim]; padding rows (past query_start_loc[B]) unwritten
        """Attend over the keys and values in the cache (this step's included)."""
        _check_attention(q, kv_cache, meta, sliding_window)
        if meta.num_seqs == 0:
            return torch.empty_like(q) if out is None else out
        if meta.max_query_len == 1:
            split = decode_split(meta.num_seqs, kv_cache, meta.max_seq_len)
            if split.num_splits > 1:
                return split_decode_attention(
                    q,
                    kv_cache,
                    meta,
                    scale,
                    sliding_window,
                    split.num_splits,
                    out=out,
                    split_seqs=split.split_seqs,
                )
        return varlen_attention(q, kv_cache, meta, scale, sliding_window, out=out)


def _check_attention(
    q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, sliding_window: int | None
) -> None:
    if q.dim() != 3 or q.stride(2) != 1:
        raise ValueError(
            f"q must be [T, num_heads, head_dim] with stride 1 in head_dim; got {tuple(q.shape)}"
        )
    num_heads, num_kv_heads, head_dim = q.shape[1], kv_cache.shape[3], q.shape[2]
    if (
        head_dim & (head_dim - 1) or not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM
    ):  # tl.arange, tl.dot
        raise ValueError(
            f"head_dim must be a power of two in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}] for the "
            f"Triton backend; got {head_dim} (attention_backend='torch' takes any)"
        )
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
        )
    if q.dtype != kv_cache.dtype or q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(
            f"q and kv_cache must share one dtype of {SUPPORTED_DTYPES}; got {q.dtype}, {kv_cache.dtype}"
        )
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be None or >= 1; got {sliding_window}")
    if meta.query_start_loc.shape != (meta.num_seqs + 1,) or meta.seq_lens.shape != (
        meta.num_seqs,
    ):
        raise ValueError(
            f"query_start_loc must be [{meta.num_seqs + 1}] and seq_lens [{meta.num_seqs}]; "
            f"got {tuple(meta.query_start_loc.shape)}, {tuple(meta.seq_lens.shape)}"
        )
    if meta.block_table.dim() != 2 or meta.block_table.shape[0] < meta.num_seqs:
        raise ValueError(
            f"block_table must be [>= {meta.num_seqs}, max_blocks_per_seq]; "
            f"got {tuple(meta.block_table.shape)}"
        )


def warm_up_large_batch_split(target: WarmUpTarget) -> None:
    """ops/warm_up.py: the split decode of a large batch (only its longest sequences split, so its
    programs skip the early tile: a compile of its own), once per kind of the model's
    Triton-attended layers (windowed or not, head count), on its KV cache, over two padding
    sequences (no query: every program waits and exits, writing nothing). A decode graph's capture
    launches it where max_model_len splits; eagerly only a decode of SMs / KV heads sequences or
    more with a context over LARGE_BATCH_SPLIT_KEYS would, while serving."""
    layers = [
        module
        for module in target.model.modules()
        if isinstance(getattr(module, "attn_backend", None), TritonAttentionBackend)
    ]
    if not SPLIT_LARGE_BATCHES or len(layers) != len(target.kv_caches):
        return
    done = set()
    for layer, kv_cache in zip(layers, target.kv_caches):
        kind = (layer.sliding_window is None, layer.num_heads)
        if kind in done:
            continue
        done.add(kind)
        q = torch.zeros(
            2, layer.num_heads, kv_cache.shape[4], dtype=kv_cache.dtype, device=kv_cache.device
        )  # [2, num_heads, head_dim]
        split_decode_attention(
            q,
            kv_cache,
            _padding_decode(kv_cache.device),
            layer.scale,
            layer.sliding_window,
            num_splits=2,
            split_seqs=1,
        )


def _padding_decode(device: torch.device) -> AttentionMetadata:
    """A decode batch of two padding sequences (no query, no keys), with a decode_order as the
    runner's decode batches have."""
    int32 = dict(dtype=torch.int32, device=device)
    starts, lens = torch.zeros(3, dtype=torch.int32), torch.zeros(2, dtype=torch.int32)
    return AttentionMetadata(
        num_tokens=2,
        num_seqs=2,
        max_query_len=1,
        max_seq_len=0,
        query_start_loc=starts.to(device),
        seq_lens=lens.to(device),
        slot_mapping=torch.full((2,), -1, dtype=torch.int64, device=device),
        block_table=torch.zeros(2, 1, **int32),
        query_start_loc_cpu=starts,
        seq_lens_cpu=lens,
        decode_order=torch.arange(2, **int32),
    )
