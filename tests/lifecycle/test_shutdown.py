"""LLM.shutdown() and dropping an LLM free its memory: three engines built and destroyed in one
process leave the process's resident memory where the first left it, and every tensor the
engine held is gone."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import psutil
import pytest
from lifecycle_helpers import make_llm

from pagedlm import SamplingParams
from pagedlm.errors import InvalidRequest

MiB = 1 << 20
KV_CACHE_GIB = 0.25  # big enough that a leaked cache shows in the resident memory


def rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def tensor_refs(llm: Any) -> list[weakref.ref]:
    runner = llm.llm_engine.engine_core.model_runner
    tensors = [*runner.kv_caches, *runner.model.parameters(), *runner.model.buffers()]
    return [weakref.ref(t) for t in tensors] + [weakref.ref(runner)]


def test_three_engines_built_and_destroyed_leave_no_memory(tiny_dir: Path) -> None:
    start = rss()
    after = []
    for index in range(3):
        llm = make_llm(tiny_dir, kv_cache_memory_gib=KV_CACHE_GIB, num_gpu_blocks_override=None)
        out = llm.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=4), use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 4
        assert rss() - start > 0.8 * KV_CACHE_GIB * 1024 * MiB  # the check below can fail
        refs = tensor_refs(llm)
        if index == 1:
            llm.shutdown()
            llm.shutdown()  # idempotent
            with pytest.raises(InvalidRequest, match="shut down"):
                llm.generate([[1, 2, 3]], use_tqdm=False)
            assert all(ref() is None for ref in refs)
        del llm
        assert all(ref() is None for ref in refs)
        after.append(rss())
    assert after[2] - after[0] < 64 * MiB, [(a - start) / MiB for a in after]
    assert after[0] - start < 128 * MiB, [(a - start) / MiB for a in after]
