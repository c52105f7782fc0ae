"""Sampler overhead: the same workload with every sampling feature off vs temperature + top-p +
penalties on, through LLM.generate.

    .venv/bin/python benchmarks/sampler_overhead.py [--num-prompts 64] [--input-len 32]
        [--output-len 32] [--repeats 3] [--load-format dummy] [--device cpu]
        [--max-num-batched-tokens N]

The default model (SmolLM2-135M-Instruct; `--load-format dummy`: its shapes with random
weights, the same compute), prompts of random token ids, exactly `--output-len` tokens each
(ignore_eos). Settings: "greedy" (no feature), "random" (temperature 1, nothing else),
"full" (temperature 0.8, top_p 0.9, repetition 1.1, presence 0.5, frequency 0.5). The settings
run in turn, `--repeats` rounds after one warm-up; the median output tokens/s is reported.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pagedlm import LLM, SamplingParams  # noqa: E402

SETTINGS = {
    "greedy": dict(temperature=0.0),
    "random": dict(temperature=1.0, seed=0),
    "full": dict(temperature=0.8, top_p=0.9, repetition_penalty=1.1, presence_penalty=0.5,
                 frequency_penalty=0.5, seed=0),
}


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="default: the default model")
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    return parser.parse_args()


def _run(llm: LLM, prompts: list[list[int]], setting: str, output_len: int) -> float:
    """Output tokens per second of one generate call."""
    params = SamplingParams(max_tokens=output_len, ignore_eos=True, **SETTINGS[setting])
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed


def main() -> None:
    args = _parse_args()
    llm = LLM(args.model, load_format=args.load_format, device=args.device, dtype="float32",
              skip_tokenizer_init=True, max_model_len=args.input_len + args.output_len + 16,
              enable_prefix_caching=False, max_num_batched_tokens=args.max_num_batched_tokens)
    vocab_size = llm.llm_engine.model_config.vocab_size
    rng = np.random.default_rng(0)
    prompts = [rng.integers(100, vocab_size, args.input_len).tolist()
               for _ in range(args.num_prompts)]
    for setting in SETTINGS:  # warm-up
        _run(llm, prompts[:4], setting, 4)
    rates: dict[str, list[float]] = {setting: [] for setting in SETTINGS}
    for _ in range(args.repeats):
        for setting in SETTINGS:
            rates[setting].append(_run(llm, prompts, setting, args.output_len))
    base = statistics.median(rates["greedy"])
    print(f"{args.num_prompts} prompts x {args.input_len} tokens, {args.output_len} output tokens, "
          f"device {args.device}, load_format {args.load_format}; median of {args.repeats}")
    print("| setting | output tok/s (median) | runs | vs greedy |")
    print("|---|---|---|---|")
    for setting, values in rates.items():
        median = statistics.median(values)
        runs = ", ".join(f"{v:.0f}" for v in values)
        print(f"| {setting} | {median:.1f} | {runs} | {100 * (median / base - 1):+.1f}% |")


if __name__ == "__main__":
    main()
