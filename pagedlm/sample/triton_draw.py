"""The two-stage Gumbel-max draw of gumbel.py, fused into two Triton kernels: one read of the logits.

For rows without min-p, top-k or top-p the torch path turns the logits into exp((l - max) / T) in
place (three passes over [N, V]), then sums blocks, gathers and draws. Here:
- kernel 1, one program per (row, tile of blocks): with m_b the block's max logit (0 for a block
  of banned ids), logmass_b = m_b / T + log(sum_b exp((l - m_b) / T)), the log of the torch path's
  block mass plus the per-row constant max / T, which changes no argmax. It is summed in float64
  and kept as two float32 [N, num_blocks] buffers, its rounding and the rounding error.
- kernel 2, one program per row: the block = argmax_b (logmass_b - max logmass + G_b), then the
  id = argmax over that block's ids v < V of (l_v - max of the block) / T + G'_(v - block * B).
  Ties go to the first index, as torch.argmax.
Logits are divided by T only once a nearby max is off: l / T itself (l = 50, T = 3e-5: 1.7e6, in
float32 steps of 0.125; 1.0 at 8e6) would round near-tied logits together or apart, skewing their
odds by up to e^0.25 and more. A row spans several kernel-1 programs, so its max is not known
there: the float64 sum and the residual keep m_b / T exact enough for kernel 2 to subtract the
row's max logmass (exact between values within a factor 2) before the residual is added.
Blocks (B = gumbel.block_size_for(V)) and noise are gumbel.py's and noise.py's: G = entries
[0, num_blocks) and G' = entries [num_blocks, num_blocks + B) of the key's noise row, splitmix64
here on uint64 (wrapping multiply, logical shifts). On the same logits and keys both paths draw
the same ids, except where float rounding flips a near-tie.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedlm.sample.gumbel import block_size_for
from pagedlm.sample.noise import GOLDEN, MIX1, MIX2, UNIFORM_BITS

GOLDEN_U64: tl.constexpr = tl.constexpr(GOLDEN)
MIX1_U64: tl.constexpr = tl.constexpr(MIX1)
MIX2_U64: tl.constexpr = tl.constexpr(MIX2)
NOISE_SHIFT: tl.constexpr = tl.constexpr(64 - UNIFORM_BITS)
UNIFORM_SCALE: tl.constexpr = tl.constexpr(2.0**-UNIFORM_BITS)
TILE_ELEMENTS = 4096  # logits one kernel-1 program reads (at most; at least one block)
NUM_WARPS_BLOCKS = 8  # kernel 1: a full tile is 16 logits per thread
NUM_WARPS_PICK = 4


@triton.jit
def mix64(x):
    """splitmix64's output function on uint64 (multiplies wrap, shifts are logical)."""
    x = x ^ (x >> 30)
    x = x * MIX1_U64
    x = x ^ (x >> 27)
    x = x * MIX2_U64
    return x ^ (x >> 31)


@triton.jit
def noise_hash(key, index):
    """key: int64 scalar, index [...] int >= 0 -> [...] uint64: noise.py's hash of element
    (key, index), splitmix64 at state key + (index + 1) * GOLDEN."""
    state = key.to(tl.uint64, bitcast=True) + (index + 1).to(tl.uint64) * GOLDEN_U64
    return mix64(state)


@triton.jit
def gumbel_noise_at(key, index):
    """[...] float32: noise.gumbel_noise(key, width)[index], finite."""
    bits = (noise_hash(key, index) >> NOISE_SHIFT).to(tl.int32)  # the top UNIFORM_BITS bits
    uniform = (bits.to(tl.float32) + 0.5) * UNIFORM_SCALE  # in (0, 1), exact
    return -tl.log(-tl.log(uniform))


