"""Colocated RL on one GPU, llama3-8b's shape (dummy weights, bf16): sleep level 1 and its wake-ups
(the weights' flat host copy, the graphs' re-capture), then a trainer process on the same GPU
sending every weight over transport "ipc", against the device's own copy bandwidth.

    python benchmarks/ipc_transfer.py [--model llama3-8b] [--variants] [--json out.json]

The RL sequence after that: sleep(level=2) -> wake_up(["weights"]) -> the trainer sends (the KV
cache still asleep leaves it the memory) -> wake_up(["kv_cache"]). --variants then times ways to
hold the weights in host memory, on the engine's own parameters (per-weight pinned tensors, the
old path; one buffer page-locked in place, the new path; one pageable buffer). Prints a table
last."""

from __future__ import annotations

import argparse
import json
import multiprocessing
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

GiB = 1 << 30
CHUNKS = (256 << 20, 256 << 20, 1 << 30)  # one send each: the first opens the bucket


DEVICE = "cuda:0" if torch.cuda.is_available() else "cpu"  # the CPU: a smoke run of the script


def sync() -> None:
    if DEVICE != "cpu":
        torch.cuda.synchronize()


def timed(fn: Callable[[], object]) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def copy_rate(num_bytes: int) -> float:
    """Bytes copied per second by one device-to-device copy (each byte read and written)."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(timed(lambda: dst.copy_(src)) for _ in range(5))
    return num_bytes / best


def trainer(conn, shapes: list[tuple[str, list[int]]]) -> None:
    """The trainer process: its own weights on the engine's GPU, sent over IPC once per CHUNKS."""
    from pagedlm.rl import WeightSender

    def engine(method: str, kwargs: dict) -> list:
        conn.send((method, kwargs))
        status, value = conn.recv()
        if status != "ok":
            raise RuntimeError(value)
        return value

    weights = [
        (name, torch.empty(shape, dtype=torch.bfloat16, device=DEVICE).normal_(0, 0.02))
        for name, shape in shapes
    ]
    sender = WeightSender(engine, device=DEVICE, transport="ipc")
    seconds = []
    for index, chunk_bytes in enumerate(CHUNKS):
        sync()
        start = time.perf_counter()
        sender.send_weights(weights, f"trained-{index}", chunk_bytes=chunk_bytes)
        seconds.append(time.perf_counter() - start)
    sender.close()
    conn.send(("done", seconds))


def serve(llm, conn) -> list[float]:
    while True:
        message = conn.recv()
        if message[0] == "done":
            return message[1]
        method, kwargs = message
        try:
            conn.send(("ok", llm.collective_rpc(method, kwargs=kwargs)))
        except Exception as exc:
            conn.send(("error", repr(exc)))


def ipc_transfer(llm) -> dict:
    from pagedlm.model import loader

    runner = llm.llm_engine.engine_core.model_runner
    targets = loader.checkpoint_targets(runner.model)
    shapes = [(name, list(view.shape)) for name, view in targets.items()]
    num_bytes = sum(view.numel() * view.element_size() for view in targets.values())
    context = multiprocessing.get_context("spawn")
    conn, child = context.Pipe()
    process = context.Process(target=trainer, args=(child, shapes))
    start = time.perf_counter()
    process.start()
    seconds = serve(llm, conn)
    process.join(30)
    return {
        "weights_gib": num_bytes / GiB,
        "trainer_process_s": time.perf_counter() - start,
        "send_s": dict(zip(["256MiB_first", "256MiB", "1GiB"], seconds)),
        "best_gb_s": num_bytes / min(seconds) / 1e9,
    }


