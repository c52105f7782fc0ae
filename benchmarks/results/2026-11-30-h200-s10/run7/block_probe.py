"""Session 10 run 7: what blocks the host during T1's prefill steps (execute_model ~37 ms of host
time for ~35 ms of GPU work; cProfile: torch.mm 12 ms a call). Each probe queues a long GPU sleep
first, then times host calls: a call that returns at once does not wait for the GPU."""
import time

import torch

SLEEP_CYCLES = 100_000_000  # ~50-60 ms at the H200's clock


def host_ms(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    start = time.perf_counter()
    fn()
    elapsed = (time.perf_counter() - start) * 1e3
    torch.cuda.synchronize()
    return elapsed


def queue_depth() -> None:
    """How many small kernel launches the host can queue behind the sleep before a launch blocks."""
    x = torch.zeros(16, device="cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    times = []
    for _ in range(3000):
        start = time.perf_counter()
        x.add_(1)
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    blocked = [i for i, t in enumerate(times) if t > 1e-3]
    print(f"queue depth: first launch to block > 1 ms: {blocked[:1]}, blocked launches {len(blocked)}, "
          f"longest {max(times) * 1e3:.1f} ms")


def main() -> None:
    hidden = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(151936, 1024, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(1024, 151936, device="cuda", dtype=torch.float32)
    torch.mm(hidden, weight.t(), out_dtype=torch.float32)
    print(f"mm out_dtype, 256 rows (seen shape): {host_ms(lambda: torch.mm(hidden, weight.t(), out_dtype=torch.float32)):.2f} ms")
    for rows in (37, 113, 201):
        h = hidden[:rows]
        print(f"mm out_dtype, {rows} rows (new shape): {host_ms(lambda: torch.mm(h, weight.t(), out_dtype=torch.float32)):.2f} ms; "
              f"again: {host_ms(lambda: torch.mm(h, weight.t(), out_dtype=torch.float32)):.2f} ms")
    for rows in (59, 143):
        h = hidden[:rows]
        print(f"mm bf16 + float(), {rows} rows: {host_ms(lambda: torch.mm(h, weight.t()).float()):.2f} ms; "
              f"mm out_dtype into a preallocated out: "
              f"{host_ms(lambda: torch.mm(h, weight.t(), out_dtype=torch.float32, out=out[:rows])):.2f} ms")
    torch.cuda.empty_cache()
    print(f"torch.empty 512 MB after empty_cache (cudaMalloc): "
          f"{host_ms(lambda: torch.empty(512 << 20, dtype=torch.uint8, device='cuda')):.2f} ms")
    queue_depth()


main()
