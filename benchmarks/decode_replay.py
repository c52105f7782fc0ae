"""GPU: the decode forward's CUDA-graph replay time under launch-setting variants, A/B'd in one process.

    python benchmarks/decode_replay.py [--shape qwen3-0.6b] [--batch-size 1] [--context 384]
        [--variants base,gsplit,g8x512] [--rounds 7] [--json out.json]

The real model shape (dummy weights, bf16, PDL as the engine runs it). Graphs of up to 8 rows hold
the LM head too since commit 6a47c94 (session 7's numbers in results/2026-11-29/NOTES.md, taken before, do not).
One generate of --batch-size prompts of --context tokens fills the KV cache; then each variant captures its own
decode graph (only the batch's size) with its settings applied while capturing, and the variants'
replays are timed in turn, --rounds times (alternating cancels the drift between processes and
over time that end-to-end L2 shows), each timing the GPU µs of 200 replays queued behind a GPU
sleep (host_step.py's method), each variant's from the same input ids (last_sampled reset before it:
a graph feeds its argmax to the next replay). Printed: the median per variant and the max |difference| of the
graph's output from the first variant's (split-K order changes the rounding a little).

Variants: '+'-joined parts, "base" for the defaults:
- gNxK: single-row GEMVs of weights up to gemv.PRELOAD_MAX_BYTES take FMA tiles of N rows x K
  columns, K cut into slices of one tile each, so each program's whole weight slice is read
  before its PDL wait (larger weights, e.g. the LM head, keep the default);
- gsplit: the same weights take 8 x 256 tiles with K split by `with_auto_split_k` (the rule before
  session 7's one-tile slices: up to 4 chunks per program, the first read before the wait);
- sbN, swN, ssN: the split decode's keys per tile (and per split at batch 1), warps, stages;
- fmakN: single-row GEMVs take weights up to K = N columns (gemv.MAX_FMA_K; llama3-8b's down_proj has
  K = 14,336), chN: up to N chunks of K per program where K is streamed (gemv.MAX_CHUNKS_PER_SLICE),
  bigNxK: larger weights stream N x K tiles (default 8 x 256 in 16 bits);
- mNxK=BNxBKsS[wW]: the single-row GEMV of the N x K weight alone takes BN x BK tiles (W warps a
  program, default one) with K cut into S slices (e.g. m4096x4096=8x256s8 for llama3-8b's o_proj;
  m1024x2048=4x2048s1w2: qwen3-0.6b's o_proj, each program the whole K of its rows, no split);
- nopN: N empty one-program PDL kernels after each layer's prepare_qkv (the cost of a kernel boundary);
- spN: every decode attention takes N splits (1: the varlen kernel, no split and no merge) whatever the shape.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_workloads import MODELS  # noqa: E402
from host_step import replay_gpu_us  # noqa: E402

from pagedlm import LLM, SamplingParams  # noqa: E402
from pagedlm.attention import triton_backend, triton_decode  # noqa: E402
from pagedlm.model import llama  # noqa: E402
from pagedlm.ops import gemv, pdl  # noqa: E402


@contextlib.contextmanager
def settings(variant: str):
    """The variant's settings applied inside the block (see the module notes), restored after."""
    saved = gemv.default_config
    saved_split = (
        triton_decode.SPLIT_BLOCK_N,
        triton_decode.SPLIT_NUM_WARPS,
        triton_decode.SPLIT_NUM_STAGES,
    )
    saved_gemv = gemv.MAX_FMA_K, gemv.MAX_CHUNKS_PER_SLICE
    saved_prepare = llama.prepare_qkv
    saved_choose = triton_backend.choose_num_splits
    for part in variant.split("+"):
        if part.startswith("nop"):
            llama.prepare_qkv = with_empty_launches(saved_prepare, int(part[3:]))
        elif part.startswith("sp"):
            triton_backend.choose_num_splits = functools.partial(fixed_splits, int(part[2:]))
        elif part.startswith("sb"):
            triton_decode.SPLIT_BLOCK_N = int(part[2:])
        elif part.startswith("sw"):
            triton_decode.SPLIT_NUM_WARPS = int(part[2:])
        elif part.startswith("ss"):
            triton_decode.SPLIT_NUM_STAGES = int(part[2:])
        elif part.startswith("fmak"):
            gemv.MAX_FMA_K = int(part[4:])
        elif part.startswith("ch"):
            gemv.MAX_CHUNKS_PER_SLICE = int(part[2:])
        elif part.startswith("big"):
            block_n, block_k = (int(v) for v in part[3:].split("x"))
            gemv.default_config = streamed_tiles(gemv.default_config, block_n, block_k)
        elif part.startswith("m") and "=" in part:
            gemv.default_config = one_matrix(gemv.default_config, *parse_matrix_config(part))
        elif part == "gsplit":
            gemv.default_config = streamed_chunks(saved)
        elif part.startswith("g"):
            block_n, block_k = (int(v) for v in part[1:].split("x"))
            gemv.default_config = one_tile_slices(saved, block_n, block_k)
        elif part != "base":
            raise ValueError(f"unknown variant part {part!r} in {variant!r}")
    saved.cache_clear()  # it reads MAX_CHUNKS_PER_SLICE
    try:
        yield
    finally:
        gemv.default_config = saved
        gemv.MAX_FMA_K, gemv.MAX_CHUNKS_PER_SLICE = saved_gemv
        llama.prepare_qkv = saved_prepare
        triton_backend.choose_num_splits = saved_choose
        saved.cache_clear()
        (
            triton_decode.SPLIT_BLOCK_N,
            triton_decode.SPLIT_NUM_WARPS,
            triton_decode.SPLIT_NUM_STAGES,
        ) = saved_split


