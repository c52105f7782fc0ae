"""CPU: pagedlm (default quantized path and dtype=float32) against transformers on the default model.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/cpu_peers.py [--repeats 3] [--engines ...]

The issue-31 workloads on SmolLM2-135M-Instruct Q4_1 GGUF, greedy, ignore_eos, random token ids:
single stream (32-token prompt, 128 tokens: decode tok/s after the first token), TTFT of a
512-token prompt, 16 x 128-token prompts -> 64 tokens each (total output tok/s), and the resident
memory of the process after its single stream. Each engine runs in a fresh process (so RSS is its
own) and the engines are interleaved, `--repeats` rounds; the table gives medians and [min, max].
llama.cpp (llama-cpp-python) has no binary wheel for this machine's Python; with one installed in
another environment, pass its python as --llama-cpp-python to add it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MEASURES = ("decode_tok_s", "ttft_512_ms", "batch16_tok_s", "rss_mib")


def prompts(num: int, length: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(100, 49152) for _ in range(length)] for _ in range(num)]


def rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def measure(first_token, generate, batch) -> dict[str, float]:
    """first_token(ids) and generate(ids, n) time one sequence; batch(list of ids, n) many."""
    single = prompts(1, 32, 1)[0]
    generate(single, 8)  # warm-up
    # the same prompt both times (a prefix-cache hit for pagedlm both times): the difference is
    # the 127 decode steps
    t_first = min(timed(first_token, single) for _ in range(2))
    t_all = timed(generate, single, 128)
    result = {"decode_tok_s": 127 / (t_all - t_first), "rss_mib": rss_mib()}
    warm_up, *fresh = prompts(4, 512, 2)  # fresh prompts: no prefix-cache hit
    first_token(warm_up)
    result["ttft_512_ms"] = 1000 * statistics.median(timed(first_token, p) for p in fresh)
    many = prompts(16, 128, 3)
    result["batch16_tok_s"] = 16 * 64 / timed(batch, many, 64)
    return result


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def run_pagedlm(dtype: str) -> dict[str, float]:
    from pagedlm import LLM, SamplingParams

    llm = LLM(skip_tokenizer_init=True, dtype=dtype)

    def gen(batch: list[list[int]], n: int) -> None:
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
        assert all(len(o.outputs[0].token_ids) == n for o in outs)

    return measure(lambda ids: gen([ids], 1), lambda ids, n: gen([ids], n), gen)


def run_transformers() -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM

    from pagedlm.config import default_model_path

    path = Path(default_model_path())
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()

    def gen(batch: list[list[int]], n: int) -> None:
        ids = torch.tensor(batch)  # equal lengths: no padding
        with torch.no_grad():
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
            )

    return measure(lambda ids: gen([ids], 1), lambda ids, n: gen([ids], n), gen)


def run_llama_cpp() -> dict[str, float]:
    from llama_cpp import Llama

    from pagedlm.config import default_model_path

    threads = int(os.environ.get("OMP_NUM_THREADS", "2"))
    llm = Llama(default_model_path(), n_ctx=1024, n_threads=threads, verbose=False)

    def gen(batch: list[list[int]], n: int) -> None:
        for ids in batch:  # llama-cpp-python's high-level API runs one sequence at a time
            llm.reset()
            for count, _ in enumerate(llm.generate(ids, temp=0.0)):
                if count + 1 == n:
                    break

    return measure(lambda ids: gen([ids], 1), lambda ids, n: gen([ids], n), gen)


ENGINES = {
    "pagedlm": lambda: run_pagedlm("auto"),
    "pagedlm-float32": lambda: run_pagedlm("float32"),
    "transformers": run_transformers,
    "llama.cpp": run_llama_cpp,
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", default="pagedlm,pagedlm-float32,transformers")
    parser.add_argument("--llama-cpp-python", help="a python with llama_cpp installed")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(ENGINES[args.worker]()), flush=True)
        return
    engines = args.engines.split(",") + (["llama.cpp"] if args.llama_cpp_python else [])
    results: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
    for round_ in range(args.repeats):
        for name in engines:
            python = args.llama_cpp_python if name == "llama.cpp" else sys.executable
            results[name].append(worker(python, name))
            print(f"round {round_ + 1} {name}: {json.dumps(results[name][-1])}", flush=True)
    print(f"\nthreads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    print(f"{'engine':16}" + "".join(f"{m:>26}" for m in MEASURES))
    for name, runs in results.items():
        cells = []
        for m in MEASURES:
            values = [run[m] for run in runs]
            cells.append(f"{statistics.median(values):8.1f} [{min(values):.1f}, {max(values):.1f}]")
        print(f"{name:16}" + "".join(f"{c:>26}" for c in cells))


def worker(python: str, name: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [python, __file__, "--worker", name], env=env, capture_output=True, text=True, check=True
    )
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


if __name__ == "__main__":
    main()
