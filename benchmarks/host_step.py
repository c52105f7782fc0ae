"""Host (Python) cost of one engine step: the CPU proxy for workload L2 (issue 3).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/host_step.py [--batch-sizes 1,32]
        [--input-len 128] [--output-len 512] [--vocab 1024] [--repeats 5] [--device cpu]
        [--count-ops] [--profile out.prof] [--shape qwen3-0.6b] [--graphs] [--temperature 0.6]

A Qwen3-shaped model with dummy weights and a tiny body (hidden 64, 2 layers), float32 on the
CPU, async scheduling on, the H200's engine defaults (max_num_seqs 1024, max_num_batched_tokens
16384, max_model_len 40960), greedy, ignore_eos, prompts of random token ids, through
LLM.generate (the L2 path). Two timings per batch size, each the minimum over --repeats
generate calls after a warm-up, divided by --output-len (one decode step per output token):
- "host": the model forward replaced by a stub that returns a static hidden-state buffer (on
  the H200 a decode forward is one CUDA-graph replay, a few µs of host time); the LM head
  and the sampler still run. This is the step's host cost.
- "full": the real tiny forward as well (its eager torch ops: what the stub took away).
Timings are CPU time of the process on the CPU, wall time with --device cuda; there decode
steps replay the captured CUDA graph, which the stub does not replace (both include it), and
the GPU time of one replay of the batch's decode graph is printed too (replays queued behind a
GPU sleep, so the host's launch time is hidden): a step time close to it means GPU-bound. On
CUDA one more generate call times how long the host blocks on CUDA events per step: what is
left is the host's own work per step, and if that is most of the step, the host is the bound.
--vocab 1024 by default keeps the LM head and argmax cheap on the CPU so that the Python cost
shows; --vocab 151936 gives Qwen3's real logits shapes (then the CPU argmax weighs in).
--count-ops counts, over the steady decode steps of one host run, the torch calls that reach
the dispatcher (aten ops, which cost similar host time on CUDA) per step. --profile writes a
cProfile of one host run at the first batch size (read it with `python -m pstats`).
--shape qwen3-0.6b|llama3-8b uses that model's real shape in bf16 (GPU): then the replay time
printed is the real decode forward's, and the stubbed "host" time is the step without it.
--temperature 0.6 samples as T1 does (a seed per request) instead of greedily: the sampler's
host cost. --ragged gives request i max_tokens drawn from [output_len / 4, output_len] (fixed seed),
so requests finish one by one as in T1 (each finish changes the batch: the steps that re-lay it out);
per-step times then divide by the steps the run took. --graphs (CPU): the CUDA-graph path without CUDA: decode steps of up to the largest capture size
take the runner's graph path (padding, block-table loads, the graph's greedy ids) over stand-in
graphs whose replay launches nothing and whose logits and argmax are static tensors (on CUDA a
replay is one API call, and the LM head, argmax and input gather run inside it); both timings
then time that path, the "full" one with the tiny forward for prefills only.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pagedlm import LLM, SamplingParams  # noqa: E402
from pagedlm.worker.cuda_graphs import DecodeGraphs  # noqa: E402
from pagedlm.worker.sizes import MAX_LOGITS_ROWS  # noqa: E402

TINY_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "tie_word_embeddings": True,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 40960,
    "hidden_act": "silu",
}


class ForwardStub:
    """Stands in for the model: its forward returns rows of a static buffer; everything else
    (compute_logits, embed_tokens) is the real model's."""

    def __init__(self, model: Any, max_num_tokens: int) -> None:
        self._model = model
        weight = model.model.embed_tokens.weight  # [vocab_size, hidden_size]
        self._hidden = torch.zeros(
            max_num_tokens, weight.shape[1], dtype=weight.dtype, device=weight.device
        )  # [max_num_tokens, hidden_size]

    def __call__(self, input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self._hidden[: input_ids.shape[0]]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


class HostGraphs(DecodeGraphs):
    """--graphs: stand-in graphs on the CPU. A replay launches nothing and returns static hidden
    states; sizes up to MAX_LOGITS_ROWS have static logits and argmax (token 0, which last_sampled does not get:
    nothing reads it here, the forward being a stub or prefills only)."""

    def capture(self, stream: Any = None) -> None:
        vocab_size, hidden_size = self._model.config.vocab_size, self._model.config.hidden_size
        for size in self.sizes:
            key = size, None  # no staging sets given: the plain graphs only
            self._graphs[key] = SimpleNamespace(replay=lambda: None)
            self._outputs[key] = torch.zeros(size, hidden_size)
            if size <= MAX_LOGITS_ROWS:
                self._logits[key] = torch.zeros(size, vocab_size)
                self._argmax[key] = torch.zeros(size, dtype=torch.int64)


class OpCounter(TorchDispatchMode):
    """Counts the aten ops that reach the dispatcher."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-sizes", default="1,32")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--count-ops", action="store_true")
    parser.add_argument(
        "--shape",
        default=None,
        choices=["qwen3-0.6b", "llama3-8b"],
        help="a real model's shape in bf16 instead of the tiny body (GPU)",
    )
    parser.add_argument("--profile", default=None, help="write a cProfile of one host run here")
    parser.add_argument(
        "--ragged", action="store_true", help="requests finish one by one (T1-like)"
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="> 0: sample at this temperature, a seed per request (T1: 0.6)",
    )
    parser.add_argument(
        "--graphs",
        action="store_true",
        help="CPU: decode steps take the CUDA-graph path over stand-in graphs",
    )
    args = parser.parse_args()
    if args.graphs and args.device != "cpu":
        parser.error("--graphs stands in for CUDA graphs on the CPU; on CUDA the real ones run")
    return args


def _build(folder: Path, args: argparse.Namespace) -> LLM:
    if args.shape:  # a real model's shape (bf16): the decode-graph replay time of L1/L2
        from gpu_workloads import MODELS

        config, dtype = MODELS[args.shape], "bfloat16"
    else:
        config, dtype = dict(TINY_QWEN3, vocab_size=args.vocab), "float32"
    (folder / "config.json").write_text(json.dumps(config))
    return LLM(
        str(folder),
        load_format="dummy",
        dtype=dtype,
        device=args.device,
        skip_tokenizer_init=True,
        async_scheduling=True,
        max_num_seqs=1024,
        max_num_batched_tokens=16384,
        max_model_len=config["max_position_embeddings"],
        seed=0,
    )


def _params(num_prompts: int, args: argparse.Namespace) -> list[SamplingParams]:
    """Greedy, or sampled at args.temperature with a seed per request (as gpu_workloads.py's T1);
    every request args.output_len tokens, or with --ragged from [output_len / 4, output_len], the
    last one output_len (so the run takes output_len decode steps either way)."""
    rng = random.Random(1)
    lengths = [
        rng.randint(max(args.output_len // 4, 1), args.output_len)
        if args.ragged
        else args.output_len
        for _ in range(num_prompts - 1)
    ] + [args.output_len]
    temperature = args.temperature
    return [
        SamplingParams(
            temperature=temperature,
            max_tokens=length,
            ignore_eos=True,
            seed=i if temperature > 0 else None,
        )
        for i, length in enumerate(lengths)
    ]


def _generate(llm: LLM, prompts: list[list[int]], args: argparse.Namespace) -> float:
    """Seconds of one generate call: CPU time of the process on the CPU (steadier than wall time
    on a shared machine; the engine runs in one thread), wall time on CUDA."""
    params = _params(len(prompts), args)
    clock = time.perf_counter if llm.llm_engine.config.device.type == "cuda" else time.process_time
    start = clock()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = clock() - start
    assert [len(o.outputs[0].token_ids) for o in outputs] == [p.max_tokens for p in params]
    return elapsed


def _min_time(llm: LLM, prompts: list[list[int]], args: argparse.Namespace) -> float:
    _generate(llm, prompts, args)  # warm-up
    return min(_generate(llm, prompts, args) for _ in range(args.repeats))


def _count_ops(
    llm: LLM, prompts: list[list[int]], args: argparse.Namespace
) -> tuple[float, Counter]:
    """Aten ops per decode step, counted over the steady steps (first and last 8 left out)."""
    engine = llm.llm_engine
    output_len = args.output_len
    for i, (prompt, params) in enumerate(zip(prompts, _params(len(prompts), args))):
        engine.add_request(f"count-{i}", prompt, params, final_only=True)
    num_steps = 0
    counter = OpCounter()
    while engine.has_unfinished_requests():
        counting = 8 <= num_steps < output_len - 8
        if counting:
            with counter:
                engine.step()
        else:
            engine.step()
        num_steps += 1
    num_counted = max(output_len - 16, 1)
    return sum(counter.counts.values()) / num_counted, counter.counts


def _event_wait_us(
    llm: LLM, prompts: list[list[int]], args: argparse.Namespace
) -> tuple[float, float]:
    """(step µs, µs of it the host spent blocked in torch.cuda.Event.synchronize) over one generate
    call (CUDA): each step's event, after its work and its output copy. A host that seldom waits
    is the bottleneck; one that waits most of the step waits for the GPU."""
    waited = 0.0
    synchronize = torch.cuda.Event.synchronize

    def timed(event: torch.cuda.Event) -> None:
        nonlocal waited
        start = time.perf_counter()
        synchronize(event)
        waited += time.perf_counter() - start

    torch.cuda.Event.synchronize = timed
    try:
        seconds = _generate(llm, prompts, args)
    finally:
        torch.cuda.Event.synchronize = synchronize
    return seconds / args.output_len * 1e6, waited / args.output_len * 1e6


def replay_gpu_us(graphs: DecodeGraphs, size: int, num_replays: int = 200) -> float:
    """GPU µs of one replay of the decode graph of that size (CUDA only), over the static buffers and
    block table as the last step left them (a finished run: its KV is not read again)."""
    return queued_gpu_us(lambda i: graphs.replay(size), num_replays)


def queued_gpu_us(
    step: Callable[[int], Any], num_steps: int, sleep_cycles: int = 100_000_000
) -> float:
    """GPU µs of one step(i) (CUDA only): one run first, then num_steps of them queued behind a GPU
    sleep (long enough for the host to queue them), so that the host's launch time is hidden, timed
    by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    step(0)
    torch.cuda._sleep(sleep_cycles)  # keeps the GPU busy while the host queues the steps
    start.record()
    for i in range(num_steps):
        step(i)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / num_steps


def _run_batch(args: argparse.Namespace, batch_size: int, folder: Path) -> dict[str, float]:
    rng = random.Random(0)
    prompts = [
        [rng.randrange(2, args.vocab) for _ in range(args.input_len)] for _ in range(batch_size)
    ]
    llm = _build(folder, args)
    runner = llm.llm_engine.engine_core.model_runner
    if args.graphs:
        runner.graphs = HostGraphs(
            runner.config,
            runner.model,
            runner.kv_caches,
            runner._inputs,
            runner.input_batch.max_num_blocks_per_req,
            sizes=runner.sizes,
        )
        runner.graphs.capture()
    full_s = _min_time(llm, prompts, args)
    runner.model = ForwardStub(runner.model, runner.max_num_tokens)
    host_s = _min_time(llm, prompts, args)
    result = {
        "batch": batch_size,
        "host_us": host_s / args.output_len * 1e6,
        "full_us": full_s / args.output_len * 1e6,
    }
    # The replay reads the static buffers as the last step laid them out: with --ragged that step
    # had fewer rows than batch_size, and the larger graph would read another layout's sections.
    on_cuda = runner.graphs is not None and not args.graphs and not args.ragged
    if on_cuda:
        replay_us = replay_gpu_us(runner.graphs, runner.sizes.decode_graph_size(batch_size))
        print(f"batch {batch_size}: one decode-graph replay takes {replay_us:.1f} µs of GPU time")
    if args.count_ops:
        ops_per_step, counts = _count_ops(llm, prompts, args)
        result["aten_ops_per_step"] = ops_per_step
        num_counted = max(args.output_len - 16, 1)
        top = ", ".join(f"{name} {n / num_counted:.1f}" for name, n in counts.most_common(12))
        print(f"batch {batch_size}: aten ops per decode step: {top}")
    if args.profile and batch_size == int(args.batch_sizes.split(",")[0]):
        cProfile.runctx(
            "_generate(llm, prompts, args)",
            globals(),
            {"llm": llm, "prompts": prompts, "args": args, "_generate": _generate},
            args.profile,
        )
    if on_cuda:  # last: with the real forward again
        runner.model = runner.model._model
        step_us, wait_us = _event_wait_us(llm, prompts, args)
        print(
            f"batch {batch_size}: a step takes {step_us:.1f} µs, of which the host waits {wait_us:.1f} µs "
            f"for the GPU (event synchronize) and works {step_us - wait_us:.1f} µs"
        )
    return result


def main() -> None:
    args = _parse_args()
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for batch_size in (int(b) for b in args.batch_sizes.split(",")):
            rows.append(_run_batch(args, batch_size, Path(tmp)))
    print(
        f"\nvocab {args.vocab}, {args.input_len} prompt + {args.output_len} output tokens, "
        f"device {args.device}, min of {args.repeats}"
        f"{', stand-in CUDA graphs' if args.graphs else ''}{', ragged outputs' if args.ragged else ''}"
        f"{f', temperature {args.temperature}' if args.temperature else ''}"
    )
    print(
        "| batch | host µs/step (forward stubbed) | full µs/step (tiny forward) | aten ops/step |"
    )
    print("|---|---|---|---|")
    for row in rows:
        ops = f"{row['aten_ops_per_step']:.1f}" if "aten_ops_per_step" in row else ""
        print(f"| {row['batch']} | {row['host_us']:.1f} | {row['full_us']:.1f} | {ops} |")


if __name__ == "__main__":
    main()
