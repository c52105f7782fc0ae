"""Why does sleep(level=1) in re-capture mode free only 2 MiB when a keep-address engine ran
earlier in the process (tests/gpu/test_sleep_mode.py, s23)? Builds engines as that test does and
prints, after sleep: the KV tensors still alive (weakrefs), torch's allocated / reserved bytes and
the device's free bytes.   python benchmarks/probes/sleep_recapture_probe.py alone|after_keep"""

from __future__ import annotations

import gc
import os
import pathlib
import sys
import tempfile
import weakref

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "tests"))
from gpu.test_sleep_mode import ENGINE  # noqa: E402  (the test's engine, as the question is its)
from tiny_hf_models import save_tiny_model  # noqa: E402

from pagedlm import LLM, SamplingParams  # noqa: E402
from pagedlm.worker import cumem  # noqa: E402

MiB = 1 << 20


def report(label: str) -> None:
    torch.cuda.synchronize()
    print(
        f"{label}: free {torch.cuda.mem_get_info()[0] / MiB:.0f} MiB, allocated "
        f"{torch.cuda.memory_allocated() / MiB:.0f}, reserved {torch.cuda.memory_reserved() / MiB:.0f}",
        flush=True,
    )


def engine(folder: str, keep: bool) -> LLM:
    os.environ["PAGEDLM_SLEEP_KEEP_ADDRESSES"] = "1" if keep else "0"
    cumem.process_allocator.cache_clear()
    llm = LLM(folder, **ENGINE)
    llm.generate([{"prompt_token_ids": [5, 6, 7, 8]}], SamplingParams(max_tokens=4), use_tqdm=False)
    return llm


def main() -> None:
    folder = pathlib.Path(tempfile.mkdtemp()) / "llama"
    save_tiny_model(folder, "llama")
    if sys.argv[1] == "after_keep":
        first = engine(str(folder), keep=True)
        first.sleep(level=1)
        first.wake_up()
        del first  # as the test: dropped, not shut down
        report("keep engine dropped")
    llm = engine(str(folder), keep=False)
    runner = llm.llm_engine.engine_core.model_runner
    refs = [weakref.ref(t) for t in runner.kv_caches]
    report("recapture engine awake")
    llm.sleep(level=1)
    gc.collect()
    report("recapture engine asleep")
    alive = [r() for r in refs if r() is not None]
    print("KV tensors alive after sleep:", len(alive), flush=True)
    for t in alive[:1]:
        for holder in gc.get_referrers(t):
            print("  held by", type(holder), list(holder)[:6] if isinstance(holder, dict) else "")
            for outer in gc.get_referrers(holder)[:5]:
                print("    <-", type(outer))


if __name__ == "__main__":
    main()
