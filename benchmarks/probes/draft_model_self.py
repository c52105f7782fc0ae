"""The draft_model proposer on the CPU with the only real pair here, the default model
(SmolLM2-135M) as its own draft: acceptance, and what a step costs (verify and propose apart)
against plain decoding. A greedy verify loop stands in for the worker (the target model on its
own paged cache with every block it will need, drafts accepted while they equal its argmax, as
the rejection sampler's greedy path); plain decoding is the same model one token a step.

A self-draft accepts ~every draft but costs as much as the target per token, so it cannot pay:
this measures the proposer's cost and acceptance, not a speedup a small draft would give.
Usage: python benchmarks/probes/draft_model_self.py [batch] [k] [num_tokens] [dtype]"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

from pagedlm.attention.backend import AttentionMetadata, get_attention_backend
from pagedlm.config import EngineArgs, default_model_path
from pagedlm.engine.tokenizer import load_tokenizer
from pagedlm.model.loader import load_model
from pagedlm.spec_decode.draft_model import DraftModelProposer, ModelVerifiedStep

BLOCK_SIZE = 16
MAX_MODEL_LEN = 1024
PROMPT = "Once upon a time, a lighthouse keeper named"


def metadata(starts: list[int], tokens: list[list[int]], table: torch.Tensor) -> tuple:
    """(input_ids, positions, AttentionMetadata) of requests b with inputs tokens[b] from
    position starts[b]; request b owns row b of table."""
    qsl, seq_lens, slots, positions = [0], [], [], []
    for row, (start, ids) in enumerate(zip(starts, tokens)):
        pos = np.arange(start, start + len(ids))
        positions += pos.tolist()
        slots += (table[row, pos // BLOCK_SIZE].numpy() * BLOCK_SIZE + pos % BLOCK_SIZE).tolist()
        qsl.append(qsl[-1] + len(ids))
        seq_lens.append(start + len(ids))
    host_qsl = torch.tensor(qsl, dtype=torch.int32)
    host_lens = torch.tensor(seq_lens, dtype=torch.int32)
    meta = AttentionMetadata(
        num_tokens=qsl[-1],
        num_seqs=len(tokens),
        max_query_len=max(map(len, tokens)),
        max_seq_len=max(seq_lens),
        query_start_loc=host_qsl,
        seq_lens=host_lens,
        slot_mapping=torch.tensor(slots),
        block_table=table[: len(tokens)],
        query_start_loc_cpu=host_qsl,
        seq_lens_cpu=host_lens,
    )
    ids = torch.tensor([t for row in tokens for t in row])
    return ids, torch.tensor(positions), meta


def new_caches(model_config, num_blocks: int) -> list[torch.Tensor]:
    shape = (2, num_blocks, BLOCK_SIZE, model_config.num_kv_heads, model_config.head_dim)
    return [torch.zeros(shape, dtype=model_config.dtype) for _ in range(model_config.num_layers)]


def speculative(target, proposer, prompts, k: int, num_tokens: int, num_blocks: int):
    caches = new_caches(target.config, num_blocks)
    cols = MAX_MODEL_LEN // BLOCK_SIZE
    table = torch.arange(1, 1 + len(prompts) * cols, dtype=torch.int32).view(-1, cols)
    for row, prompt in enumerate(prompts):
        proposer.add_request(row, prompt)
    starts, inputs = [0] * len(prompts), [list(p) for p in prompts]
    num_drafts = [0] * len(prompts)
    outputs = [[] for _ in prompts]
    verify_s = propose_s = 0.0
    num_spec_steps = 0
    while min(map(len, outputs)) < num_tokens:
        t0 = time.perf_counter()
        ids, positions, meta = metadata(starts, inputs, table)
        argmax = target.compute_logits(target(ids, positions, caches, meta)).argmax(-1).tolist()
        emitted, ends = [], np.cumsum([len(i) for i in inputs])
        for b, end in enumerate(ends):
            first, drafts = end - num_drafts[b] - 1, inputs[b][len(inputs[b]) - num_drafts[b] :]
            accepted = 0
            while accepted < len(drafts) and drafts[accepted] == argmax[first + accepted]:
                accepted += 1
            emitted.append(drafts[:accepted] + [argmax[first + accepted]])
        t1 = time.perf_counter()
        width = max(map(len, emitted))
        token_ids = torch.tensor([e + [-1] * (width - len(e)) for e in emitted])
        first_np = np.array([s + len(i) - n for s, i, n in zip(starts, inputs, num_drafts)])
        rows_np = np.arange(len(prompts))
        step = ModelVerifiedStep(
            rows_np=rows_np,
            rows=torch.from_numpy(rows_np),
            token_ids=token_ids,
            num_accepted=torch.tensor([len(e) - 1 for e in emitted]),
            first_positions_np=first_np,
            first_positions=torch.from_numpy(first_np),
            hidden_states=torch.zeros(0),
            batch_index_np=rows_np,
            layout=None,
            inputs=None,
            attn_metadata=meta,
            input_ids=ids,
        )
        drafts = proposer.propose(step).token_ids.tolist()
        t2 = time.perf_counter()
        if num_drafts[0]:  # the prefill step is timed apart from the speculative ones
            verify_s, propose_s, num_spec_steps = (
                verify_s + t1 - t0,
                propose_s + t2 - t1,
                num_spec_steps + 1,
            )
        for b, e in enumerate(emitted):
            outputs[b] += e
            starts[b] = int(first_np[b]) + len(e) - 1
            inputs[b], num_drafts[b] = [e[-1]] + drafts[b], k
    emitted_after_prefill = sum(len(o) - 1 for o in outputs)
    return outputs, emitted_after_prefill, num_spec_steps, verify_s, propose_s


def plain(target, prompts, num_tokens: int, num_blocks: int):
    caches = new_caches(target.config, num_blocks)
    cols = MAX_MODEL_LEN // BLOCK_SIZE
    table = torch.arange(1, 1 + len(prompts) * cols, dtype=torch.int32).view(-1, cols)
    starts, inputs = [0] * len(prompts), [list(p) for p in prompts]
    outputs, decode_s = [[] for _ in prompts], 0.0
    for i in range(num_tokens):
        t0 = time.perf_counter()
        ids, positions, meta = metadata(starts, inputs, table)
        hidden = target(ids, positions, caches, meta)
        last = meta.query_start_loc[1:].long() - 1
        tokens = target.compute_logits(hidden[last]).argmax(-1).tolist()
        if i:
            decode_s += time.perf_counter() - t0
        for b, token in enumerate(tokens):
            outputs[b].append(token)
            starts[b] += len(inputs[b])
            inputs[b] = [token]
    return outputs, decode_s


def main() -> None:
    batch, k, num_tokens = (
        int(a) for a in (sys.argv[1:4] + ["1", "4", "64"][len(sys.argv[1:4]) :])
    )
    dtype = sys.argv[4] if len(sys.argv) > 4 else "auto"
    torch.set_num_threads(1)
    model = default_model_path()
    spec = {"method": "draft_model", "model": model, "num_speculative_tokens": k}
    config = EngineArgs(
        model=model,
        dtype=dtype,
        device="cpu",
        max_model_len=MAX_MODEL_LEN,
        block_size=BLOCK_SIZE,
        speculative_config=spec,
    ).create_engine_config()
    num_blocks = 1 + batch * MAX_MODEL_LEN // BLOCK_SIZE
    target = load_model(config.model, get_attention_backend("auto", config.device), config.device)
    proposer = DraftModelProposer(config)
    proposer.load_model()
    proposer.allocate_kv_cache(num_blocks)
    tokenizer = load_tokenizer(config.model)
    prompts = [tokenizer.encode(f"{PROMPT} {name}") for name in ["Ada", "Bo", "Cy", "Di"] * 8][
        :batch
    ]
    with torch.inference_mode():
        spec_out, emitted, steps, verify_s, propose_s = speculative(
            target, proposer, prompts, k, num_tokens, num_blocks
        )
        plain_out, decode_s = plain(target, prompts, num_tokens, num_blocks)
    same = [s[:num_tokens] == p for s, p in zip(spec_out, plain_out)]
    plain_tps = batch * (num_tokens - 1) / decode_s
    spec_tps = emitted / (verify_s + propose_s)
    print(f"dtype {config.model.dtype}, batch {batch}, k {k}, {num_tokens} tokens a request")
    print(
        f"mean acceptance length {emitted / (steps * batch):.3f} (k + 1 = {k + 1}), "
        f"outputs equal plain greedy: {sum(same)}/{batch}"
    )
    print(
        f"a step: verify {1e3 * verify_s / steps:.1f} ms, "
        f"propose {1e3 * propose_s / steps:.1f} ms; "
        f"plain decode step {1e3 * decode_s / (num_tokens - 1):.1f} ms"
    )
    print(f"tok/s: speculative {spec_tps:.1f}, plain {plain_tps:.1f} ({spec_tps / plain_tps:.2f}x)")


if __name__ == "__main__":
    main()