def fixed_splits(num_splits: int, *shape: int) -> int:
    """choose_num_splits's stand-in for spN: N whatever the shape."""
    return num_splits


@triton.jit
def _empty_kernel(PDL: tl.constexpr):
    pdl.wait_for_producers(PDL)


def with_empty_launches(prepare_qkv, count: int):
    """prepare_qkv followed by `count` one-program kernels that only wait (PDL) and let the next
    launch: what one kernel boundary costs in the batch-1 chain."""

    def prepare(qkv, *args, **kwargs):
        q = prepare_qkv(qkv, *args, **kwargs)
        for _ in range(count):
            _empty_kernel[(1,)](**pdl.launch_args(qkv.device))
        return q

    return prepare


def is_small_bf16_row(num_rows: int, n: int, k: int, dtype: torch.dtype) -> bool:
    """A single-row 16-bit GEMV of a weight the default rule cuts into one-tile slices."""
    return (
        num_rows == 1
        and dtype != torch.float32
        and n * k * dtype.itemsize <= gemv.PRELOAD_MAX_BYTES
    )


def one_tile_slices(default, block_n: int, block_k: int):
    def config(num_rows: int, n: int, k: int, dtype: torch.dtype) -> gemv.GemvConfig:
        if is_small_bf16_row(num_rows, n, k, dtype):
            return gemv.GemvConfig(
                block_n, block_k, split_k=triton.cdiv(k, block_k), num_warps=1, num_stages=1
            )
        return default(num_rows, n, k, dtype)

    return config


def streamed_tiles(default, block_n: int, block_k: int):
    """Single-row GEMVs of weights larger than gemv.PRELOAD_MAX_BYTES stream N x K tiles (one warp)."""

    def config(num_rows: int, n: int, k: int, dtype: torch.dtype) -> gemv.GemvConfig:
        if (
            num_rows == 1
            and dtype != torch.float32
            and n * k * dtype.itemsize > gemv.PRELOAD_MAX_BYTES
        ):
            return gemv.with_auto_split_k(
                gemv.GemvConfig(block_n, block_k, num_warps=1, num_stages=1), n, k
            )
        return default(num_rows, n, k, dtype)

    return config


def parse_matrix_config(part: str) -> tuple[int, int, gemv.GemvConfig]:
    """ "mNxK=BNxBKsS" or "mNxK=BNxBKsSwW" -> (N, K, its config); W warps a program (default 1)."""
    shape, tiles = part[1:].split("=")
    n, k = (int(v) for v in shape.split("x"))
    tile, split = tiles.split("s")
    split_k, _, warps = split.partition("w")
    block_n, block_k = (int(v) for v in tile.split("x"))
    return (
        n,
        k,
        gemv.GemvConfig(
            block_n, block_k, split_k=int(split_k), num_warps=int(warps or 1), num_stages=1
        ),
    )


