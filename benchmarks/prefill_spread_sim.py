"""CPU: T4 under idealised schedules that spread its prompts over the run (issue 31, the plan
after the split decode), costed per step with step_cost_model.py's H200 rates.

    python benchmarks/prefill_spread_sim.py [--caps 16384,8192,2048,1024,512,256] [--fill]
    python benchmarks/prefill_spread_sim.py --scheduler [--workloads T4,T1] [--spreads 256/1024]

Every request is admitted at once (T4 fits the KV cache and max_num_seqs); each step runs every
decoding request's one token, then prompt chunks of at most `cap` tokens in all (--fill: up to
`cap` rows with the decodes), within the 16,384-token step budget, from requests in admission
order: as submitted (fcfs) or by max_tokens, the longest output first (lof). A prompt's last chunk
samples its first token. No host time, no preemption; decode steps costed as the model costs them
(T4's measured decode steps are ~1.1x the model with the split decode:
benchmarks/results/2026-12-02-h200-s21/split/timeline_vs_model.txt). Prints the modelled seconds,
the steps and the step of the last prompt chunk per (order, cap).
--scheduler: the real Scheduler instead (step_cost_model.schedule), with its prefill spread
(pagedlm/core/prefill_spread.py) off, then at each target_rows/max_wait_steps of --spreads: the
modelled seconds and steps per workload (any workload's schedule at llama3-8b's rates).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import skewed_mix  # noqa: E402
from step_cost_model import Rates, Step, schedule, step_seconds  # noqa: E402

from pagedlm.core.prefill_spread import PrefillSpread  # noqa: E402

STEP_BUDGET = 16384


def simulate(
    prompt_lens: list[int], output_lens: list[int], order: list[int], cap: int, fill: bool
) -> dict:
    """One schedule -> modelled seconds, steps, and the prompt phase's end (the step of the last
    prompt chunk). fill: a step's rows in all (decodes and prompt tokens) at most cap."""
    done_prompt = [0] * len(prompt_lens)  # prompt tokens computed
    made = [0] * len(prompt_lens)  # output tokens sampled
    queue = list(order)  # requests with prompt tokens left, in admission order
    seconds, steps, prompt_end = 0.0, 0, 0
    while queue or any(m < n for m, n in zip(made, output_lens)):
        decoding = [i for i in range(len(made)) if done_prompt[i] == prompt_lens[i]]
        decoding = [i for i in decoding if 0 < made[i] < output_lens[i]]
        kv = sum(prompt_lens[i] + made[i] for i in decoding)
        room = min(cap - len(decoding) if fill else cap, STEP_BUDGET - len(decoding))
        chunk_tokens = visible = finished_prompts = 0
        while queue and room > 0:
            i = queue[0]
            take = min(room, prompt_lens[i] - done_prompt[i])
            visible += take * done_prompt[i] + take * (take + 1) // 2
            done_prompt[i] += take
            chunk_tokens += take
            room -= take
            if done_prompt[i] == prompt_lens[i]:
                queue.pop(0)
                made[i] = 1  # the last chunk samples the first token
                finished_prompts += 1
        for i in decoding:
            made[i] += 1
        step = Step(len(decoding) + chunk_tokens, len(decoding) + finished_prompts, kv, visible)
        seconds += sum(step_seconds(step, Rates()).values())
        steps += 1
        if chunk_tokens:
            prompt_end = steps
    return {"seconds": seconds, "steps": steps, "prompt_end": prompt_end}


def scheduler_sweep(workloads: list[str], spreads: list[str]) -> None:
    """The real Scheduler's schedule of each workload, spread off and at each spread setting."""

    def configure(setting: str):
        def apply(sched) -> None:
            if setting == "off":
                sched.spread = None
                return
            rows, wait = map(int, setting.split("/"))
            sched.spread = PrefillSpread(sched.config.max_num_batched_tokens, rows, wait)

        return apply

    print(f"{'workload':14} {'spread rows/wait':>16} {'modelled s':>10} {'steps':>6}")
    for wid in workloads:
        for setting in ["off", *spreads]:
            steps = schedule(wid, configure(setting))
            seconds = sum(sum(step_seconds(step, Rates()).values()) for step in steps)
            print(f"{wid:14} {setting:>16} {seconds:10.2f} {len(steps):6d}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--caps", default="16384,8192,2048,1024,512,256")
    parser.add_argument("--fill", action="store_true", help="cap a step's rows, decodes included")
    parser.add_argument("--scheduler", action="store_true", help="the real Scheduler's schedules")
    parser.add_argument("--workloads", default="T4")
    parser.add_argument("--spreads", default="0/1024,256/1024,512/1024,256/512,256/256")
    args = parser.parse_args()
    if args.scheduler:
        scheduler_sweep(args.workloads.split(","), args.spreads.split(","))
        return
    prompts, output_lens = skewed_mix.skewed_mix()
    prompt_lens = list(map(len, prompts))
    orders = {
        "fcfs": list(range(len(prompts))),
        "lof": sorted(range(len(prompts)), key=lambda i: -output_lens[i]),
    }
    print(f"{'order':6} {'cap':>6} {'modelled s':>10} {'steps':>6} {'prompts done at step':>21}")
    for name, order in orders.items():
        for cap in map(int, args.caps.split(",")):
            r = simulate(prompt_lens, output_lens, order, cap, args.fill)
            print(f"{name:6} {cap:6d} {r['seconds']:10.2f} {r['steps']:6d} {r['prompt_end']:21d}")


if __name__ == "__main__":
    main()
