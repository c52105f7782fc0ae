"""One 512-token prefill of the default model (forward + last-row logits), median of 5 (process CPU time:
the machine is shared), in the
tree on PYTHONPATH. `--prof` adds a torch.profiler table. Run from that tree's root."""

import statistics
import sys
import time

import torch

sys.path.insert(0, "tests/model")
from paged_batch import make_cache, make_step  # noqa: E402

from pagedlm.attention.torch_ref import TorchAttentionBackend  # noqa: E402
from pagedlm.config import build_model_config  # noqa: E402
from pagedlm.model import load_model  # noqa: E402

dtype = sys.argv[1]
config = build_model_config(None, "auto", dtype, torch.device("cpu"), 1024, True)
model = load_model(config, TorchAttentionBackend(), torch.device("cpu"))
ids = torch.randint(100, 49152, (512,), generator=torch.Generator().manual_seed(0)).tolist()
cache = make_cache(model.config, 1, 512, 16)
input_ids, positions, meta = make_step(cache, [(ids, 0)])


def prefill() -> torch.Tensor:
    with torch.no_grad():
        return model.compute_logits(model(input_ids, positions, cache.kv_caches, meta)[-1:])


prefill()
times = []
for _ in range(5):
    start = time.process_time()
    prefill()
    times.append(1000 * (time.process_time() - start))
print(f"{dtype} prefill ms median {statistics.median(times):.1f} all {[round(t) for t in times]}")
if "--prof" in sys.argv:
    with torch.profiler.profile() as prof:
        prefill()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
