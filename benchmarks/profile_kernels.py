"""Where one engine step's GPU time goes: the CUDA kernels of steady decode steps, per step.

    python3 benchmarks/profile_kernels.py --shape qwen3-0.6b --batch-size 1 [--input-len 128]
        [--temperature 0] [--steps 20] [--graphs]

A real model's shape with dummy weights (bf16), `--batch-size` prompts of `--input-len` random
ids, greedy or `--temperature`; after the prompts' prefill and 16 warm decode steps (or after
`--skip` steps: `--skip 0` profiles the prefill steps), `--steps` engine steps run under
torch.profiler. Eager by default (every kernel launched on its own, so each is named); with
--graphs the decode steps replay the captured CUDA graph, which the profiler may or may not
resolve into kernels. Prints the kernels sorted by GPU time per step, their launches per step,
the sum of kernel time per step, and the wall time per step of the profiled steps.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

WARM_STEPS = 16


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="qwen3-0.6b", choices=["qwen3-0.6b", "llama3-8b"])
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--graphs", action="store_true", help="replay CUDA graphs (default: eager)")
    parser.add_argument("--skip", type=int, default=None, help="steps before the profiled ones")
    parser.add_argument("--top", type=int, default=22)
    return parser.parse_args()


def _kernel_table(prof, num_steps: int, top: int) -> float:
    """Prints the top kernels; returns the sum of kernel µs per step."""
    rows = []
    for event in prof.key_averages():
        device_us = getattr(event, "self_device_time_total", 0) or getattr(
            event, "self_cuda_time_total", 0
        )
        if device_us <= 0 or event.device_type.name != "CUDA":
            continue
        rows.append((device_us / num_steps, event.count / num_steps, event.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    launches = sum(r[1] for r in rows)
    print(f"{'µs/step':>9} {'share':>6} {'n/step':>7}  kernel")
    for us, count, name in rows[:top]:
        print(f"{us:9.1f} {us / total:6.1%} {count:7.1f}  {name[:110]}")
    print(f"{total:9.1f} {'100%':>6} {launches:7.1f}  (all {len(rows)} kernels)")
    return total


def main() -> None:
    args = _parse_args()
    import torch
    from gpu_workloads import model_dir
    from torch.profiler import ProfilerActivity, profile

    from pagedlm import LLM, SamplingParams

    llm = LLM(
        model_dir(args.shape, Path(tempfile.mkdtemp())),
        load_format="dummy",
        dtype="bfloat16",
        skip_tokenizer_init=True,
        enforce_eager=not args.graphs,
        seed=0,
    )
    engine = llm.llm_engine
    rng = random.Random(0)
    num_steps = WARM_STEPS + args.steps + 32
    params = SamplingParams(temperature=args.temperature, max_tokens=num_steps, ignore_eos=True)
    for i in range(args.batch_size):
        engine.add_request(
            f"p{i}",
            [rng.randrange(100, 30000) for _ in range(args.input_len)],
            params,
            final_only=True,
        )
    prefill_steps = -(-args.batch_size * args.input_len // 8192)  # at most 16384 tokens a step
    for _ in range(prefill_steps + WARM_STEPS if args.skip is None else args.skip):
        engine.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(args.steps):
            engine.step()
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - start) * 1e6 / args.steps
    mode = "graphs" if args.graphs else "eager"
    print(
        f"{args.shape}, batch {args.batch_size}, input {args.input_len}, temperature {args.temperature}, "
        f"{mode}: {args.steps} steps profiled"
    )
    kernel_us = _kernel_table(prof, args.steps, args.top)
    print(f"wall {wall_us:.1f} µs/step (under the profiler); kernels {kernel_us:.1f} µs/step")
    while engine.has_unfinished_requests():
        engine.step()


if __name__ == "__main__":
    main()
