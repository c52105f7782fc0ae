"""Sleep mode on the GPU: device memory free (torch.cuda.mem_get_info) after sleep level 1, level 2
and each wake-up, the time of each, against the engine's fresh start (a cold process, then a warm
one), on a dummy-weight model of a real shape (bf16, the engine's defaults otherwise).

    python benchmarks/sleep_wake.py [--model llama3-8b] [--json out.json]

Level 1 keeps the weights in pinned host memory and wakes them with one copy each; level 2 drops
them (after its wake-up they are uninitialised: a trainer or reload_weights fills them, so the
tokens after it are not compared). Two engines, one after the other: the first keeps the virtual
addresses (worker/cumem.py: the graphs replay as captured), the second has
PAGEDLM_SLEEP_KEEP_ADDRESSES=0 (each wake-up of the KV cache re-captures the CUDA graphs); the
first starts in a cold process, the second in a warm one. Prints a table last."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_workloads import model_dir, random_prompts  # noqa: E402

from pagedlm import LLM, SamplingParams  # noqa: E402
from pagedlm.worker import cumem  # noqa: E402

GiB = 1 << 30
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


def free_bytes() -> int:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


def build(folder: str) -> LLM:
    return LLM(
        folder,
        load_format="dummy",
        dtype="bfloat16",
        skip_tokenizer_init=True,
        enable_sleep_mode=True,
    )


def cycle(folder: str, prompts: list[list[int]], keep_addresses: bool) -> tuple[list[dict], dict]:
    """One engine: start, sleep level 1 and 2 with their wake-ups, shutdown."""
    os.environ["PAGEDLM_SLEEP_KEEP_ADDRESSES"] = "1" if keep_addresses else "0"
    cumem.process_allocator.cache_clear()  # chosen again for this engine
    mode = "keep" if keep_addresses else "recapture"
    rows: list[dict] = []
    start = time.perf_counter()
    llm = build(folder)
    start_s = time.perf_counter() - start
    reference = greedy(llm, prompts)
    (footprint,) = llm.collective_rpc("memory_footprint")
    held = footprint["weights_bytes"] + footprint["kv_cache_bytes"]
    awake_free = free_bytes()

    def step(name: str, fn: Callable[[], object]) -> None:
        seconds = timed(fn)
        free = free_bytes()
        rows.append(
            {
                "mode": mode,
                "step": name,
                "seconds": seconds,
                "free_gib": free / GiB,
                "freed_gib": (free - awake_free) / GiB,
                "freed_of_held": (free - awake_free) / held,
            }
        )
        print(json.dumps(rows[-1]), flush=True)  # as it goes: a failure later keeps these

    step("sleep(level=1)", lambda: llm.sleep(level=1))
    step("wake_up(['weights'])", lambda: llm.wake_up(["weights"]))
    step("wake_up(['kv_cache'])", lambda: llm.wake_up(["kv_cache"]))
    same_after_level_1 = greedy(llm, prompts) == reference
    step("sleep(level=2)", lambda: llm.sleep(level=2))
    step("wake_up()", lambda: llm.wake_up())
    first_generate_s = timed(lambda: greedy(llm, prompts[:1]))
    keeps = llm.llm_engine.engine_core.model_runner.pools.keeps_addresses
    step("shutdown()", llm.shutdown)
    llm = None  # dropped too
    summary = {
        "keeps_addresses": keeps,
        "start_s": start_s,
        "weights_gib": footprint["weights_bytes"] / GiB,
        "kv_cache_gib": footprint["kv_cache_bytes"] / GiB,
        "level_1_wake_s": rows[1]["seconds"] + rows[2]["seconds"],
        "first_generate_after_wake_s": first_generate_s,
        "same_tokens_after_level_1": same_after_level_1,
        "free_gib_after_shutdown": free_bytes() / GiB,
    }
    return rows, summary


def run(model: str) -> tuple[list[dict], dict]:
    """Kept addresses first (its start is the cold process's), then re-capture (a warm one)."""
    folder = model_dir(model, Path(tempfile.mkdtemp()))
    prompts = random_prompts(random.Random(0), 8, 64)
    keep_rows, keep = cycle(folder, prompts, keep_addresses=True)
    recapture_rows, recapture = cycle(folder, prompts, keep_addresses=False)
    summary = {
        "model": model,
        "fresh_start_cold_process_s": keep["start_s"],
        "fresh_start_warm_process_s": recapture["start_s"],
        "keep": keep,
        "recapture": recapture,
    }
    return keep_rows + recapture_rows, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama3-8b")
    parser.add_argument("--json", help="write the rows and the summary here")
    args = parser.parse_args()
    rows, summary = run(args.model)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    print(json.dumps(summary, indent=1))
    print(f"{'mode':9} {'step':24} {'s':>7} {'free GiB':>9} {'freed GiB':>10} {'of held':>8}")
    for row in rows:
        print(
            f"{row['mode']:9} {row['step']:24} {row['seconds']:7.2f} {row['free_gib']:9.2f} "
            f"{row['freed_gib']:10.2f} {row['freed_of_held']:8.1%}"
        )


if __name__ == "__main__":
    main()
