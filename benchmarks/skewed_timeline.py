"""GPU: where T4's time goes (issue 31), offline, one llama3-8b engine (dummy weights, bf16).

    python benchmarks/skewed_timeline.py --out DIR [--runs t4,t4-b8k,t4-b2k,t4-b2k-lf,serve-offline]

Each run is one timed LLM.generate after the engine's warm-up, with a StepLog (step_log.py) on
the engine core; printed: the step kinds, the timeline by tenths, the tail, the notable requests,
and the roofline floor. Runs:
  t4                T4 as defined (benchmarks/skewed_mix.py), submitted in its order
  t4-bNk            T4 with max_num_batched_tokens N x 1,024 (the scheduler's config swapped at run
                    time; at 2k every step fits the piecewise graphs)
  t4[-bNk]-lf       the same requests submitted longest max_tokens first
  t4...-plain       without the prefill spread (core/prefill_spread.py): every step's budget on
                    prompts, in arrival order (the scheduler's spread unset at run time)
  serve-offline     serve_gpu.sh's prompts (random, 500 x 512 / 128, dataset seed 0, temperature 1):
                    the offline step rate to hold the served one against
DIR gets steps_<run>.json (every step and request) and summary.json. --num-requests and
--serve-prompts make it a quick check.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import skewed_mix  # noqa: E402
from gpu_workloads import model_dir  # noqa: E402
from step_log import StepLog, summarize  # noqa: E402

from pagedlm import LLM, SamplingParams  # noqa: E402
from pagedlm.bench.datasets import sample_requests  # noqa: E402
from pagedlm.bench.roofline import ModelCost, generation_floor  # noqa: E402

RUNS = ("t4", "t4-b8k", "t4-b2k", "t4-b2k-lf", "serve-offline")


def run_inputs(run: str, num_requests: int, vocab_size: int) -> tuple[list, list]:
    """-> (prompts as token ids, SamplingParams of each) of a run (serve-offline: num_requests
    of serve_gpu.sh's)."""
    if run == "serve-offline":
        data = SimpleNamespace(
            dataset="random",
            dataset_seed=0,
            num_prompts=num_requests,
            input_len=512,
            output_len=128,
            range_ratio=0.0,
        )
        requests = sample_requests(data, vocab_size)  # what `bench serve` sends at seed 0
        prompts = [r.prompt_token_ids for r in requests]
        return prompts, [
            SamplingParams(temperature=1.0, max_tokens=r.output_len, ignore_eos=True)
            for r in requests
        ]
    prompts, max_tokens = skewed_mix.skewed_mix(num_requests)
    params = [
        SamplingParams(
            temperature=skewed_mix.TEMPERATURE,
            top_p=skewed_mix.TOP_P,
            max_tokens=m,
            ignore_eos=True,
            seed=i,
        )
        for i, m in enumerate(max_tokens)
    ]
    if "-lf" in run:
        order = sorted(range(len(prompts)), key=lambda i: -max_tokens[i])
        return [prompts[i] for i in order], [params[i] for i in order]
    return prompts, params


def warm_up(llm: LLM) -> None:
    """16 of T4's requests, 16 tokens each, their prompts reversed (other ids than T4's)."""
    prompts, params = run_inputs("t4", 16, llm.llm_engine.model_config.vocab_size)
    warm = [dataclasses.replace(p, max_tokens=16) for p in params]
    llm.generate([{"prompt_token_ids": p[::-1]} for p in prompts], warm, use_tqdm=False)


def timed_run(llm: LLM, run: str, num_requests: int, out: Path) -> dict:
    engine = llm.llm_engine
    core = engine.engine_core
    default_config, default_spread = core.scheduler.config, core.scheduler.spread
    if run.endswith("-plain"):
        core.scheduler.spread = None
    budget = re.search(r"-b(\d+)k", run)
    if budget:
        core.scheduler.config = dataclasses.replace(
            default_config, max_num_batched_tokens=1024 * int(budget.group(1))
        )
    prompts, params = run_inputs(run, num_requests, engine.model_config.vocab_size)
    schedule, update = core.scheduler.schedule, core.scheduler.update_from_output
    log = StepLog.attach(core)
    print(f"\n=== {run}: {len(prompts)} requests", flush=True)
    start = time.perf_counter()
    # a salt per run: no run takes another's prompts from the prefix cache
    inputs = [{"prompt_token_ids": p, "cache_salt": run} for p in prompts]
    outs = llm.generate(inputs, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    core.scheduler.schedule, core.scheduler.update_from_output = schedule, update
    core.scheduler.config, core.scheduler.spread = default_config, default_spread
    num_out = sum(len(o.outputs[0].token_ids) for o in outs)
    assert num_out == sum(p.max_tokens for p in params)
    num_cached = sum(o.num_cached_tokens for o in outs)
    floor = generation_floor(
        ModelCost.of(engine.model_config),
        list(map(len, prompts)),
        [p.max_tokens for p in params],
        default_config.max_num_seqs,
    )
    figures = summarize(log, start)
    figures.update(
        run=run,
        elapsed_s=elapsed,
        output_tok_s=num_out / elapsed,
        floor_s=floor.seconds,
        longest_output=max(p.max_tokens for p in params),
        cached_prompt_tokens=num_cached,
    )
    print(
        f"{run}: {elapsed:.2f} s, {num_out / elapsed:,.0f} output tok/s, {num_cached} prompt "
        f"tokens from the prefix cache; roofline floor "
        f"{floor.seconds:.2f} s ({floor.describe(elapsed)})",
        flush=True,
    )
    steps = [dataclasses.asdict(s) for s in log.steps]
    requests = {k: dataclasses.asdict(r) for k, r in log.requests.items()}
    (out / f"steps_{run}.json").write_text(
        json.dumps({"start": start, "steps": steps, "requests": requests})
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--runs", default=",".join(RUNS))
    parser.add_argument("--model-shape", default="llama3-8b")
    parser.add_argument("--num-requests", type=int, default=skewed_mix.NUM_REQUESTS)
    parser.add_argument("--serve-prompts", type=int, default=500, help="serve-offline's prompts")
    parser.add_argument("--engine-args", default="{}", help="JSON dict of extra LLM(...) arguments")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        engine_args = {"dtype": "bfloat16", **json.loads(args.engine_args)}
        llm = LLM(
            model_dir(args.model_shape, Path(tmp)),
            load_format="dummy",
            skip_tokenizer_init=True,
            **engine_args,
        )
        warm_up(llm)
        rows = []
        for run in args.runs.split(","):
            num = args.serve_prompts if run == "serve-offline" else args.num_requests
            rows.append(timed_run(llm, run, num, out))
            (out / "summary.json").write_text(json.dumps(rows, indent=1))
    print(
        f"\n{'run':18} {'seconds':>8} {'out tok/s':>10} {'floor s':>8} {'tail s':>7} {'steps':>6}"
    )
    for r in rows:
        print(
            f"{r['run']:18} {r['elapsed_s']:8.2f} {r['output_tok_s']:10,.0f} {r['floor_s']:8.2f} "
            f"{r['tail']['seconds']:7.2f} {r['steps']:6d}"
        )


if __name__ == "__main__":
    main()
