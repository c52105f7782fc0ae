"""GPU: what a batch-1 decode step costs on the GPU beyond its graph, by the operations around the replay.

    python benchmarks/probes/step_gaps.py [--shape qwen3-0.6b] [--context 384] [--rounds 5]

The engine's own decode graphs (batch 1, dummy weights, bf16) after a prefill of --context tokens. Each
mode queues 200 steps behind a GPU sleep (the host far ahead, as decode_replay.py) and prints the GPU µs
a step (median of --rounds alternating rounds):
- replay: the plain graph alone, back to back;
- +event: and an event recorded after each (the engine records one a step);
- copies: the plain engine step: the input copy (sections A and B from a staging set), the replay,
  the 8-byte copy of the sampled id to pinned memory, the event;
- staged: the engine's staged step, the graph of staging set 0 and 1 in turn (each stages its inputs
  in and writes its id to pinned memory), the event;
- staged0: the graph of staging set 0 only, the event.
The difference between a mode and `replay` is what those operations cost the GPU; the engine's step
(first_token.py's step µs) minus the matching mode is the rest (the host behind, if anything).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

sys.path[:0] = [
    str(p) for p in Path(__file__).resolve().parents[:3]
]  # probes/, benchmarks/, the repo

from decode_replay import dummy_llm, fill_decode_batch  # noqa: E402
from gpu_workloads import MODELS  # noqa: E402
from host_step import queued_gpu_us  # noqa: E402

NUM_STEPS = 200


def step_modes(runner) -> dict[str, Callable[[int], None]]:
    """mode -> one step's operations (given the step's index)."""
    graphs, inputs, staging = runner.graphs, runner._inputs, runner._staging
    sections = staging[0].sections(1, 1)
    end = sections.copy_end(True, 0)  # A and B, no block table
    for slot in range(len(staging)):
        staging[slot].flat.copy_(staging[0].flat)
        staging[slot].write_stage_header(end)
    event = torch.cuda.Event()
    stream = torch.cuda.current_stream()
    ids_host = runner._sampled_cpu

    def replay(i: int) -> None:
        graphs.replay(1)

    def with_event(i: int) -> None:
        graphs.replay(1)
        event.record(stream)

    def copies(i: int) -> None:
        inputs.copy_from(staging[i % 2], end)
        graphs.replay(1)
        ids_host[i % 2][:1].copy_(graphs.argmax(1), non_blocking=True)
        event.record(stream)

    def staged(i: int) -> None:
        graphs.replay(1, i % 2)
        event.record(stream)

    def staged0(i: int) -> None:
        graphs.replay(1, 0)
        event.record(stream)

    return {
        "replay": replay,
        "+event": with_event,
        "copies": copies,
        "staged": staged,
        "staged0": staged0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="qwen3-0.6b", choices=sorted(MODELS))
    parser.add_argument("--context", type=int, default=384)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        llm = dummy_llm(tmp, args.shape, 1, args.context)
        fill_decode_batch(llm, 1, args.context)
        runner = llm.llm_engine.engine_core.model_runner
        modes = step_modes(runner)
        times: dict[str, list[float]] = {mode: [] for mode in modes}
        for _ in range(args.rounds):
            for mode, step in modes.items():
                times[mode].append(queued_gpu_us(step, NUM_STEPS))
    base = statistics.median(times["replay"])
    print(
        f"\n{args.shape}, batch 1, context {args.context}: GPU µs a step (median of {args.rounds} rounds "
        f"of {NUM_STEPS} steps)"
    )
    print(f"{'mode':10} {'median':>8} {'min':>8} {'max':>8} {'vs replay':>10}")
    for mode, values in times.items():
        median = statistics.median(values)
        print(
            f"{mode:10} {median:8.1f} {min(values):8.1f} {max(values):8.1f} {median - base:+10.1f}"
        )


if __name__ == "__main__":
    main()
