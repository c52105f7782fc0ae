"""The executor's per-step cost at tp = 1: "uni" (the runner in process) against "mp" (one worker
process: the broadcast ring, the results socket, the worker loop), decode-heavy generates.

    python benchmarks/tp_executor_cost.py [--shape qwen3-0.6b] [--batch-sizes 1,64,256]
        [--input-len 32] [--output-len 256] [--repeats 3] [--backends uni,mp] [--json out.json]

Dummy weights of a real shape (benchmarks/gpu_workloads.py's MODELS) in bf16 on CUDA, greedy,
ignore_eos, random prompt ids. Each backend runs in a process of its own (the GPU's memory whole
for each). Per batch size: the least seconds of --repeats generate calls after a warm-up, divided
by --output-len (one decode step per output token). Prints one JSON row per (backend, batch) and
then mp's extra time per step over uni's.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def least_generate_seconds(
    llm: Any, rng: random.Random, batch: int, input_len: int, output_len: int, repeats: int
) -> float:
    """The least wall seconds of `repeats` greedy generates of `batch` random prompts (ignore_eos,
    output_len tokens each), after a warm-up one."""
    from pagedlm import SamplingParams

    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    prompts = [
        {"prompt_token_ids": [rng.randrange(100, 20000) for _ in range(input_len)]}
        for _ in range(batch)
    ]
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        best = min(best, time.perf_counter() - start)
    return best


def measure(args: argparse.Namespace, backend: str) -> list[dict]:
    """In this process: one engine of `backend`, every batch size."""
    from gpu_workloads import model_dir

    from pagedlm import LLM

    llm = LLM(
        model_dir(args.shape, Path(tempfile.mkdtemp())),
        load_format="dummy",
        dtype="bfloat16",
        skip_tokenizer_init=True,
        max_model_len=args.input_len + args.output_len + 16,
        distributed_executor_backend=backend,
    )
    rng = random.Random(0)
    rows = []
    for batch in args.batch_sizes:
        best = least_generate_seconds(
            llm, rng, batch, args.input_len, args.output_len, args.repeats
        )
        step_ms = best / args.output_len * 1e3
        rows.append({"backend": backend, "batch": batch, "step_ms": round(step_ms, 4)})
    llm.shutdown()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="qwen3-0.6b")
    parser.add_argument(
        "--batch-sizes", default="1,64,256", type=lambda s: list(map(int, s.split(",")))
    )
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backends", default="uni,mp")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child's backend
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args, args.one)), flush=True)
        return
    rows = []
    for backend in args.backends.split(","):
        child = [sys.executable, __file__, *sys.argv[1:], "--one", backend]
        out = subprocess.run(child, check=True, stdout=subprocess.PIPE, text=True).stdout
        rows += json.loads(out.strip().splitlines()[-1])
    for row in rows:
        print(json.dumps(row))
    uni = {r["batch"]: r["step_ms"] for r in rows if r["backend"] == "uni"}
    for row in rows:
        if row["backend"] == "mp" and row["batch"] in uni:
            extra = row["step_ms"] - uni[row["batch"]]
            print(
                f"batch {row['batch']}: mp {extra:+.4f} ms per step over uni ({uni[row['batch']]} ms)"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
