"""Session 10 run 8: does every new GEMM row count block the host until the GPU idles, or only a
new cuBLAS kernel (lazy module loading)? Run once as is and once with CUDA_MODULE_LOADING=EAGER."""
import os
import time

import torch

SLEEP_CYCLES = 100_000_000


def host_ms(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    start = time.perf_counter()
    fn()
    elapsed = (time.perf_counter() - start) * 1e3
    torch.cuda.synchronize()
    return elapsed


start = time.perf_counter()
torch.zeros(1, device="cuda")
print(f"CUDA_MODULE_LOADING={os.environ.get('CUDA_MODULE_LOADING', '(default)')}: context {time.perf_counter() - start:.2f} s, "
      f"used {torch.cuda.mem_get_info()[1] - torch.cuda.mem_get_info()[0] >> 20} MiB")
hidden = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
weight = torch.randn(151936, 1024, device="cuda", dtype=torch.bfloat16)
w2 = torch.randn(3072, 1024, device="cuda", dtype=torch.bfloat16)
torch.mm(hidden[:256], weight.t(), out_dtype=torch.float32)
row = []
for rows in range(37, 45):
    row.append(f"{rows}:{host_ms(lambda: torch.mm(hidden[:rows], weight.t(), out_dtype=torch.float32)):.1f}")
print("LM head mm out_dtype, new row counts, host ms:", " ".join(row))
row = []
for rows in (1000, 1001, 1002, 2000, 3001, 4000):
    row.append(f"{rows}:{host_ms(lambda: torch.nn.functional.linear(hidden[:rows], w2)):.1f}")
print("F.linear 3072x1024, new row counts, host ms:", " ".join(row))
x = torch.zeros(16, device="cuda")
print(f"first x.mul_(2): {host_ms(lambda: x.mul_(2)):.1f} ms; again {host_ms(lambda: x.mul_(2)):.1f} ms")
