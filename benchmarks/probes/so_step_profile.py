"""Where the host time of a constrained step goes: one batch on the default model (CPU), every
request constrained (or none), each part of the step timed by wrapping its function in place.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/probes/so_step_profile.py [--batch 64]
        [--output-len 16] [--schema long-string|object] [--unconstrained] [--async-scheduling]
    PYTHONPATH=$PWD python3 benchmarks/probes/so_step_profile.py --device cuda \
        --model qwen3-0.6b --batch 256 --input-len 128 --output-len 128 --async-scheduling \
        --tokenizer .devtok   (SmolLM2's tokenizer saved by transformers: no GGUF there)

(The second: dummy weights of that shape in bf16, structured_outputs_cost.py's build_llm; the
parts then also include the launches, the wait for a step's output and the engine's whole step.)

Parts: schedule, the matchers' advance (accept_token over the step's tokens), the bitmask fill
(xgrammar's batch fill), its staging (numpy -> the pinned / device rows), the forward, the mask's
application, the sampler, the scheduler's update. Per step: the mean wall ms of each part and the
thread CPU ms (the machine is shared; CPU time is what other jobs do not inflate), over the steps of
one generate after a warm-up generate (the grammar compiles there).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pagedlm import LLM, SamplingParams  # noqa: E402
from pagedlm.sampling_params import StructuredOutputsParams  # noqa: E402

SCHEMAS = {
    "long-string": {"type": "string", "minLength": 100_000},  # structured_outputs_cost.py's
    "object": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "count": {"type": "integer"},
        },
        "required": ["name", "tags", "count"],
    },
}


class PartTimer:
    def __init__(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, owner: object, attr: str, part: str) -> None:
        fn = getattr(owner, attr)

        def timed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            start, start_cpu = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.wall[part] += time.perf_counter() - start
                self.cpu[part] += time.thread_time() - start_cpu
                self.calls[part] += 1

        setattr(owner, attr, timed)

    def reset(self) -> None:
        self.wall.clear()
        self.cpu.clear()
        self.calls.clear()


def install(timer: PartTimer) -> None:
    from pagedlm.core import scheduler
    from pagedlm.engine import llm_engine
    from pagedlm.executor import uni
    from pagedlm.sample import state
    from pagedlm.structured_outputs import manager
    from pagedlm.worker import grammar_inputs, model_runner, runner_output

    fill_owner = manager.StructuredOutputManager  # `bitmask` before the overlap, then `fill`
    for owner, attr, part in [
        (scheduler.Scheduler, "schedule", "schedule"),
        (scheduler.Scheduler, "update_from_output", "update (incl. advance)"),
        (manager.GrammarState, "accept_token", "advance"),
        (fill_owner, "bitmask" if hasattr(fill_owner, "bitmask") else "fill", "fill"),
        (grammar_inputs.GrammarInputs, "stage", "stage"),
        (model_runner.ModelRunner, "_forward", "forward"),
        (model_runner, "apply_grammar_bitmask", "mask apply"),
        (state.SamplingState, "sample", "sample"),
        (manager.StructuredOutputManager, "constrained_rows", "constrained rows"),
        (uni.UniExecutor, "execute_forward", "launch forward"),
        (uni.UniExecutor, "sample_tokens", "launch sampling"),
        (runner_output.AsyncRunnerOutput, "get_output", "wait + read output"),
        (llm_engine.LLMEngine, "step", "engine step (all)"),
    ]:
        if hasattr(owner, attr):
            timer.wrap(owner, attr, part)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--schema", default="long-string", choices=sorted(SCHEMAS))
    parser.add_argument("--unconstrained", action="store_true")
    parser.add_argument("--async-scheduling", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--model", default="default", choices=["default", "qwen3-0.6b", "llama3-8b"]
    )
    parser.add_argument("--tokenizer", default=None, help="the dummy shapes' (default: SmolLM2's)")
    args = parser.parse_args()
    if args.model == "default":
        llm = LLM(device=args.device, seed=0, async_scheduling=args.async_scheduling)
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from structured_outputs_cost import build_llm

        llm = build_llm(args)
    timer = PartTimer()
    install(timer)
    rng = random.Random(0)
    prompts = [[rng.randrange(49152) for _ in range(args.input_len)] for _ in range(args.batch)]
    constraint = (
        None
        if args.unconstrained
        else StructuredOutputsParams(json=SCHEMAS[args.schema], disable_any_whitespace=True)
    )
    params = SamplingParams(
        temperature=0.0, max_tokens=args.output_len, ignore_eos=True, structured_outputs=constraint
    )
    llm.generate(prompts, params, use_tqdm=False)  # warm-up, the compile
    timer.reset()
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    num_steps = timer.calls["schedule"]
    rows = {
        part: {
            "calls": timer.calls[part],
            "wall_ms_per_step": 1e3 * timer.wall[part] / num_steps,
            "cpu_ms_per_step": 1e3 * timer.cpu[part] / num_steps,
        }
        for part in timer.wall
    }
    print(f"{num_steps} steps (schedule calls), {elapsed:.2f} s, batch {args.batch}")
    print(f"{'part':24} {'calls':>6} {'wall ms/step':>13} {'CPU ms/step':>12}")
    for part, row in rows.items():
        print(
            f"{part:24} {row['calls']:6d} {row['wall_ms_per_step']:13.3f} "
            f"{row['cpu_ms_per_step']:12.3f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "parts": rows}, indent=1))


if __name__ == "__main__":
    main()
