"""CPU: a GPU workload's schedule through the real Scheduler, with a runner that returns a token for
every sampling request and a cost model of llama3-8b on the H200 per step, to see what admission
and preemption do before spending GPU time.

    python benchmarks/scheduler_sim.py [--workloads T2,T3-off,T3-on] [--no-growth-reserve]

Cost of a step (seconds): max(tokens x 15 GFLOP / 700 TFLOP/s, 16 GB of weights / 4.2 TB/s) for the
GEMMs, plus context tokens read x 131 kB of KV / 3.5 TB/s for attention. Crude (no GEMM efficiency
by batch size, prefill attention counted like decode), but it ranks schedules; the H200 decides.
Prints per workload: steps, preemptions, tokens computed against the tokens the workload needs,
the modelled time and output tokens/s, the largest batch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_workloads import workload  # noqa: E402

from pagedlm.config import CacheConfig, SchedulerConfig  # noqa: E402
from pagedlm.core.growth import GrowthEstimate  # noqa: E402
from pagedlm.core.sched_output import ModelRunnerOutput, SchedulerOutput  # noqa: E402
from pagedlm.core.scheduler import Scheduler  # noqa: E402
from pagedlm.request import Request  # noqa: E402
from pagedlm.sampling_params import SamplingParams  # noqa: E402

NUM_BLOCKS = 55136  # llama3-8b's KV cache on the H200 at gpu_memory_utilization 0.9 (blocks of 16)
MAX_MODEL_LEN = 8192
GEMM_FLOPS_PER_TOKEN, PEAK_FLOPS = 15e9, 700e12
WEIGHT_BYTES, BANDWIDTH = 16e9, 4.2e12
KV_BYTES_PER_TOKEN, ATTENTION_BANDWIDTH = 131e3, 3.5e12


def prompts_for(wid: str) -> tuple[list[list[int]], list[int], bool]:
    """-> (prompts, max_tokens per prompt, prefix caching) of a gpu_workloads.py workload."""
    _, prompts, max_tokens, _, overrides = workload(wid)
    return prompts, max_tokens, overrides.get("enable_prefix_caching", True)


def scheduled_steps(
    wid: str,
    growth_reserve: bool,
    num_blocks: int = NUM_BLOCKS,
    configure: Callable[[Scheduler], None] | None = None,
) -> Iterator[tuple[Scheduler, SchedulerOutput]]:
    """(the scheduler, its plan) per step of the workload's schedule, before the step's output (a token
    for every sampling request) goes back to it. num_computed_tokens already counts the step's tokens.
    configure: called on the new scheduler (e.g. to set its prefill spread)."""
    prompts, max_tokens, caching = prompts_for(wid)
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=1024, max_num_batched_tokens=16384),
        CacheConfig(block_size=16, enable_prefix_caching=caching),
        num_blocks,
        MAX_MODEL_LEN,
    )
    sched.growth = GrowthEstimate(MAX_MODEL_LEN, enabled=growth_reserve)
    if configure is not None:
        configure(sched)
    for i, (prompt, num_out) in enumerate(zip(prompts, max_tokens)):
        params = SamplingParams(max_tokens=num_out, ignore_eos=True)
        sched.add_request(Request(str(i), prompt, params, max_tokens=num_out))
    while sched.has_unfinished_requests():
        plan = sched.schedule()
        yield sched, plan
        ids = sorted(plan.sampling_req_ids)
        sched.update_from_output(
            plan, ModelRunnerOutput(req_ids=ids, sampled_token_ids=[[7] for _ in ids])
        )


def simulate(wid: str, growth_reserve: bool) -> str:
    num_steps = num_computed = max_batch = 0
    seconds = 0.0
    for sched, plan in scheduled_steps(wid, growth_reserve):
        num_tokens = plan.total_num_scheduled_tokens
        context = sum(sched.requests[r].num_computed_tokens for r in plan.num_scheduled_tokens)
        seconds += max(num_tokens * GEMM_FLOPS_PER_TOKEN / PEAK_FLOPS, WEIGHT_BYTES / BANDWIDTH)
        seconds += context * KV_BYTES_PER_TOKEN / ATTENTION_BANDWIDTH
        num_steps, num_computed = num_steps + 1, num_computed + num_tokens
        max_batch = max(max_batch, len(plan.num_scheduled_tokens))
    prompts, max_tokens, _ = prompts_for(wid)
    num_outputs = sum(max_tokens)
    needed = sum(map(len, prompts)) + num_outputs - len(prompts)  # the last token needs no KV
    return (
        f"{wid:7} reserve={'on ' if growth_reserve else 'off'} steps {num_steps:5d}  preemptions "
        f"{sched.num_preemptions:4d}  tokens computed {num_computed:9d} ({num_computed / needed - 1:+.1%} "
        f"vs needed)  model {seconds:6.1f} s = {num_outputs / seconds:6.0f} out tok/s  max batch {max_batch}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="T2,T3-off,T3-on")
    parser.add_argument(
        "--no-growth-reserve", action="store_true", help="only admission by the prompt"
    )
    args = parser.parse_args()
    for wid in args.workloads.split(","):
        for reserve in [False] if args.no_growth_reserve else [False, True]:
            print(simulate(wid, reserve), flush=True)


if __name__ == "__main__":
    main()
