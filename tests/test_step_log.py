"""benchmarks/step_log.py on the real Scheduler (no model: every sampling request gets a token) and
T4's definition (benchmarks/skewed_mix.py): the figures the issue-31 timeline is read from."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from skewed_mix import PROMPT_MAX, PROMPT_MIN, skewed_mix  # noqa: E402
from step_log import StepLog, summarize  # noqa: E402

from pagedlm.config import CacheConfig, SchedulerConfig  # noqa: E402
from pagedlm.core.sched_output import ModelRunnerOutput  # noqa: E402
from pagedlm.core.scheduler import Scheduler  # noqa: E402
from pagedlm.request import Request  # noqa: E402
from pagedlm.sampling_params import SamplingParams  # noqa: E402


def run_logged(prompt_lens: list[int], output_lens: list[int], budget: int) -> StepLog:
    scheduler = Scheduler(
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget, async_scheduling=False),
        CacheConfig(block_size=16, enable_prefix_caching=False),
        num_blocks=256,
        max_model_len=1024,
    )
    log = StepLog.attach(SimpleNamespace(scheduler=scheduler))
    for i, (p, o) in enumerate(zip(prompt_lens, output_lens)):
        params = SamplingParams(max_tokens=o, ignore_eos=True)
        scheduler.add_request(Request(f"r{i}", [7] * p, params, max_tokens=o))
    while scheduler.has_unfinished_requests():
        plan = scheduler.schedule()
        ids = sorted(plan.sampling_req_ids)
        scheduler.update_from_output(plan, ModelRunnerOutput(ids, [[5] for _ in ids]))
    return log


def test_step_kinds_and_requests() -> None:
    # budget 100: r0's 150-token prompt takes two steps, r1 (30) joins the second one
    log = run_logged([150, 30], [3, 5], budget=100)
    kinds = [s.kind for s in log.steps]
    assert kinds[:2] == ["prefill", "prefill"]
    assert log.steps[0].tokens == 100 and log.steps[0].prompt_tokens == 100
    assert log.steps[1].tokens == 80 and log.steps[1].rows == 2
    assert set(kinds[2:]) == {"decode"}
    assert sum(s.decode_rows for s in log.steps) == (3 - 1) + (5 - 1)  # first tokens: prefill
    # a decode row reads its whole context: r0's first decode step sees 150 + 1 keys, r1's 30 + 1
    assert log.steps[2].decode_kv_tokens == 151 + 31
    assert {k: r.output_len for k, r in log.requests.items()} == {"r0": 3, "r1": 5}
    assert all(r.finished >= r.first_scheduled > 0 for r in log.requests.values())
    figures = summarize(log, log.steps[0].launched)
    assert figures["by_kind"]["decode"]["tokens"] == 6
    assert figures["requests"]["last to finish"]["id"] == "r1"


def test_mixed_step() -> None:
    # r1's prompt is scheduled while r0 decodes: one step with both
    log = run_logged([20, 400], [6, 2], budget=64)
    assert "mixed" in [s.kind for s in log.steps]


def test_skewed_mix_is_fixed_and_skewed() -> None:
    prompts, outputs = skewed_mix()
    assert (prompts, outputs) == skewed_mix()
    lens = [len(p) for p in prompts]
    assert len(prompts) == 512 and min(lens) >= PROMPT_MIN and max(lens) == PROMPT_MAX
    assert sum(n > 1000 for n in lens) / len(lens) == pytest.approx(0.105, abs=0.01)
    assert min(outputs) >= 16 and max(outputs) <= 1024 and max(outputs) / min(outputs) > 50
