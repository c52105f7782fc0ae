"""Sleep mode offline: levels 1 and 2 free the memory and wake up to the same greedy tokens."""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

import pytest
from lifecycle_helpers import make_llm

from pagedlm import SamplingParams
from pagedlm.errors import InvalidRequest

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7, 6, 5, 4, 3, 2, 1, 11, 12, 13, 14, 15, 16, 17, 18]]
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def greedy_ids(llm: Any) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def runner(llm: Any) -> Any:
    return llm.llm_engine.engine_core.model_runner


def test_level_1_frees_the_kv_cache_and_wakes_to_the_same_tokens(llm: Any) -> None:
    before = greedy_ids(llm)
    kv_cache = weakref.ref(runner(llm).kv_caches[0])
    llm.sleep(level=1)
    assert llm.is_sleeping()
    assert kv_cache() is None  # the KV tensors' storage is gone, not just unreferenced here
    footprint = llm.collective_rpc("memory_footprint")[0]
    assert footprint == {"weights_bytes": 0, "kv_cache_bytes": 0}
    with pytest.raises(InvalidRequest, match="sleeping") as exc:
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert exc.value.code == "engine_sleeping"
    llm.wake_up()
    assert not llm.is_sleeping()
    assert llm.collective_rpc("memory_footprint")[0]["kv_cache_bytes"] > 0
    assert greedy_ids(llm) == before
    assert llm.get_stats().num_running == 0


def test_level_2_discards_the_weights_and_reload_restores_them(llm: Any, tiny_dir: Path) -> None:
    before = greedy_ids(llm)
    weight = weakref.ref(runner(llm).model.model.layers[0].self_attn.qkv_proj.weight.data)
    rope = runner(llm).model.model.layers[0].self_attn.rotary.cos_sin_cache
    llm.sleep(level=2)
    assert weight() is None
    llm.wake_up(tags=["weights"])  # uninitialised weights: reload before the KV cache wakes
    assert llm.is_sleeping()
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(tiny_dir)})
    llm.wake_up(tags=["kv_cache"])
    assert not llm.is_sleeping()
    assert runner(llm).model.model.layers[0].self_attn.rotary.cos_sin_cache is rope  # kept
    assert greedy_ids(llm) == before


def test_prefix_cache_is_reset_on_sleep(llm: Any) -> None:
    llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert llm.generate(PROMPTS[1], GREEDY, use_tqdm=False)[0].num_cached_tokens > 0
    llm.sleep(level=1)
    llm.wake_up()
    assert llm.generate(PROMPTS[1], GREEDY, use_tqdm=False)[0].num_cached_tokens == 0


def test_sleep_with_a_request_in_flight(llm: Any) -> None:
    """vLLM's modes: "abort" (the default) finishes it as aborted; "keep" preempts it, and it
    recomputes after wake_up to the tokens it would have had."""
    (expected,) = [
        out.outputs[0].token_ids for out in llm.generate(PROMPTS[1], GREEDY, use_tqdm=False)
    ]
    engine = llm.llm_engine
    for mode in ("abort", "keep"):
        engine.add_request(f"sleepy-{mode}", PROMPTS[1], GREEDY)
        for _ in range(4):
            engine.step()
        llm.sleep(level=1, mode=mode)
        outputs = engine.step()
        if mode == "abort":
            assert [(o.request_id, o.outputs[0].finish_reason) for o in outputs] == [
                ("sleepy-abort", "abort")
            ]
            assert not engine.has_unfinished_requests()
        else:
            assert engine.has_unfinished_requests() and engine.step() == []
        llm.wake_up()
    finished = []
    while engine.has_unfinished_requests():
        finished += [o for o in engine.step() if o.finished]
    assert [o.outputs[0].token_ids for o in finished] == [expected]


def test_bad_arguments_are_clear_errors(llm: Any, tiny_dir: Path) -> None:
    with pytest.raises(InvalidRequest, match="level") as exc:
        llm.sleep(level=3)
    assert exc.value.param == "level"
    with pytest.raises(InvalidRequest, match="tags"):
        llm.wake_up(tags=["everything"])
    llm.sleep(level=2)
    with pytest.raises(InvalidRequest, match="asleep"):
        llm.collective_rpc("reload_weights", kwargs={"weights_path": str(tiny_dir)})
    llm.wake_up(["weights"])
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(tiny_dir)})
    llm.wake_up()
    assert not llm.is_sleeping()


def test_sleep_needs_enable_sleep_mode(tiny_dir: Path) -> None:
    other = make_llm(tiny_dir, enable_sleep_mode=False, num_gpu_blocks_override=8)
    with pytest.raises(InvalidRequest, match="enable_sleep_mode"):
        other.sleep()


@pytest.mark.parametrize("level", [1, 2])
def test_a_draft_model_sleeps_with_the_target(tiny_dir: Path, level: int) -> None:
    """speculative_config draft_model (the target itself, so every greedy draft is accepted): its
    KV cache goes and its weights stay on the host at either level (a reload or weight update
    never reaches a draft), so it drafts as before once awake."""
    spec = {"method": "draft_model", "model": str(tiny_dir), "num_speculative_tokens": 3}
    llm = make_llm(tiny_dir, speculative_config=spec, num_gpu_blocks_override=32)
    draft = runner(llm).draft_model()
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    before = [out.outputs[0].token_ids for out in outputs]
    draft_kv = weakref.ref(draft.kv_caches[0])
    llm.sleep(level=level)
    assert draft_kv() is None and draft.kv_caches == []
    assert all(p.numel() == 0 for p in draft.model.parameters())
    footprint = llm.collective_rpc("memory_footprint")[0]
    assert footprint == {"weights_bytes": 0, "kv_cache_bytes": 0}
    llm.wake_up(tags=["weights"])
    if level == 2:  # the target's weights come back uninitialised
        llm.collective_rpc("reload_weights", kwargs={"weights_path": str(tiny_dir)})
    llm.wake_up(tags=["kv_cache"])
    assert all(p.numel() > 0 for p in draft.model.parameters()) and draft.kv_caches
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [out.outputs[0].token_ids for out in outputs] == before
    metrics = [out.outputs[0].spec_decode_metrics for out in outputs]
    assert all(m is not None and m.num_draft_tokens > 0 for m in metrics), metrics
    assert all(m.num_accepted_draft_tokens == m.num_draft_tokens for m in metrics), metrics
    llm.shutdown()
