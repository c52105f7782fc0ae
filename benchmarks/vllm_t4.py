"""vLLM's side of workload T4: shared/peers/vllm/bench_vllm.py with T4 (benchmarks/skewed_mix.py)
added to its workloads, the rest unchanged. Copy this file and skewed_mix.py beside bench_vllm.py
(the device gets the repo, not ../shared) and run it in bench_vllm.py's place:

    python3 vllm_t4.py --model MODELS/llama3-8b --name t4 --workloads T4 --out t4.json

SamplingParams as pagedlm's: temperature 0.7, top_p 0.9, seed = the request's index, ignore_eos.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_vllm  # noqa: E402
import skewed_mix  # noqa: E402

_build = bench_vllm.build


def build(name: str, SamplingParams, seed: int = 0):  # noqa: N803 - bench_vllm's signature
    if name != "T4":
        return _build(name, SamplingParams, seed)
    prompts, max_tokens = skewed_mix.skewed_mix(seed=skewed_mix.SEED + seed)
    params = [
        bench_vllm.sp(
            SamplingParams, m, temperature=skewed_mix.TEMPERATURE, top_p=skewed_mix.TOP_P, seed=i
        )
        for i, m in enumerate(max_tokens)
    ]
    return prompts, params, {"sampling": "temperature 0.7, top_p 0.9, a seed per request"}


if __name__ == "__main__":
    bench_vllm.build = build
    bench_vllm.main()
