"""CPU: pagedlm against transformers' batched generate on the same ragged prompts.

    .venv/bin/python benchmarks/cpu_vs_transformers.py [--num-prompts 64] [--output-len 64]

The default model (SmolLM2-135M-Instruct GGUF, float32), prompts of random token ids with
lengths uniform in [16, 512], `--output-len` tokens each (ignore_eos, greedy). transformers
loads the same GGUF and runs `generate` on left-padded batches; the best of the batch sizes
tried is reported. One warm-up each. Prints a table last.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def make_prompts(num: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(16, 513, num)
    return [rng.integers(100, vocab_size, n).tolist() for n in lengths]


def time_pagedlm(prompts: list[list[int]], output_len: int) -> float:
    from pagedlm import LLM, SamplingParams

    llm = LLM(skip_tokenizer_init=True)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    llm.generate([{"prompt_token_ids": p} for p in prompts[:2]], params, use_tqdm=False)
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert all(len(o.outputs[0].token_ids) == output_len for o in outs)
    return elapsed


def time_transformers(prompts: list[list[int]], output_len: int, batch_size: int) -> float:
    from transformers import AutoModelForCausalLM

    from pagedlm.config import default_model_path

    path = Path(default_model_path())
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    kwargs = dict(
        max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False, pad_token_id=0
    )

    def run(batch: list[list[int]]) -> None:
        width = max(map(len, batch))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, **kwargs)

    run(prompts[:2])
    start = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        run(prompts[i : i + batch_size])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--batch-sizes", default="16,64")
    args = parser.parse_args()
    prompts = make_prompts(args.num_prompts, 49152)
    num_out = args.num_prompts * args.output_len
    rows = [("pagedlm", time_pagedlm(prompts, args.output_len))]
    for batch in map(int, args.batch_sizes.split(",")):
        rows.append(
            (
                f"transformers generate, batch {batch}",
                time_transformers(prompts, args.output_len, batch),
            )
        )
    best_peer = min(t for name, t in rows[1:])
    print(
        json.dumps(
            {
                "prompt_tokens": sum(map(len, prompts)),
                "output_tokens": num_out,
                "seconds": dict(rows),
                "threads": torch.get_num_threads(),
            }
        )
    )
    print(f"\n{'engine':36} {'seconds':>8} {'out tok/s':>10}")
    for name, seconds in rows:
        print(f"{name:36} {seconds:8.1f} {num_out / seconds:10.1f}")
    print(f"pagedlm speed-up over the best transformers run: {best_peer / rows[0][1]:.2f}x")


if __name__ == "__main__":
    main()
