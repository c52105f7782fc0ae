"""One rank of an external_launcher run, as torchrun would start it (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT in the environment): the same script on every rank; prints the greedy
and seeded token ids as JSON. Used by test_external_launcher.py, which runs tokens() at tp = 1."""

from __future__ import annotations

import json
import sys

from pagedlm import LLM, SamplingParams

ENGINE = dict(
    skip_tokenizer_init=True,
    dtype="float32",
    device="cpu",
    max_model_len=64,
    num_gpu_blocks_override=16,
)


def tokens(llm: LLM) -> list[list[int]]:
    prompts = [{"prompt_token_ids": list(range(2 + i, 12 + 2 * i))} for i in range(4)]
    params = [SamplingParams(max_tokens=8, temperature=0.0)] * 2
    params += [SamplingParams(max_tokens=8, temperature=1.0, seed=7)] * 2
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


if __name__ == "__main__":
    llm = LLM(
        sys.argv[1],
        tensor_parallel_size=2,
        distributed_executor_backend="external_launcher",
        **ENGINE,
    )
    print(json.dumps(tokens(llm)), flush=True)
