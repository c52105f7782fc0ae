"""CPU: how many 32k-token requests a Mistral-7B-shape engine on the H200 runs at once, with and
without freeing the KV blocks below the sliding window, through the real Scheduler.

    python benchmarks/sliding_window_capacity.py [--requests 300] [--prompt 32000] [--output 768]
    python benchmarks/sliding_window_capacity.py --workload S1   (gpu_workloads.py's mix, modelled)
    python benchmarks/sliding_window_capacity.py --full-layers 8   (8 of the 32 layers full)

The block count is the engine's KV sizing for the shape: device memory x gpu_memory_utilization
(0.9, the default) - the weights (14.5 GB in bf16) - the rest of start-up's reservation (the
profile step's peak, the graphs, non-torch memory), taken from llama3-8b's measured 55,136 blocks
on the same H200 (scheduler_sim.py; its KV per token is Mistral-7B's: 32 layers x 8 KV heads x
128 x 2 x bf16 = 128 KiB). Without the window (`--no-window`-like row "full") every block of a
request stays held, as before this change. Prefix caching off (distinct prompts). Prints, per
row: the blocks, the most requests decoding in one step, the most holding KV at once, the
preemptions and the steps; with the per-step cost model of scheduler_sim.py (attention reads
min(context, window) keys), the modelled output tok/s.

With --full-layers N the shape mixes N full layers (spread evenly) with 32 - N windowed ones
(Qwen2/3's layer_types): row "one group" keeps every block (the path before KV cache groups), row
"groups" runs core/kv_groups.py's groups, whose block costs one group's layers (layer i of every
group shares a KV tensor), so the same memory holds num_layers / group size times the blocks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_workloads import MODELS, workload  # noqa: E402
from scheduler_sim import (  # noqa: E402
    ATTENTION_BANDWIDTH,
    BANDWIDTH,
    NUM_BLOCKS,
    PEAK_FLOPS,
)

from pagedlm.config import CacheConfig, SchedulerConfig  # noqa: E402
from pagedlm.core.kv_groups import kv_cache_groups  # noqa: E402
from pagedlm.core.sched_output import ModelRunnerOutput  # noqa: E402
from pagedlm.core.scheduler import Scheduler  # noqa: E402
from pagedlm.request import Request  # noqa: E402
from pagedlm.sampling_params import SamplingParams  # noqa: E402

GIB = 1 << 30
DEVICE_BYTES = 139 * GIB  # H200 as torch reports it
GPU_MEMORY_UTILIZATION = 0.9
LLAMA3_8B_WEIGHTS = 16.06e9
MISTRAL_7B_WEIGHTS = 14.5e9
BLOCK_SIZE = 16
GEMM_FLOPS_PER_TOKEN = 2 * 7.24e9  # Mistral-7B's parameters


def kv_bytes_per_token(shape: dict) -> int:
    head_dim = shape.get("head_dim") or shape["hidden_size"] // shape["num_attention_heads"]
    return 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * head_dim * 2  # bf16


def h200_num_blocks(shape: dict) -> int:
    """The engine's block count for the shape on the H200 (module notes)."""
    block_bytes = kv_bytes_per_token(shape) * BLOCK_SIZE
    budget = DEVICE_BYTES * GPU_MEMORY_UTILIZATION
    rest = budget - LLAMA3_8B_WEIGHTS - NUM_BLOCKS * block_bytes  # same KV shape as llama3-8b
    return int((budget - MISTRAL_7B_WEIGHTS - rest) // block_bytes)


def run(
    prompts: list[list[int]],
    max_tokens: list[int],
    num_blocks: int,
    group_windows: tuple[int | None, ...],
    max_model_len: int,
    layer_windows: list[int | None],
) -> dict:
    """layer_windows: each layer's window, for the attention reads of the cost model."""
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=1024, max_num_batched_tokens=16384),
        CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=False),
        num_blocks,
        max_model_len,
        group_windows=group_windows,
    )
    for i, (prompt, num_out) in enumerate(zip(prompts, max_tokens)):
        params = SamplingParams(max_tokens=num_out, ignore_eos=True)
        sched.add_request(Request(str(i), prompt, params, max_tokens=num_out))
    most_decoding = most_holding = num_steps = 0
    seconds = 0.0
    kv_bytes = kv_bytes_per_token(MODELS["mistral-7b"])
    while sched.has_unfinished_requests():
        plan = sched.schedule()
        num_steps += 1
        decoding = sum(1 for n in plan.num_scheduled_tokens.values() if n == 1)
        most_decoding = max(most_decoding, decoding)
        most_holding = max(most_holding, len(sched.running))
        keys_read = sum(
            min(sched.requests[r].num_computed_tokens, window or max_model_len)
            for r in plan.num_scheduled_tokens
            for window in layer_windows
        ) / len(layer_windows)
        num_tokens = plan.total_num_scheduled_tokens
        seconds += max(
            num_tokens * GEMM_FLOPS_PER_TOKEN / PEAK_FLOPS, MISTRAL_7B_WEIGHTS / BANDWIDTH
        )
        seconds += keys_read * kv_bytes / ATTENTION_BANDWIDTH
        ids = sorted(plan.sampling_req_ids)
        sched.update_from_output(plan, ModelRunnerOutput(ids, [[7] for _ in ids]))
    return dict(
        blocks=num_blocks,
        most_decoding=most_decoding,
        most_holding=most_holding,
        preemptions=sched.num_preemptions,
        steps=num_steps,
        model_out_tok_s=sum(max_tokens) / seconds,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--prompt", type=int, default=32000)
    parser.add_argument("--output", type=int, default=768)
    parser.add_argument("--workload", default=None, help="a gpu_workloads.py id instead (S1)")
    parser.add_argument("--full-layers", type=int, default=0, help="of the 32; 0: Mistral's 0")
    args = parser.parse_args()
    shape = MODELS["mistral-7b"]
    if args.workload:
        _, prompts, max_tokens, _, overrides = workload(args.workload)
        max_model_len = overrides["max_model_len"]
        what = args.workload
    else:
        prompt = [7] * args.prompt  # one list shared by every request: tokens do not matter here
        prompts, max_tokens = [prompt] * args.requests, [args.output] * args.requests
        max_model_len = shape["max_position_embeddings"]
        what = f"{args.requests} x {args.prompt} / {args.output}"
    num_blocks = h200_num_blocks(shape)
    window, num_layers = shape["sliding_window"], shape["num_hidden_layers"]
    print(f"mistral-7b on the H200: {num_blocks} blocks of {BLOCK_SIZE} (all layers); {what}")
    print(
        f"{'KV':10} {'blocks':>7} {'decoding at once':>16} {'holding KV':>10} {'preempt':>8} "
        f"{'steps':>6} {'model out tok/s':>15}"
    )
    for name, layer_windows, group_windows, blocks in rows(
        args.full_layers, num_layers, window, num_blocks
    ):
        row = run(prompts, max_tokens, blocks, group_windows, max_model_len, layer_windows)
        print(
            f"{name:10} {blocks:7d} {row['most_decoding']:16d} {row['most_holding']:10d} "
            f"{row['preemptions']:8d} {row['steps']:6d} {row['model_out_tok_s']:15.0f}",
            flush=True,
        )


def rows(num_full: int, num_layers: int, window: int, num_blocks: int) -> list[tuple]:
    """(name, layer windows, group windows, blocks) of each row (module notes)."""
    if num_full == 0:
        return [
            ("full", [None] * num_layers, (None,), num_blocks),
            ("window", [window] * num_layers, (window,), num_blocks),
        ]
    full = set(range(0, num_layers, num_layers // num_full)[:num_full])
    layer_windows = [None if i in full else window for i in range(num_layers)]
    groups = kv_cache_groups(layer_windows)
    group_size = len(groups[0][1])
    return [
        ("one group", layer_windows, (None,), num_blocks),
        (
            f"{len(groups)} groups",
            layer_windows,
            tuple(w for w, _ in groups),
            num_blocks * num_layers // group_size,
        ),
    ]


if __name__ == "__main__":
    main()
