"""Does NCCL take two ranks on one GPU? Two processes on cuda:0 build pagedlm's transfer group
(pagedlm.rl.transport.new_group) and broadcast one tensor; prints one JSON line per setting:
"ok", or the first line of each rank's error (expected: "Duplicate GPU detected").

    python benchmarks/probes/nccl_one_gpu.py [--env NAME=VALUE,...]...
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def rank(rank_id: int, port: int, env: dict[str, str], results) -> None:
    os.environ.update(env)
    import torch

    from pagedlm.rl.transport import TransferInit, broadcast, host_store, new_group

    try:
        torch.cuda.set_device(0)
        init = TransferInit("127.0.0.1", port, 2, timeout_s=30)
        store = host_store("127.0.0.1", port, 2, 30) if rank_id == 0 else None
        group = new_group(init, rank_id, torch.device("cuda:0"), store=store)
        tensor = torch.full((4,), float(rank_id == 0), device="cuda:0")
        broadcast(group, tensor).wait()
        torch.cuda.synchronize()
        results.put((rank_id, "ok" if tensor.tolist() == [1.0] * 4 else f"wrong {tensor}"))
    except Exception as exc:  # the finding
        lines = [line for line in str(exc).splitlines() if line.strip()]
        detail = next((line for line in lines if "Duplicate" in line), lines[0] if lines else "")
        results.put((rank_id, f"{type(exc).__name__}: {detail[:300]}"))


def probe(env: dict[str, str], port: int) -> dict:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    ranks = [context.Process(target=rank, args=(r, port, env, results)) for r in (0, 1)]
    for process in ranks:
        process.start()
    outcome = {}
    for _ in ranks:
        try:
            rank_id, text = results.get(timeout=60)
            outcome[f"rank{rank_id}"] = text
        except Exception:
            outcome.setdefault("timeout", True)
    for process in ranks:
        process.join(5)
        if process.is_alive():
            process.kill()
    return {"env": env, **outcome}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", action="append", default=[""], help="NAME=VALUE,... per run")
    args = parser.parse_args()
    import torch

    print(json.dumps({"torch": torch.__version__, "nccl": torch.cuda.nccl.version()}))
    for index, spec in enumerate(args.env):
        env = dict(item.split("=", 1) for item in spec.split(",") if item)
        print(json.dumps(probe(env, 29650 + index)), flush=True)


if __name__ == "__main__":
    main()