def host_variants(llm) -> dict:
    """Each way to hold the weights in host memory: seconds to hold (allocate + copy out), to copy
    back into the parameters, and to free."""
    from pagedlm.worker.host_offload import HostCopy

    params = [p.data for p in llm.llm_engine.engine_core.model_runner.model.parameters()]
    total = sum(p.numel() * p.element_size() for p in params)

    def per_tensor_pinned() -> list[torch.Tensor]:  # the old path
        return [torch.empty(p.shape, dtype=p.dtype, pin_memory=True).copy_(p) for p in params]

    def flat_pageable() -> list[torch.Tensor]:
        buffer = torch.empty(total, dtype=torch.uint8)
        views, offset = [], 0
        for p in params:
            n = p.numel() * p.element_size()
            views.append(buffer[offset : offset + n].view(p.dtype).view(p.shape))
            views[-1].copy_(p)
            offset += n
        return views

    def release(held: dict) -> None:
        copy = held.pop("copy")
        if isinstance(copy, HostCopy):
            copy.free()
        del copy
        getattr(torch._C, "_host_emptyCache", lambda: None)()  # pinned blocks back to the system

    results = {}
    for name, hold in [
        ("per_tensor_pinned", per_tensor_pinned),
        ("flat_registered", lambda: HostCopy(params)),
        ("flat_pageable", flat_pageable),
    ]:
        held: dict = {}
        hold_s = timed(lambda hold=hold: held.update(copy=hold()))
        copy = held["copy"]
        views = copy.views() if isinstance(copy, HostCopy) else copy
        back_s = timed(
            lambda views=views: [p.copy_(v, non_blocking=True) for p, v in zip(params, views)]
        )
        del views, copy
        free_s = timed(lambda: release(held))
        results[name] = {"hold_s": hold_s, "back_s": back_s, "free_s": free_s}
        print(json.dumps({name: results[name]}), flush=True)
    return results


def run(model: str, folder: str, variants: bool) -> dict:
    from pagedlm import LLM, SamplingParams

    vocab_size = json.loads((Path(folder) / "config.json").read_text())["vocab_size"]
    prompts = [[t % vocab_size for t in p] for p in random_prompts(random.Random(0), 8, 64)]
    greedy_params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)

    def greedy() -> list[list[int]]:
        outputs = llm.generate(prompts, greedy_params, use_tqdm=False)
        return [o.outputs[0].token_ids for o in outputs]

    start = time.perf_counter()
    llm = LLM(
        folder,
        load_format="dummy",
        dtype="bfloat16",
        skip_tokenizer_init=True,
        enable_sleep_mode=True,
        graph_size_timing=False,
    )
    result: dict = {"model": model, "start_s": time.perf_counter() - start}
    reference = greedy()
    result["copy_rate_gb_s"] = copy_rate(4 * GiB if DEVICE != "cpu" else 1 << 24) / 1e9
    print(json.dumps(result), flush=True)
    steps = {}
    steps["sleep(level=1)"] = timed(lambda: llm.sleep(level=1))
    steps["wake_up(weights)"] = timed(lambda: llm.wake_up(["weights"]))
    steps["wake_up(kv_cache)+graphs"] = timed(lambda: llm.wake_up(["kv_cache"]))
    result["same_tokens_after_level_1"] = greedy() == reference
    result["steps_s"] = steps
    print(json.dumps(result), flush=True)
    steps["sleep(level=2)"] = timed(lambda: llm.sleep(level=2))
    llm.wake_up(["weights"])  # uninitialised: the trainer fills them
    result["ipc"] = ipc_transfer(llm)
    steps["wake_up(kv_cache)+graphs after ipc"] = timed(lambda: llm.wake_up(["kv_cache"]))
    result["tokens_changed_after_ipc"] = greedy() != reference
    print(json.dumps(result), flush=True)
    if variants:
        result["host_variants"] = host_variants(llm)
    llm.shutdown()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama3-8b")
    parser.add_argument("--model-dir", help="a folder with a config.json instead of --model's")
    parser.add_argument("--variants", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    folder = args.model_dir or model_dir(args.model, Path(tempfile.mkdtemp()))
    result = run(args.model_dir or args.model, folder, args.variants)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    ipc = result["ipc"]
    print(f"{'what':36} {'value':>10}")
    for step, seconds in result["steps_s"].items():
        print(f"{step + ' s':36} {seconds:10.2f}")
    for name, row in result.get("host_variants", {}).items():
        print(
            f"{name + ' hold/back/free s':36} {row['hold_s']:.2f}/{row['back_s']:.2f}/{row['free_s']:.2f}"
        )
    for label, seconds in ipc["send_s"].items():
        print(f"{'ipc send ' + label + ' s':36} {seconds:10.3f}")
    print(f"{'ipc best GB/s':36} {ipc['best_gb_s']:10.1f}")
    print(f"{'device copy GB/s':36} {result['copy_rate_gb_s']:10.1f}")


if __name__ == "__main__":
    main()
