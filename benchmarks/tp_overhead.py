"""CPU: the per-step cost tensor parallelism adds at 2 ranks (gloo): the broadcast of a step's
SchedulerOutput to the workers (shared-memory ring, pagedlm/distributed/shm_broadcast.py) and the
collectives a step runs (pagedlm/distributed/collectives.py, sampling.py).

    python benchmarks/tp_overhead.py [--hidden 576] [--layers 30] [--vocab 49152] [--repeat 200]

Broadcast: the core process enqueues a decode step of R requests (diffs) or a prefill step of one
new 512-token request; two reader processes dequeue it, rank 0 answers over ZeroMQ; the time is
the round trip less that of an empty message's (the answer's own cost), median of --repeat.
Collectives: median µs per call on 2 gloo ranks (both processes on this host's cores), for the
shapes of a decode step of 1 / 32 rows and a 512-token prefill: the per-layer all-reduce of
[T, hidden] (o_proj, down: two a layer), the embedding's all-reduce, rank 0's gather of the
[N, vocab / 2] logits and the ids' broadcast (default sampling), the all-to-all of the logits and
the ids' all-gather (batch-sharded sampling). "per step" adds them up for --layers layers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import zmq

from pagedlm.core.sched_output import CachedRequestData, NewRequestData, SchedulerOutput
from pagedlm.distributed import collectives
from pagedlm.distributed.parallel_state import init_tp_group
from pagedlm.distributed.shm_broadcast import BroadcastReader, BroadcastWriter
from pagedlm.sampling_params import SamplingParams


def decode_step(num_reqs: int) -> SchedulerOutput:
    cached = [CachedRequestData(f"req-{i}", [], 300 + i) for i in range(num_reqs)]
    return SchedulerOutput(
        new_reqs=[],
        cached_reqs=cached,
        num_scheduled_tokens={c.req_id: 1 for c in cached},
        total_num_scheduled_tokens=num_reqs,
        sampling_req_ids={c.req_id for c in cached},
    )


def prefill_step() -> SchedulerOutput:
    new = NewRequestData("req-p", list(range(512)), [], SamplingParams(), list(range(32)), 0)
    return SchedulerOutput(
        new_reqs=[new],
        cached_reqs=[],
        num_scheduled_tokens={"req-p": 512},
        total_num_scheduled_tokens=512,
        sampling_req_ids={"req-p"},
    )


def _reader(handle, rank: int, path: str, count: int) -> None:
    torch.set_num_threads(1)
    reader = BroadcastReader(handle, rank)
    sock = zmq.Context().socket(zmq.PUSH)
    sock.connect(path)
    for _ in range(count):
        reader.dequeue()
        if rank == 0:
            sock.send(b"")
    reader.close()


def bench_broadcast(repeat: int) -> dict[str, float]:
    cases = {"empty": None, "decode 32 reqs": decode_step(32), "decode 256 reqs": decode_step(256)}
    cases["prefill 512 tok"] = prefill_step()
    ctx = zmq.Context()
    answers = ctx.socket(zmq.PULL)
    path = f"ipc:///tmp/pagedlm-tp-bench-{os.getpid()}"
    answers.bind(path)
    writer = BroadcastWriter(num_readers=2)
    total = len(cases) * (repeat + 10)
    procs = [
        mp.get_context("spawn").Process(target=_reader, args=(writer.handle, r, path, total))
        for r in range(2)
    ]
    for proc in procs:
        proc.start()
    medians = {}
    for name, message in cases.items():
        times = []
        for i in range(repeat + 10):
            start = time.perf_counter()
            writer.enqueue(message)
            answers.recv()
            if i >= 10:
                times.append(time.perf_counter() - start)
        medians[name] = statistics.median(times) * 1e6
    for proc in procs:
        proc.join()
    writer.close()
    return medians


def _timed(fn, repeat: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeat):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _collectives(rank: int, port: int, args, results) -> None:
    torch.set_num_threads(1)
    group = init_tp_group(rank, 2, torch.device("cpu"), f"tcp://127.0.0.1:{port}")
    shard = args.vocab // 2
    rows = {"decode 1": (1, 1), "decode 32": (32, 32), "prefill 512": (512, 1)}
    out = {}
    for name, (tokens, samples) in rows.items():
        hidden = torch.randn(tokens, args.hidden)
        logits = torch.randn(samples, shard)
        ids = torch.zeros(samples, dtype=torch.int64)
        owners = [samples - samples // 2, samples // 2]  # rows % 2 == rank
        recv = torch.empty(2 * owners[rank], shard)
        ops = {
            "all_reduce [T, hidden]": lambda: collectives.all_reduce(hidden, group),
            "gather logits to rank 0": lambda: collectives.gather_last_dim_to_first(logits, group),
            "broadcast ids": lambda: collectives.broadcast_from_first(ids, group),
            "all_to_all logits": lambda: dist.all_to_all_single(
                recv, logits, [owners[rank]] * 2, owners
            ),
            "all_gather ids": lambda: collectives.all_gather_rows(ids[: max(owners)], group),
        }
        out[name] = {op: _timed(fn, args.repeat) for op, fn in ops.items()}
    if rank == 0:
        results.update(out)
    dist.destroy_process_group()


def bench_collectives(args) -> dict:
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_collectives, args=(_free_port(), args, results), nprocs=2)
        return dict(results)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=576)  # SmolLM2-135M
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    empty, *rest = bench_broadcast(args.repeat).items()
    print(f"broadcast round trip, empty message: {empty[1]:.0f} µs")
    for name, micros in rest:
        print(f"broadcast {name}: +{micros - empty[1]:.0f} µs over the empty round trip")
    for step, ops in bench_collectives(args).items():
        print(f"\n{step} (hidden {args.hidden}, vocab {args.vocab}):")
        for op, micros in ops.items():
            print(f"  {op:26s} {micros:8.0f} µs")
        layers = (2 * args.layers + 1) * ops["all_reduce [T, hidden]"]
        default = layers + ops["gather logits to rank 0"] + ops["broadcast ids"]
        sharded = layers + ops["all_to_all logits"] + ops["all_gather ids"]
        print(
            f"  per step: default sampling {default / 1e3:.2f} ms, batch-sharded {sharded / 1e3:.2f} ms"
        )


if __name__ == "__main__":
    main()