@triton.jit(do_not_specialize_on_alignment=["temperature_ptr"])  # a column of the sampling table
def block_logmass_kernel(
    logmass_ptr,  # [N, num_blocks] fp32 out: the block log-masses, rounded
    residual_ptr,  # [N, num_blocks] fp32 out: the exact log-mass minus logmass (finite)
    logits_ptr,  # [N, V] fp32, stride 1 along V
    temperature_ptr,  # [N] fp32 (read only if HAS_TEMPERATURE)
    vocab_size,
    num_blocks,
    stride_logits,
    stride_logmass,
    stride_temperature,
    BLOCK_SIZE: tl.constexpr,
    BLOCKS_PER_PROGRAM: tl.constexpr,
    HAS_TEMPERATURE: tl.constexpr,
):
    """One program: BLOCKS_PER_PROGRAM consecutive blocks of one row."""
    row = tl.program_id(0).to(tl.int64)
    blocks = tl.program_id(1) * BLOCKS_PER_PROGRAM + tl.arange(0, BLOCKS_PER_PROGRAM)  # [P]
    ids = blocks[:, None] * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)[None, :]  # [P, B]
    logits = tl.load(
        logits_ptr + row * stride_logits + ids, mask=ids < vocab_size, other=float("-inf")
    )  # [P, B]
    block_max = tl.max(logits, axis=1)  # [P]
    block_max = tl.where(block_max == float("-inf"), 0.0, block_max)  # all banned: log(0) = -inf
    x = logits - block_max[:, None]  # [P, B] <= 0
    scaled_max = block_max.to(tl.float64)  # [P]
    if HAS_TEMPERATURE:
        temperature = tl.load(temperature_ptr + row * stride_temperature)
        x = x / temperature
        scaled_max = scaled_max / temperature.to(tl.float64)
    log_sum = tl.log(tl.sum(tl.exp(x), axis=1))  # [P] in [0, log B], or -inf
    banned = log_sum == float("-inf")  # [P]
    logmass = scaled_max + tl.where(banned, 0.0, log_sum).to(tl.float64)  # [P] fp64, finite
    rounded = logmass.to(tl.float32)
    residual = (logmass - rounded.to(tl.float64)).to(tl.float32)  # [P]
    offsets = row * stride_logmass + blocks
    tl.store(
        logmass_ptr + offsets, tl.where(banned, float("-inf"), rounded), mask=blocks < num_blocks
    )
    tl.store(residual_ptr + offsets, residual, mask=blocks < num_blocks)


# keys: a row of a packed upload, only 8-byte aligned when the batch has an odd number of rows;
# read once per row, like the temperature: no alignment specialisation (one compile for both)
@triton.jit(do_not_specialize_on_alignment=["temperature_ptr", "keys_ptr"])
def pick_kernel(
    ids_ptr,  # [N] int64 out
    logmass_ptr,  # [N, num_blocks] fp32, from block_logmass_kernel
    residual_ptr,  # [N, num_blocks] fp32, from block_logmass_kernel
    logits_ptr,  # [N, V] fp32, stride 1 along V
    temperature_ptr,  # [N] fp32 (read only if HAS_TEMPERATURE)
    keys_ptr,  # [N] int64
    vocab_size,
    num_blocks,
    stride_logits,
    stride_logmass,
    stride_temperature,
    stride_keys,
    BLOCK_SIZE: tl.constexpr,
    NUM_BLOCKS_P2: tl.constexpr,
    HAS_TEMPERATURE: tl.constexpr,
):
    """One program per row: stage 1 picks a block, stage 2 an id inside it."""
    row = tl.program_id(0).to(tl.int64)
    key = tl.load(keys_ptr + row * stride_keys)
    blocks = tl.arange(0, NUM_BLOCKS_P2)  # [NB2], NB2 = NUM_BLOCKS_P2
    offsets = row * stride_logmass + blocks
    logmass = tl.load(logmass_ptr + offsets, mask=blocks < num_blocks, other=float("-inf"))  # [NB2]
    residual = tl.load(residual_ptr + offsets, mask=blocks < num_blocks, other=0.0)  # [NB2]
    # exact near the top: logmass values within a factor 2 of their max subtract without rounding
    block_scores = _minus_max(logmass) + residual + gumbel_noise_at(key, blocks)
    block = tl.argmax(block_scores, axis=0)

    members = tl.arange(0, BLOCK_SIZE)
    ids = block * BLOCK_SIZE + members  # [B]
    logits = tl.load(
        logits_ptr + row * stride_logits + ids, mask=ids < vocab_size, other=float("-inf")
    )
    x = _minus_max(logits)  # [B] <= 0: divided by T only now
    if HAS_TEMPERATURE:
        x = x / tl.load(temperature_ptr + row * stride_temperature)
    scores = x + gumbel_noise_at(key, num_blocks + members)
    tl.store(ids_ptr + row, (block * BLOCK_SIZE + tl.argmax(scores, axis=0)).to(tl.int64))


