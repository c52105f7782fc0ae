"""GPU: the Triton paged-attention kernels on the workloads' shapes, against torch's SDPA
(FlashAttention on contiguous q/k/v) as the peer, with a sweep of the prefill tile settings.

    python benchmarks/attention_kernels.py [--sweep] [--json out.json]
    python benchmarks/attention_kernels.py --decode [--spread 5] [--configs 128x4x3,64x4x2] [--cases decode-t1]
        [--json out.json]   (the decode tile sweep)
    python benchmarks/attention_kernels.py --mixed   (a mixed step's decodes in one launch or two, and the two on two streams)

Cases (bf16, block size 16, head_dim 128, KV blocks shuffled in the pool):
  prefill-llama  16 prompts x 512 tokens, 32 heads / 8 KV heads (T0 llama3-8b's prefill)
  prefill-2k     4 prompts x 2048 tokens, llama3-8b heads (T3's shared prefixes, caching off)
  suffix-llama   64 chunks of 128 tokens after 2048 cached ones (T3 with caching on)
  prefill-qwen   16 x 512, 16 heads / 8 KV heads (T0 qwen3-0.6b)
Each config's output is compared with SDPA's (max abs error printed; a broken config shows).
Causal attention FLOPs = 4 * head_dim * heads * sum over queries of visible keys.

--decode sweeps the decode settings (keys per tile x warps x stages: triton_paged's DECODE_* for the
varlen kernel, split count 1; triton_decode's SPLIT_* for the split kernel, split counts > 1)
on decode-only batches, reported as KV-cache GB/s:
  decode-t0        256 sequences x 576 keys, llama3-8b heads (T0's decode steps, mid-run)
  decode-t0-qwen   the same, qwen3-0.6b heads
  decode-t1        256 sequences x 800 keys, qwen3-0.6b heads (T1's decode steps)
  decode-t2        400 x 1500, llama3-8b heads (T2's)
  decode-b1-qwen   1 x 400, qwen3-0.6b (L2), split path
  decode-b1-llama  1 x 400, llama3-8b (L1), split path
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pagedlm.attention import triton_paged  # noqa: E402
from pagedlm.attention.backend import AttentionMetadata  # noqa: E402

CASES = {  # name: (num_seqs, cached tokens, query tokens, num_heads, num_kv_heads)
    "prefill-llama": (16, 0, 512, 32, 8),
    "prefill-2k": (4, 0, 2048, 32, 8),
    "suffix-llama": (64, 2048, 128, 32, 8),
    "prefill-qwen": (16, 0, 512, 16, 8),
}
DECODE_CASES = {  # name: (num_seqs, context tokens, num_heads, num_kv_heads, split counts to try)
    "decode-t0": (256, 576, 32, 8, (1, 2)),
    "decode-t0-qwen": (256, 576, 16, 8, (1, 2)),
    "decode-t1": (256, 800, 16, 8, (1, 4)),
    "decode-t2": (400, 1500, 32, 8, (1, 4)),
    "decode-b1-qwen": (1, 400, 16, 8, (16,)),
    "decode-b1-llama": (1, 400, 32, 8, (16,)),
}
HEAD_DIM, BLOCK_SIZE = 128, 16
PREFILL_SETTINGS = ("PREFILL_BLOCK_M", "PREFILL_NUM_WARPS", "PREFILL_NUM_STAGES", "PREFILL_BLOCK_N")
DECODE_SETTINGS = ("DECODE_BLOCK_N", "DECODE_NUM_WARPS", "DECODE_NUM_STAGES")  # the varlen kernel's
SPLIT_SETTINGS = (
    "SPLIT_BLOCK_N",
    "SPLIT_NUM_WARPS",
    "SPLIT_NUM_STAGES",
)  # triton_decode's split kernel


def current_settings(names: tuple[str, ...], module=triton_paged) -> tuple[int, ...]:
    return tuple(getattr(module, name) for name in names)


@contextlib.contextmanager
def kernel_settings(names: tuple[str, ...], values: tuple[int, ...], module=triton_paged):
    """The module constants `names` (triton_paged's by default) set to `values` inside the block,
    restored after."""
    saved = current_settings(names, module)
    for name, value in zip(names, values):
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in zip(names, saved):
            setattr(module, name, value)


def make_case(
    num_seqs: int, cached: int, query_len: int, num_heads: int, num_kv_heads: int, spread: int = 1
):
    """-> (q [T, H, D], kv_cache, meta, q/k/v for SDPA [B, H, L, D], causal FLOPs). The blocks are
    drawn at random from a pool `spread` times larger than they fill (the engine's per-layer pool
    is 3-4 GB, most of it idle in a small batch)."""
    dev, dtype = "cuda", torch.bfloat16
    seq_len = cached + query_len
    blocks_per_seq = -(-seq_len // BLOCK_SIZE)
    num_blocks = spread * num_seqs * blocks_per_seq + 1
    k = torch.randn(num_seqs, seq_len, num_kv_heads, HEAD_DIM, device=dev, dtype=dtype)
    v = torch.randn_like(k)
    q = torch.randn(num_seqs, query_len, num_heads, HEAD_DIM, device=dev, dtype=dtype)
    table = (torch.randperm(num_blocks - 1, device=dev) + 1)[: num_seqs * blocks_per_seq]
    table = table.view(num_seqs, blocks_per_seq).to(torch.int32)
    kv_cache = torch.zeros(
        2, num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM, device=dev, dtype=dtype
    )
    pad = blocks_per_seq * BLOCK_SIZE - seq_len
    for half, src in ((0, k), (1, v)):
        padded = F.pad(src, (0, 0, 0, 0, 0, pad)).view(
            num_seqs, blocks_per_seq, BLOCK_SIZE, num_kv_heads, HEAD_DIM
        )
        kv_cache[half][table.long()] = padded
    starts = torch.arange(num_seqs + 1, dtype=torch.int32) * query_len
    seq_lens = torch.full((num_seqs,), seq_len, dtype=torch.int32)
    meta = AttentionMetadata(
        num_tokens=num_seqs * query_len,
        num_seqs=num_seqs,
        max_query_len=query_len,
        max_seq_len=seq_len,
        query_start_loc=starts.to(dev),
        seq_lens=seq_lens.to(dev),
        slot_mapping=torch.empty(0, device=dev),
        block_table=table,
        query_start_loc_cpu=starts,
        seq_lens_cpu=seq_lens,
    )
    visible = num_seqs * sum(cached + i + 1 for i in range(query_len))
    flops = 4 * HEAD_DIM * num_heads * visible
    sdpa_qkv = (q.transpose(1, 2), k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous())
    return q.reshape(-1, num_heads, HEAD_DIM), kv_cache, meta, sdpa_qkv, flops


def sdpa(q, k, v, cached: int) -> torch.Tensor:
    """[B, H, L, D]: causal with the queries as the last L of the keys (bottom-right)."""
    if cached == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    query_len, seq_len = q.shape[2], k.shape[2]
    mask = torch.ones(query_len, seq_len, dtype=torch.bool, device=q.device).tril(
        seq_len - query_len
    )
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def time_ms(fn, iters: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def run_case(name: str, configs: list[tuple[int, int, int, int]]) -> list[dict]:
    """configs: (PREFILL_BLOCK_M, PREFILL_NUM_WARPS, PREFILL_NUM_STAGES, PREFILL_BLOCK_N)."""
    num_seqs, cached, query_len, num_heads, num_kv_heads = CASES[name]
    q, kv_cache, meta, (sq, sk, sv), flops = make_case(
        num_seqs, cached, query_len, num_heads, num_kv_heads
    )
    want = sdpa(sq, sk, sv, cached).transpose(1, 2).reshape(q.shape)
    rows: list[dict] = []

    def emit(**row) -> None:  # printed at once: a run cut short still leaves its rows
        row.update(case=name, tflops=flops / row["ms"] / 1e9)
        print(json.dumps(row), flush=True)
        rows.append(row)

    emit(config="sdpa", ms=time_ms(lambda: sdpa(sq, sk, sv, cached)), err=0.0)
    for config in configs:
        label = "M{} w{} s{} N{}".format(*config)
        with kernel_settings(PREFILL_SETTINGS, config):
            try:
                out = torch.full_like(q, float("nan"))
                call = lambda: triton_paged.varlen_attention(
                    q, kv_cache, meta, HEAD_DIM**-0.5, None, out=out
                )  # noqa: E731
                call()
                err = (out.float() - want.float()).abs().max().item()
                emit(config=label, ms=time_ms(call), err=err)
            except Exception as exc:  # a config the compiler refuses (shared memory): say so, go on
                emit(config=label, ms=float("nan"), err=float("nan"), error=str(exc)[:120])
    return rows


DECODE_SWEEP = list(itertools.product([32, 64, 128], [4, 8], [1, 2, 3]))  # (block_n, warps, stages)


def run_decode_case(
    name: str, spread: int = 1, configs: list[tuple[int, ...]] = DECODE_SWEEP
) -> list[dict]:
    """Every (block_n, warps, stages) of configs x the case's split counts; GB/s of KV read."""
    from pagedlm.attention import triton_decode

    num_seqs, context, num_heads, num_kv_heads, split_counts = DECODE_CASES[name]
    q, kv_cache, meta, (sq, sk, sv), _ = make_case(
        num_seqs, context - 1, 1, num_heads, num_kv_heads, spread
    )
    want = sdpa(sq, sk, sv, context - 1).transpose(1, 2).reshape(q.shape).float()
    kv_bytes = 2 * num_seqs * context * num_kv_heads * HEAD_DIM * kv_cache.element_size()
    defaults = {
        1: current_settings(DECODE_SETTINGS),
        "split": current_settings(SPLIT_SETTINGS, triton_decode),
    }
    rows = []
    for config in configs:
        for splits in split_counts:
            out = torch.full_like(q, float("nan"))
            if splits == 1:
                call = lambda: triton_paged.varlen_attention(
                    q, kv_cache, meta, HEAD_DIM**-0.5, None, out=out
                )  # noqa: E731
                settings = kernel_settings(DECODE_SETTINGS, config)
            else:
                call = lambda: triton_decode.split_decode_attention(  # noqa: E731
                    q, kv_cache, meta, HEAD_DIM**-0.5, None, splits, out=out
                )
                settings = kernel_settings(SPLIT_SETTINGS, config, triton_decode)
            label = "N{} w{} s{} split{}".format(*config, splits)
            with settings:
                try:
                    call()
                    err = (out.float() - want).abs().max().item()
                    ms = time_ms(call)
                except Exception as exc:  # a config the compiler refuses: say so, go on
                    ms, err = float("nan"), float("nan")
                    label += " " + str(exc)[:60]
            default = config == defaults[1 if splits == 1 else "split"]
            row = dict(
                case=name, config=label, ms=ms, err=err, gbs=kv_bytes / ms / 1e6, default=default
            )
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def shared_prefix_decode(
    num_prefixes: int = 16,
    seqs_per_prefix: int = 32,
    prefix_len: int = 2048,
    suffix_len: int = 129,
    num_heads: int = 32,
    num_kv_heads: int = 8,
) -> list[dict]:
    """T3's decode steps: seqs_per_prefix sequences share each prefix's KV blocks. The varlen decode
    kernel with the batch in random order (T3's shuffled arrival), grouped by prefix, and with no
    sharing at all (every sequence its own blocks: the DRAM-bound baseline). GB/s counts the KV
    each sequence reads, shared or not; more than the DRAM bandwidth means L2 hits."""
    dev, dtype = "cuda", torch.bfloat16
    num_seqs, context = num_prefixes * seqs_per_prefix, prefix_len + suffix_len
    prefix_blocks, seq_blocks = prefix_len // BLOCK_SIZE, -(-context // BLOCK_SIZE)
    own_blocks = seq_blocks - prefix_blocks
    unique_pool = num_seqs * seq_blocks
    kv_cache = torch.randn(
        2, unique_pool + 1, BLOCK_SIZE, num_kv_heads, HEAD_DIM, device=dev, dtype=dtype
    )
    seq_ids = torch.arange(num_seqs, device=dev)
    prefix_table = (seq_ids // seqs_per_prefix)[:, None] * prefix_blocks + torch.arange(
        prefix_blocks, device=dev
    )
    own_table = (
        num_prefixes * prefix_blocks
        + seq_ids[:, None] * own_blocks
        + torch.arange(own_blocks, device=dev)
    )
    tables = {
        "shared": torch.cat([prefix_table, own_table], 1).int() + 1,
        "unique": (seq_ids[:, None] * seq_blocks + torch.arange(seq_blocks, device=dev)).int() + 1,
    }
    q = torch.randn(num_seqs, num_heads, HEAD_DIM, device=dev, dtype=dtype)
    starts = torch.arange(num_seqs + 1, dtype=torch.int32)
    seq_lens = torch.full((num_seqs,), context, dtype=torch.int32)
    kv_bytes = 2 * num_seqs * context * num_kv_heads * HEAD_DIM * kv_cache.element_size()
    order_random = torch.randperm(num_seqs, generator=torch.Generator().manual_seed(0)).to(dev)
    rows, outputs = [], {}
    for layout, order in (("unique", order_random), ("shared", order_random), ("shared", seq_ids)):
        table = tables[layout][order]
        meta = AttentionMetadata(
            num_tokens=num_seqs,
            num_seqs=num_seqs,
            max_query_len=1,
            max_seq_len=context,
            query_start_loc=starts.to(dev),
            seq_lens=seq_lens.to(dev),
            slot_mapping=torch.empty(0, device=dev),
            block_table=table,
            query_start_loc_cpu=starts,
            seq_lens_cpu=seq_lens,
        )
        out = torch.full_like(q, float("nan"))
        call = lambda: triton_paged.varlen_attention(
            q[order], kv_cache, meta, HEAD_DIM**-0.5, None, out=out
        )  # noqa: E731
        ms = time_ms(call)
        name = f"{layout}, {'grouped' if order is seq_ids else 'random'} order"
        outputs[name] = out[torch.argsort(order)].float()
        row = dict(case="decode-t3", config=name, ms=ms, gbs=kv_bytes / ms / 1e6)
        print(json.dumps(row), flush=True)
        rows.append(row)
    base = outputs["shared, random order"]
    for name, out in outputs.items():
        if name.startswith("shared"):
            assert torch.equal(out, base), f"{name}: output differs with the batch order"
    print(f"\n{'T3 decode (512 x 2177 keys)':34} {'ms':>8} {'GB/s':>7}")
    for row in rows:
        print(f"{row['config']:34} {row['ms']:8.3f} {row['gbs']:7.0f}")
    return rows


MIXED_CASES = {  # name: (decodes, their context, prompts, prompt tokens, num_heads, num_kv_heads)
    "mixed-t3": (256, 2200, 7, 2048, 32, 8),  # a T3-off step: decodes ride along 7 fresh 2k prompts
    "mixed-t1": (192, 700, 16, 512, 16, 8),  # a T1 step while prompts still arrive
}


STREAM_VARIANTS = [  # (label, decodes on the side stream, decodes launched first, side stream high priority)
    ("streams: decodes side, first", True, True, False),
    ("streams: decodes side hi, last", True, False, True),
    ("streams: prompts side, first", False, False, False),
    ("streams: prompts side hi, last", False, True, True),
]


def two_streams(q, kv_cache, meta, out, decodes_on_side: bool, decodes_first: bool, priority: bool):
    """The decode launch and the prompts' launch of a mixed step on two streams, so that the
    memory-bound decodes and the compute-bound prompts may share the SMs; -> a call."""
    side = torch.cuda.Stream(priority=-1 if priority else 0)
    decodes = lambda: triton_paged._launch(  # noqa: E731
        q, kv_cache, meta, HEAD_DIM**-0.5, None, out, meta.num_decodes, order=meta.decode_order
    )
    prompts = lambda: triton_paged._launch(  # noqa: E731
        q, kv_cache, meta, HEAD_DIM**-0.5, None, out, meta.num_seqs, first_seq=meta.num_decodes
    )
    on_side, on_main = (decodes, prompts) if decodes_on_side else (prompts, decodes)
    side_first = decodes_first == decodes_on_side

    def call():
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        if not side_first:
            on_main()
        with torch.cuda.stream(side):
            on_side()
        if side_first:
            on_main()
        main.wait_stream(side)

    return call


def mixed_step(name: str) -> list[dict]:
    """A mixed step's attention, its decodes first: one launch (decodes in query tiles) against
    two (num_decodes: the decodes as a decode batch, then the prompts), and each part alone."""
    num_decodes, context, num_prompts, prompt_len, num_heads, num_kv_heads = MIXED_CASES[name]
    qd, cache_d, meta_d, _, _ = make_case(num_decodes, context - 1, 1, num_heads, num_kv_heads)
    qp, cache_p, meta_p, _, flops = make_case(num_prompts, 0, prompt_len, num_heads, num_kv_heads)
    cols = max(meta_d.block_table.shape[1], meta_p.block_table.shape[1])
    table = torch.cat(
        [
            F.pad(meta_d.block_table, (0, cols - meta_d.block_table.shape[1])),
            F.pad(meta_p.block_table + cache_d.shape[1], (0, cols - meta_p.block_table.shape[1])),
        ]
    )
    qsl = torch.cat([meta_d.query_start_loc_cpu, meta_p.query_start_loc_cpu[1:] + num_decodes])
    seq_lens = torch.cat([meta_d.seq_lens_cpu, meta_p.seq_lens_cpu])
    q, kv_cache = torch.cat([qd, qp]), torch.cat([cache_d, cache_p], 1)
    meta = AttentionMetadata(
        num_tokens=q.shape[0],
        num_seqs=seq_lens.numel(),
        max_query_len=prompt_len,
        max_seq_len=int(seq_lens.max()),
        query_start_loc=qsl.cuda(),
        seq_lens=seq_lens.cuda(),
        slot_mapping=torch.empty(0, device="cuda"),
        block_table=table,
        query_start_loc_cpu=qsl,
        seq_lens_cpu=seq_lens,
    )
    order = torch.argsort(-meta_d.seq_lens_cpu.long(), stable=True).to(torch.int32).cuda()
    split = dataclasses.replace(meta, num_decodes=num_decodes, decode_order=order)
    kv_bytes = 2 * num_decodes * context * num_kv_heads * HEAD_DIM * kv_cache.element_size()
    runs = {
        "one launch": (q, kv_cache, meta),
        "decodes apart": (q, kv_cache, split),
        "decodes alone": (qd, cache_d, meta_d),
        "prompts alone": (qp, cache_p, meta_p),
    }
    rows, outs = [], {}
    for label, (rq, cache, m) in runs.items():
        out = torch.full_like(rq, float("nan"))
        call = lambda: triton_paged.varlen_attention(rq, cache, m, HEAD_DIM**-0.5, None, out=out)  # noqa: E731
        row = dict(case=name, config=label, ms=time_ms(call))
        outs[label] = out.float()
        print(json.dumps(row), flush=True)
        rows.append(row)
    for label, decodes_on_side, decodes_first, priority in STREAM_VARIANTS:
        out = torch.full_like(q, float("nan"))
        call = two_streams(q, kv_cache, split, out, decodes_on_side, decodes_first, priority)
        call()
        err2 = (out.float() - outs["decodes apart"]).abs().max().item()
        row = dict(case=name, config=label, ms=time_ms(call), err=err2)
        print(json.dumps(row), flush=True)
        rows.append(row)
    err = (outs["one launch"] - outs["decodes apart"]).abs().max().item()
    print(
        f"\n{name}: {num_decodes} decodes x {context} keys ({kv_bytes / 1e9:.2f} GB of KV) + "
        f"{num_prompts} prompts x {prompt_len} ({flops / 1e12:.2f} TFLOP); one launch vs two: max diff {err:.4f}"
    )
    for row in rows:
        print(f"  {row['config']:16} {row['ms']:8.3f} ms")
    return rows


def print_decode_table(rows: list[dict]) -> None:
    print(f"\n{'case':16} {'config':26} {'ms':>8} {'GB/s':>7} {'max err':>8}")
    for name in DECODE_CASES:
        case_rows = sorted(
            (r for r in rows if r["case"] == name), key=lambda r: (r["ms"] != r["ms"], r["ms"])
        )
        for row in case_rows[:4] + [r for r in case_rows[4:] if r["default"]]:
            mark = " (default)" if row["default"] else ""
            print(
                f"{row['case']:16} {row['config'][:26]:26} {row['ms']:8.4f} {row['gbs']:7.0f} {row['err']:8.4f}{mark}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sweep", action="store_true", help="try block_m x warps x stages x block_n"
    )
    parser.add_argument("--decode", action="store_true", help="sweep the decode settings instead")
    parser.add_argument(
        "--shared-prefix",
        action="store_true",
        help="T3's decode steps: shared prefixes, batch order random vs grouped",
    )
    parser.add_argument(
        "--mixed",
        action="store_true",
        help="mixed steps: decodes in the prompts' launch vs a decode launch of their own",
    )
    parser.add_argument(
        "--spread",
        type=int,
        default=1,
        help="--decode: blocks drawn from a pool this many times larger than they fill",
    )
    parser.add_argument(
        "--configs",
        default=None,
        help="--decode: only these block_n x warps x stages, e.g. 128x4x3,32x4x2",
    )
    parser.add_argument(
        "--cases", default=None, help="--decode: only these cases, e.g. decode-t1,decode-t2"
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.shared_prefix:
        shared_prefix_decode()
        return
    if args.mixed:
        for name in MIXED_CASES:
            mixed_step(name)
        return
    if args.decode:
        configs = (
            DECODE_SWEEP
            if args.configs is None
            else [tuple(int(v) for v in c.split("x")) for c in args.configs.split(",")]
        )
        cases = list(DECODE_CASES) if args.cases is None else args.cases.split(",")
        rows = [row for name in cases for row in run_decode_case(name, args.spread, configs)]
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        print_decode_table(rows)
        return
    default = current_settings(PREFILL_SETTINGS)
    configs = [default]
    if args.sweep:
        configs += [
            c for c in itertools.product([64, 128], [4, 8], [2, 3], [64, 128]) if c != default
        ]
    rows = [row for name in CASES for row in run_case(name, configs)]
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"\n{'case':14} {'config':22} {'ms':>8} {'TFLOP/s':>8} {'max err':>8}")
    for name in CASES:
        case_rows = sorted(
            (r for r in rows if r["case"] == name), key=lambda r: (r["ms"] != r["ms"], r["ms"])
        )
        shown = case_rows[:4] + [
            r for r in case_rows[4:] if r["config"] in ("sdpa", rows[1]["config"])
        ]
        for row in shown:
            print(
                f"{row['case']:14} {row['config']:22} {row['ms']:8.3f} {row['tflops']:8.1f} {row['err']:8.4f}"
            )


if __name__ == "__main__":
    main()
