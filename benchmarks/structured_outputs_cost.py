"""The cost of structured outputs: the same batch with and without a JSON schema on every request.

    .venv/bin/python benchmarks/structured_outputs_cost.py [--device cpu] [--model default]
        [--batch 64] [--input-len 32] [--output-len 32] [--repeats 3] [--temperature 0]
        [--async-scheduling | --no-async-scheduling] [--mixed]
    .venv/bin/python benchmarks/structured_outputs_cost.py --device cuda --model qwen3-0.6b \
        --batch 256 --output-len 128        (or llama3-8b: dummy weights, bf16)

`--model default`: SmolLM2-135M-Instruct (its real weights); `qwen3-0.6b` / `llama3-8b`: dummy
weights of those shapes (benchmarks/gpu_workloads.py), with SmolLM2's tokenizer padded to the
model's vocabulary (the bitmask has the model's width; ids past the tokenizer are never allowed).
Prompts are random token ids. The constraint is a JSON string of at least 100,000 characters: it
allows nearly every token and never ends within --output-len, so both settings generate exactly
batch x output-len tokens (the unconstrained one with ignore_eos), and a garbage model's output
stays inside it. `--mixed`: a third setting, half the batch constrained. One warm-up per setting
(the grammar is compiled there); reported: the median output tokens per wall second and per second
of the process's CPU time (what to read on a shared CPU machine), their ratios to unconstrained,
the share of the CPU time spent in structured outputs' host functions (so_host_share: the step's
rows, the bitmask fill, the matchers' advance, staging, the mask's application; other jobs on the
machine do not skew it), and the structured-outputs counters (compiles, compile seconds, step-loop
waits on a compile).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pagedlm import LLM, SamplingParams  # noqa: E402
from pagedlm.config import default_model_path  # noqa: E402
from pagedlm.sampling_params import StructuredOutputsParams  # noqa: E402

SCHEMA = {"type": "string", "minLength": 100_000}


def build_llm(args: argparse.Namespace) -> LLM:
    engine_args = dict(device=args.device, seed=0, async_scheduling=args.async_scheduling)
    if args.model == "default":
        return LLM(**engine_args)
    from gpu_workloads import model_dir

    folder = model_dir(args.model, Path(tempfile.mkdtemp()))
    return LLM(
        str(folder),
        tokenizer=args.tokenizer or default_model_path(),
        load_format="dummy",
        dtype="bfloat16" if args.device == "cuda" else "float32",
        max_model_len=args.input_len + args.output_len + 16,
        **engine_args,
    )


class HostTimer:
    """Thread CPU seconds spent in structured outputs' host functions (the step's rows, the
    bitmask fill, the matchers' advance, the bitmask's staging and its application), wrapped in
    place."""

    def __init__(self) -> None:
        from pagedlm.structured_outputs import manager
        from pagedlm.worker import grammar_inputs, model_runner

        self.seconds = 0.0
        targets = [
            (manager.StructuredOutputManager, "constrained_rows"),
            (manager.StructuredOutputManager, "fill"),
            (manager.GrammarState, "accept_token"),
            (grammar_inputs.GrammarInputs, "stage"),
            (model_runner, "apply_grammar_bitmask"),
        ]
        for owner, name in targets:
            setattr(owner, name, self._timed(getattr(owner, name)))

    def _timed(self, fn):  # noqa: ANN001, ANN202
        def timed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.thread_time() - start

        return timed


def params_for(args: argparse.Namespace, constrained: bool) -> SamplingParams:
    return SamplingParams(
        temperature=args.temperature,
        seed=None if args.temperature == 0 else 1,
        max_tokens=args.output_len,
        ignore_eos=True,
        structured_outputs=StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
        if constrained
        else None,
    )


def run(
    llm: LLM, prompts: list[list[int]], params: list[SamplingParams]
) -> tuple[float, float, int]:
    """Wall seconds, the process's CPU seconds (which other jobs on a shared machine do not
    inflate), output tokens."""
    start, start_cpu = time.perf_counter(), time.process_time()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    return elapsed, cpu, sum(len(o.outputs[0].token_ids) for o in outputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--model", default="default", choices=["default", "qwen3-0.6b", "llama3-8b"]
    )
    parser.add_argument(
        "--tokenizer", default=None, help="for the dummy shapes (default: the default model's GGUF)"
    )
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument(
        "--mixed", action="store_true", help="also a setting with half the batch constrained"
    )
    args = parser.parse_args()
    llm = build_llm(args)
    timer = HostTimer()
    rng = random.Random(0)
    vocab = min(llm.llm_engine.model_config.vocab_size, 49152)  # ids the tokenizer knows
    prompts = [[rng.randrange(vocab) for _ in range(args.input_len)] for _ in range(args.batch)]
    settings = {
        "unconstrained": [params_for(args, False)] * args.batch,
        "json schema": [params_for(args, True)] * args.batch,
    }
    if args.mixed:
        settings["half json"] = [params_for(args, i % 2 == 0) for i in range(args.batch)]
    rows = {}
    for name, params in settings.items():
        run(llm, prompts, params)  # warm-up (and the grammar's compile)
        timer.seconds = 0.0
        results = [run(llm, prompts, params) for _ in range(args.repeats)]
        host_share = timer.seconds / sum(r[1] for r in results)
        num_tokens = results[0][2]
        assert num_tokens == args.batch * args.output_len, (name, num_tokens)
        wall, cpu = (statistics.median(r[i] for r in results) for i in (0, 1))
        rows[name] = (num_tokens / wall, num_tokens / cpu)
        print(
            json.dumps({"setting": name, "runs": results, "so_host_share": host_share}), flush=True
        )
    base_wall, base_cpu = rows["unconstrained"]
    print(f"\n{'setting':16} {'tok/s wall':>10} {'ratio':>6} {'tok/s CPU':>10} {'ratio':>6}")
    for name, (wall, cpu) in rows.items():
        print(f"{name:16} {wall:10.1f} {wall / base_wall:6.3f} {cpu:10.1f} {cpu / base_cpu:6.3f}")
    print(f"structured outputs: {llm.llm_engine.engine_core.structured_outputs.stats}")


if __name__ == "__main__":
    main()