@triton.jit
def _minus_max(x):
    """x [n] - max(x), a per-row constant that keeps float32 precision near the top; x itself if
    every entry is -inf."""
    top = tl.max(x, axis=0)
    return x - tl.where(top == float("-inf"), 0.0, top)


def fused_gumbel_draw(
    logits: torch.Tensor, temperature: torch.Tensor | None, keys: torch.Tensor
) -> torch.Tensor:
    """logits [N, V] float32 (-inf: banned; read only), temperature [N] float32 > 0 or None (1),
    keys [N] int64 (noise.row_keys_np) -> sampled ids [N] int64, drawn from softmax(logits / T)."""
    _check_inputs(logits, temperature, keys)
    num_rows, vocab_size = logits.shape
    num_blocks = triton.cdiv(vocab_size, block_size_for(vocab_size))
    logmass = torch.empty(num_rows, num_blocks, dtype=torch.float32, device=logits.device)
    ids = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    launch_draw(logits, temperature, keys, logmass, ids)
    return ids


def launch_draw(
    logits: torch.Tensor,
    temperature: torch.Tensor | None,
    keys: torch.Tensor,
    logmass: torch.Tensor,
    ids: torch.Tensor,
) -> None:
    """The two kernels on checked inputs, writing every entry of logmass [N, num_blocks] float32
    (stride 1 along blocks; the rounding error goes to a scratch buffer) and ids [N] int64 (stride 1)."""
    num_rows, vocab_size = logits.shape
    if num_rows == 0:
        return
    residual = torch.empty_strided(
        logmass.shape, logmass.stride(), dtype=torch.float32, device=logmass.device
    )  # [N, num_blocks], logmass's strides
    block_size = block_size_for(vocab_size)
    num_blocks = logmass.shape[1]
    blocks_per_program = min(
        triton.next_power_of_2(num_blocks), max(1, TILE_ELEMENTS // block_size)
    )
    has_temperature = temperature is not None
    temperature = temperature if has_temperature else logits  # a placeholder, never read
    strides = (logits.stride(0), logmass.stride(0), temperature.stride(0))
    block_logmass_kernel[(num_rows, triton.cdiv(num_blocks, blocks_per_program))](
        logmass,
        residual,
        logits,
        temperature,
        vocab_size,
        num_blocks,
        *strides,
        BLOCK_SIZE=block_size,
        BLOCKS_PER_PROGRAM=blocks_per_program,
        HAS_TEMPERATURE=has_temperature,
        num_warps=NUM_WARPS_BLOCKS,
    )
    pick_kernel[(num_rows,)](
        ids,
        logmass,
        residual,
        logits,
        temperature,
        keys,
        vocab_size,
        num_blocks,
        *strides,
        keys.stride(0),
        BLOCK_SIZE=block_size,
        NUM_BLOCKS_P2=triton.next_power_of_2(num_blocks),
        HAS_TEMPERATURE=has_temperature,
        num_warps=NUM_WARPS_PICK,
    )


def _check_inputs(
    logits: torch.Tensor, temperature: torch.Tensor | None, keys: torch.Tensor
) -> None:
    if logits.dim() != 2 or logits.dtype != torch.float32 or logits.shape[1] < 1:
        raise ValueError(
            f"logits must be [N, V >= 1] float32; got {tuple(logits.shape)} {logits.dtype}"
        )
    if logits.stride(1) != 1:
        raise ValueError(f"logits must have stride 1 along V; got strides {logits.stride()}")
    num_rows = logits.shape[0]
    if keys.shape != (num_rows,) or keys.dtype != torch.int64 or keys.device != logits.device:
        raise ValueError(
            f"keys must be [N={num_rows}] int64 on {logits.device}; "
            f"got {tuple(keys.shape)} {keys.dtype} on {keys.device}"
        )
    if temperature is None:
        return
    if (
        temperature.shape != (num_rows,)
        or temperature.dtype != torch.float32
        or temperature.device != logits.device
    ):
        raise ValueError(
            f"temperature must be None or [N={num_rows}] float32 on {logits.device}; "
            f"got {tuple(temperature.shape)} {temperature.dtype} on {temperature.device}"
        )
