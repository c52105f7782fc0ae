"""Workload T4, a skewed request mix, defined once for pagedlm and its peers (numpy only, so that
the vLLM bench script can import it as is).

T4: NUM_REQUESTS requests on llama3-8b, all submitted at once. Prompt lengths log-normal (median
PROMPT_MEDIAN tokens, sigma PROMPT_SIGMA), clipped to [PROMPT_MIN, PROMPT_MAX]: about a tenth of the
prompts are over 1,000 tokens, a few percent over 3,000, a long tail up to 7,000. Output lengths
log-uniform over [OUTPUT_MIN, OUTPUT_MAX], independent of the prompt's. Token ids uniform in
[ID_LO, ID_HI). Sampled at temperature 0.7, top_p 0.9, each request with its own seed (its index),
ignore_eos. One numpy Generator seeded with SEED draws, in order: the prompt lengths, the output
lengths, then the ids of each prompt.
"""

from __future__ import annotations

import numpy as np

NUM_REQUESTS = 512
SEED = 0
PROMPT_MEDIAN, PROMPT_SIGMA = 250, 1.1
PROMPT_MIN, PROMPT_MAX = 16, 7000
OUTPUT_MIN, OUTPUT_MAX = 16, 1024
ID_LO, ID_HI = 100, 30000
TEMPERATURE, TOP_P = 0.7, 0.9


def skewed_mix(
    num_requests: int = NUM_REQUESTS, seed: int = SEED
) -> tuple[list[list[int]], list[int]]:
    """-> (prompts as token ids, max_tokens of each)."""
    rng = np.random.default_rng(seed)
    log_lens = rng.normal(np.log(PROMPT_MEDIAN), PROMPT_SIGMA, num_requests)
    prompt_lens = np.clip(np.rint(np.exp(log_lens)), PROMPT_MIN, PROMPT_MAX).astype(int)
    log_out = rng.uniform(np.log(OUTPUT_MIN), np.log(OUTPUT_MAX), num_requests)
    output_lens = np.clip(np.rint(np.exp(log_out)), OUTPUT_MIN, OUTPUT_MAX).astype(int)
    prompts = [rng.integers(ID_LO, ID_HI, size=n).tolist() for n in prompt_lens]
    return prompts, output_lens.tolist()
