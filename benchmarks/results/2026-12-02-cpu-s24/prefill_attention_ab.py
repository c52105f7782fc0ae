"""A/B in one process: the CPU backend's prefill attention, fused tiles (attend_prefill) against
the reference's (torch_ref.attend_sequence), interleaved: the default model's 512-token TTFT, or
(--batch16) 16 prompts of 128 tokens -> 64 tokens each (cpu_peers.py's batch workload).

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/results/2026-12-02-cpu-s24/prefill_attention_ab.py
"""

import random
import statistics
import sys
import time

from pagedlm import LLM, SamplingParams
from pagedlm.attention import torch_batched, torch_ref

fused = torch_batched.attend_prefill
llm = LLM(max_model_len=1024)
rng = random.Random(0)
batch16 = "--batch16" in sys.argv
params = SamplingParams(max_tokens=64 if batch16 else 1, temperature=0, ignore_eos=True)
num, length = (16, 128) if batch16 else (1, 512)
times: dict[str, list[tuple[float, float]]] = {"fused": [], "reference": []}
for round_index in range(6):
    for name, impl in (("fused", fused), ("reference", torch_ref.attend_sequence)):
        torch_batched.attend_prefill = impl
        prompts = [
            {"prompt_token_ids": [rng.randrange(100, 49152) for _ in range(length)]}
            for _ in range(num)
        ]
        start, start_cpu = time.perf_counter(), time.process_time()
        llm.generate(prompts, params, use_tqdm=False)
        if round_index:  # the first round warms up
            times[name].append((time.perf_counter() - start, time.process_time() - start_cpu))
for name, runs in times.items():
    wall = statistics.median(r[0] for r in runs) * 1e3
    cpu = statistics.median(r[1] for r in runs) * 1e3
    what = "16 x 128 -> 64, generate" if batch16 else "TTFT 512"
    print(f"{name:9} {what} median wall {wall:.1f} ms, CPU {cpu:.1f} ms")