def one_matrix(default, n: int, k: int, matrix_config: gemv.GemvConfig):
    def config(num_rows: int, rows: int, cols: int, dtype: torch.dtype) -> gemv.GemvConfig:
        if num_rows == 1 and (rows, cols) == (n, k):
            return matrix_config
        return default(num_rows, rows, cols, dtype)

    return config


def streamed_chunks(default):
    def config(num_rows: int, n: int, k: int, dtype: torch.dtype) -> gemv.GemvConfig:
        if is_small_bf16_row(num_rows, n, k, dtype):
            return gemv.with_auto_split_k(gemv.GemvConfig(8, 256, num_warps=1, num_stages=1), n, k)
        return default(num_rows, n, k, dtype)

    return config


def dummy_llm(folder: str, shape: str, batch_size: int, context: int) -> LLM:
    """An engine over the shape's dummy weights in bf16, for decode batches of batch_size rows."""
    config = MODELS[shape]
    (Path(folder) / "config.json").write_text(json.dumps(config))
    return LLM(
        folder,
        load_format="dummy",
        dtype="bfloat16",
        skip_tokenizer_init=True,
        seed=0,
        max_num_seqs=batch_size,
        max_model_len=config["max_position_embeddings"],
        max_num_batched_tokens=max(16384, batch_size * (context + 1)),
    )


def fill_decode_batch(llm: LLM, batch_size: int, context: int) -> int:
    """Every prompt of `context` random tokens prefilled in one step, then one decode of the whole
    batch (seq_len context + 1), whose rows fill its graph's size exactly; -> that graph size."""
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 30000) for _ in range(context)] for _ in range(batch_size)]
    llm.generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True), use_tqdm=False
    )
    runner = llm.llm_engine.engine_core.model_runner
    size = runner.sizes.decode_graph_size(batch_size)
    seq_lens = runner._inputs.sections(size, size).tensors["seq_lens"]  # the graphs' layout
    if not bool((seq_lens == context + 1).all()):
        raise RuntimeError(
            f"the last step was not one decode of the whole batch: seq_lens {seq_lens.tolist()}"
        )
    return size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="qwen3-0.6b", choices=sorted(MODELS))
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--context", type=int, default=384)
    parser.add_argument("--variants", default="base,gsplit,g2x1024,g4x2048,g2x2048,g2x4096,g1x4096")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    variants = args.variants.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        llm = dummy_llm(tmp, args.shape, args.batch_size, args.context)
        runner = llm.llm_engine.engine_core.model_runner
        graphs, outputs = {}, {}
        for variant in variants:  # capturing fills the static step buffers with padding ...
            with settings(variant):
                graphs[variant] = runner._new_decode_graphs(runner.kv_caches)
        # ... so the step that fills them comes after
        size = fill_decode_batch(llm, args.batch_size, args.context)
        for variant in variants:  # each graph set has its own block table: the last step's
            graphs[variant].block_table.copy_(runner.graphs.block_table)
        times: dict[str, list[float]] = {v: [] for v in variants}
        # every replay gathers its input ids from last_sampled and writes its argmax there: without a
        # reset, each variant would start from the ids the variant before left (session 13, run 4)
        first_ids = runner._last_sampled.clone()
        for _ in range(args.rounds):
            for variant in variants:
                runner._last_sampled.copy_(first_ids)
                times[variant].append(replay_gpu_us(graphs[variant], size))
                outputs.setdefault(
                    variant, graphs[variant]._outputs[size, None][: args.batch_size].float().clone()
                )
    first = outputs[variants[0]]
    rows = [
        dict(
            variant=v,
            us=statistics.median(times[v]),
            min_us=min(times[v]),
            max_us=max(times[v]),
            max_abs_diff=(outputs[v] - first).abs().max().item(),
        )
        for v in variants
    ]
    print(
        f"\n{args.shape}, batch {args.batch_size}, context {args.context}: decode-graph replay, "
        f"GPU µs (median of {args.rounds} rounds of 200 replays)"
    )
    print(f"{'variant':24} {'median':>8} {'min':>8} {'max':>8} {'vs first':>9} {'max |diff|':>10}")
    for row in rows:
        print(
            f"{row['variant']:24} {row['us']:8.1f} {row['min_us']:8.1f} {row['max_us']:8.1f} "
            f"{row['us'] / rows[0]['us'] - 1:+9.1%} {row['max_abs_diff']:10.4f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(dict(vars(args), rows=rows), indent=1))


if __name__ == "__main__":
    main()
