"""The engine with the prefill spread (core/prefill_spread.py) on a skewed batch: greedy tokens
as transformers', spread or not, and the spread really moves admissions later."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tiny_hf_models import hf_greedy, random_prompts
from transformers import AutoModelForCausalLM

from pagedlm import SamplingParams
from pagedlm.core.prefill_spread import PrefillSpread


def test_skewed_batch_greedy_matches_transformers_with_and_without_the_spread(
    tiny_llm: Any, tiny_llama_dir: Path
) -> None:
    prompts = random_prompts(12, 4, 30, seed=3)
    max_tokens = [30] + [2 + 5 * i % 9 for i in range(1, 12)]  # one long output, short ones
    hf_model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    want = [tokens[:n] for tokens, n in zip(hf_greedy(hf_model, prompts, 30), max_tokens)]
    scheduler = tiny_llm.llm_engine.engine_core.scheduler
    plain_schedule, saved = scheduler.schedule, scheduler.spread
    admission_steps: list[int] = []

    def schedule():
        output = plain_schedule()
        admission_steps.extend(output.step_id for _ in output.new_reqs)
        return output

    last_admission = {}
    scheduler.schedule = schedule
    try:
        for name, spread in (("spread", PrefillSpread(2048, target_rows=0)), ("plain", None)):
            scheduler.spread = spread
            admission_steps.clear()
            outputs = tiny_llm.generate(
                [{"prompt_token_ids": p} for p in prompts],
                [
                    SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
                    for n in max_tokens
                ],
                use_tqdm=False,
            )
            assert [o.outputs[0].token_ids for o in outputs] == want, name
            last_admission[name] = max(admission_steps) - min(admission_steps)
    finally:
        scheduler.schedule, scheduler.spread = plain_schedule, saved
    assert last_admission["plain"] == 0  # every prompt in the first step
    assert last_admission["spread"] >= 10  # short outputs start near the long one's end
