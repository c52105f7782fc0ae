"""prepare_qkv fused into the flash-decoding kernel (prepare_and_split_decode, the backends'
prepare_and_attend) against prepare_qkv_torch followed by the float64 reference attention, under
TRITON_INTERPRET=1 on CPU.

Caches are NaN except the sequences' earlier keys, and the slot of this step's key is NaN until the
call writes it, so a read of this step's key from the cache (instead of from the qkv row), a write
to any other slot, or a missed write shows up; outputs and the workspace are NaN-poisoned
(conftest's nan_workspace). Each case's contexts end on a key tile and block boundary
(64), one key past it (65: a split that holds only this step's key), inside a block, or at 1 key.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from pagedlm.attention.prepare_qkv import prepare_qkv, prepare_qkv_torch
from pagedlm.attention.torch_batched import TorchBatchedAttentionBackend
from pagedlm.attention.torch_ref import TorchAttentionBackend, gather_kv
from pagedlm.attention.triton_backend import TritonAttentionBackend
from pagedlm.attention.triton_decode import MAX_SPLITS, prepare_and_split_decode, split_decode_attention
from pagedlm.model.layers import RotaryEmbedding
from pagedlm.ops.counters import zeroed_counters
from test_triton_paged import DEVICE, PagedBatch, check_output, make_batch

pytestmark = pytest.mark.usefixtures("nan_workspace")  # conftest.py: torch.empty gives NaN

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=2e-3, rtol=2e-3)}
MAX_POSITION = 4096  # above every position a case reaches

# (ctx_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size, sliding_window, dtype, num_splits,
#  qk_norm); a query_len of 0 is a padding sequence (no query row; seq_len 0 or cached keys only)
CASES = {
    "gqa1_d64_bs16_norm": ([63, 0, 36, 300], [1, 1, 1, 0], 2, 2, 64, 16, None, torch.float32, 4, True),
    "gqa2_d128_bs32_window": ([299, 64, 0], [1, 1, 0], 4, 2, 128, 32, 150, torch.float16, 2, False),
    "gqa4_d64_bs32_norm_32splits": ([127, 31, 0], [1, 1, 0], 8, 2, 64, 32, None, torch.float16, 32, True),
    "gqa8_d128_bs16_window": ([200, 4, 15], [1, 1, 1], 8, 1, 128, 16, 40, torch.float32, 3, True),
    "gqa2_d64_bs16_one_split": ([150, 0], [1, 1], 4, 2, 64, 16, None, torch.float16, 1, False),
}


@dataclasses.dataclass
class PrepareInputs:
    qkv: torch.Tensor  # [T, (num_heads + 2 * num_kv_heads) * head_dim]
    positions: torch.Tensor  # [T]
    cos_sin_cache: torch.Tensor  # [MAX_POSITION, head_dim]
    qk_norm: tuple[torch.Tensor, torch.Tensor] | None
    eps: float = 1e-6

    def args(self) -> tuple:
        return self.qkv, self.positions, self.cos_sin_cache, self.qk_norm, self.eps


def make_inputs(batch: PagedBatch, num_heads: int, qk_norm: bool) -> PrepareInputs:
    """Fresh random qkv rows; a query row's position is its place in its sequence, a padding row's random."""
    num_tokens, num_kv_heads, head_dim = batch.k.shape
    dtype, meta = batch.kv_cache.dtype, batch.meta
    positions = torch.randint(MAX_POSITION, (num_tokens,))
    starts, seq_lens = meta.query_start_loc_cpu.tolist(), meta.seq_lens_cpu.tolist()
    for b, seq_len in enumerate(seq_lens):
        query_len = starts[b + 1] - starts[b]
        positions[starts[b]:starts[b + 1]] = torch.arange(seq_len - query_len, seq_len)
    weights = tuple((torch.rand(head_dim) + 0.5).to(dtype).to(DEVICE) for _ in range(2))
    return PrepareInputs(
        qkv=(torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim) * 3).to(dtype).to(DEVICE),
        positions=positions.to(DEVICE),
        cos_sin_cache=RotaryEmbedding(head_dim, MAX_POSITION, 10000.0, None, torch.float32).cos_sin_cache.to(DEVICE),
        qk_norm=weights if qk_norm else None,
    )


def prepared_reference(batch: PagedBatch, inputs: PrepareInputs, num_heads: int) -> PagedBatch:
    """The batch as prepare_qkv_torch leaves it: its q, its cache, every sequence's keys read back."""
    kv_cache = batch.kv_cache.clone()
    q = prepare_qkv_torch(*inputs.args(), kv_cache, batch.meta.slot_mapping, num_heads)
    block_size, meta = kv_cache.shape[2], batch.meta
    keys, values = [], []
    for b, seq_len in enumerate(meta.seq_lens_cpu.tolist()):
        k, v = gather_kv(kv_cache, meta.block_table[b, :-(-seq_len // block_size)].long(), seq_len)
        keys.append(k)
        values.append(v)
    return dataclasses.replace(batch, q=q, kv_cache=kv_cache, keys=keys, values=values)


def check_cache(kv_cache: torch.Tensor, ref: PagedBatch) -> None:
    """This step's k and v as prepare_qkv_torch writes them; every other slot exactly as it was."""
    num_kv_heads, head_dim = kv_cache.shape[3:]
    slots = ref.meta.slot_mapping[ref.meta.slot_mapping >= 0]
    flat, flat_ref = kv_cache.view(2, -1, num_kv_heads, head_dim), ref.kv_cache.view(2, -1, num_kv_heads, head_dim)
    assert slots.numel() > 0 and flat_ref[:, slots].isfinite().all()
    torch.testing.assert_close(flat[:, slots], flat_ref[:, slots], **TOL[kv_cache.dtype])
    untouched = torch.ones(flat.shape[1], dtype=torch.bool, device=kv_cache.device)
    untouched[slots] = False
    torch.testing.assert_close(flat[:, untouched], flat_ref[:, untouched], rtol=0, atol=0, equal_nan=True)


def case_batch(name: str) -> tuple[PagedBatch, PrepareInputs, PagedBatch, int, int | None, int]:
    """(batch, inputs, reference, num_heads, window, num_splits): a fresh random case."""
    ctx_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size, window, dtype, num_splits, qk_norm = \
        CASES[name]
    batch = make_batch(ctx_lens, query_lens, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                       block_size=block_size, dtype=dtype, num_pad_tokens=1)
    inputs = make_inputs(batch, num_heads, qk_norm)
    return batch, inputs, prepared_reference(batch, inputs, num_heads), num_heads, window, num_splits


@pytest.mark.parametrize("case", list(CASES))
def test_prepare_and_split_decode(case: str) -> None:
    batch, inputs, ref, num_heads, window, num_splits = case_batch(case)
    scale = 0.3
    out = prepare_and_split_decode(*inputs.args(), batch.kv_cache, batch.meta, num_heads, scale, window, num_splits)
    assert out.shape == ref.q.shape and out.dtype == ref.q.dtype
    check_output(out, ref, scale, window)
    check_cache(batch.kv_cache, ref)
    assert not zeroed_counters(batch.q.device, 0).any(), "every counter must be reset to 0"


def test_workspace_is_poisoned() -> None:
    assert torch.empty(4).isnan().all() and torch.empty_like(torch.zeros(2)).isnan().all()


def test_cases_cover_the_edges() -> None:
    """Contexts at a tile/block boundary, one key past one (split of this step's key alone), inside
    a block, of 1 key; padding sequences; windows that cut keys; empty splits; multi-tile splits."""
    seq_lens = {c + n for ctx, queries, *_ in CASES.values() for c, n in zip(ctx, queries) if n}
    assert {1, 64, 65, 37, 128} <= seq_lens
    assert any(0 in queries for _, queries, *_ in CASES.values())
    for ctx_lens, query_lens, *_, window, _dtype, num_splits, _norm in CASES.values():
        assert window is None or max(c + n for c, n in zip(ctx_lens, query_lens)) > window
    assert any(case[8] * 64 > max(case[0]) for case in CASES.values())  # splits with no keys
    assert any(case[0][0] > case[8] * 64 for case in CASES.values())  # a split of several tiles


@pytest.mark.parametrize("max_query_len", [1, 3])
def test_backends_prepare_and_attend(monkeypatch: pytest.MonkeyPatch, max_query_len: int) -> None:
    """Triton fuses exactly where attend would split; every backend leaves the same output and cache."""
    import pagedlm.attention.triton_backend as triton_backend

    calls = []
    monkeypatch.setattr(triton_backend, "prepare_and_split_decode",
                        lambda *args: calls.append(args[-1]) or prepare_and_split_decode(*args))
    batch = make_batch([300, 20], [1, max_query_len], num_heads=4, num_kv_heads=2, head_dim=32, block_size=16,
                       dtype=torch.float32, num_pad_tokens=1)
    inputs = make_inputs(batch, 4, qk_norm=True)
    ref = prepared_reference(batch, inputs, 4)
    outs = []
    for backend in (TritonAttentionBackend(), TorchAttentionBackend(), TorchBatchedAttentionBackend()):
        kv_cache = batch.kv_cache.clone()
        outs.append(backend.prepare_and_attend(*inputs.args(), kv_cache, batch.meta, 4, 0.2, None))
        check_cache(kv_cache, ref)
    assert calls == ([2] if max_query_len == 1 else [])
    check_output(outs[0], ref, 0.2, None)
    num_real = batch.meta.query_start_loc_cpu[-1].item()
    for out in outs[1:]:
        torch.testing.assert_close(out[:num_real], outs[0][:num_real], atol=1e-4, rtol=1e-3)


def test_rejects_bad_input() -> None:
    batch, inputs, _, num_heads, window, _ = case_batch("gqa1_d64_bs16_norm")
    args = inputs.args()
    with pytest.raises(ValueError, match="qkv must be"):
        prepare_and_split_decode(args[0][:, :-64], *args[1:], batch.kv_cache, batch.meta, num_heads, 0.1, None, 2)
    with pytest.raises(ValueError, match="num_splits"):
        prepare_and_split_decode(*args, batch.kv_cache, batch.meta, num_heads, 0.1, None, MAX_SPLITS + 1)
    prefill = dataclasses.replace(batch.meta, max_query_len=2)
    with pytest.raises(ValueError, match="max_query_len"):
        prepare_and_split_decode(*args, batch.kv_cache, prefill, num_heads, 0.1, None, 2)
    odd = make_batch([5], [1], num_heads=2, num_kv_heads=1, head_dim=24, block_size=16, dtype=torch.float32)
    with pytest.raises(ValueError, match="power of two"):
        prepare_and_split_decode(*make_inputs(odd, 2, False).args(), odd.kv_cache, odd.meta, 2, 0.1, None, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("ctx_len", [63, 64, 639, 3000])  # 3000: splits of two key tiles
def test_matches_unfused_on_gpu_bf16(ctx_len: int) -> None:
    """Qwen3-0.6B's attention shape in bf16, compiled, with PDL where the GPU has it: the fused
    launch against prepare_qkv then split_decode_attention (the two launches it replaces)."""
    batch = make_batch([ctx_len], [1], num_heads=16, num_kv_heads=8, head_dim=128, block_size=16,
                       dtype=torch.bfloat16, num_pad_tokens=1)
    inputs = make_inputs(batch, 16, qk_norm=True)
    kv_cache = batch.kv_cache.clone()
    q = prepare_qkv(*inputs.args(), kv_cache, batch.meta.slot_mapping, 16)
    want = split_decode_attention(q, kv_cache, batch.meta, 128**-0.5, None, MAX_SPLITS)
    out = prepare_and_split_decode(*inputs.args(), batch.kv_cache, batch.meta, 16, 128**-0.5, None, MAX_SPLITS)
    torch.testing.assert_close(out[:1], want[:1], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(batch.kv_cache, kv_cache, atol=1e-2, rtol=1e-2, equal_nan=True)
