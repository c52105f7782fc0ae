"""The per-step pipeline (worker, engine core, sampling state) on the CPU, through the real
Scheduler and EngineCore (async scheduling on and off): each test names the defect it pinned (BUG:
it failed before the fix) or the path no other test covered (PATH)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_hf_models
import torch

from pagedlm import LLM, SamplingParams

VOCAB_SIZE = tiny_hf_models.VOCAB_SIZE  # 256; EOS is token 1
PROMPTS = [[5, 6, 7, 8], [9, 10, 11]]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_llama")
    tiny_hf_models.save_tiny_model(folder, "llama")
    return folder


def _llm(folder: Path, async_scheduling: bool, **kwargs) -> LLM:
    args = dict(
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=64,
        num_gpu_blocks_override=64,
        device="cpu",
        async_scheduling=async_scheduling,
    )
    return LLM(str(folder), **{**args, **kwargs})


def _tokens(outputs) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in outputs]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_min_tokens_with_nothing_to_ban_beside_a_request_past_its_min_tokens(
    tiny_dir: Path, async_scheduling: bool
) -> None:
    """BUG (sample/state.py make_batch): `past_min` bans EOS for its first token only (flag
    MIN_TOKENS set); `below_min` has min_tokens but nothing to ban (ignore_eos, no stop ids: flag
    unset). From the second step `below` holds for `below_min` alone, so `below.any()` is true while
    `flags & below` is all False, and PaddedRows.gather takes the max of an empty array: the whole
    step raises "zero-size array to reduction operation maximum". Each request alone runs."""
    llm = _llm(tiny_dir, async_scheduling)
    past_min = SamplingParams(temperature=0.0, min_tokens=1, max_tokens=6)
    below_min = SamplingParams(temperature=1.0, seed=3, min_tokens=5, max_tokens=6, ignore_eos=True)
    alone = [
        llm.generate(PROMPTS[0], past_min, use_tqdm=False)[0],
        llm.generate(PROMPTS[1], below_min, use_tqdm=False)[0],
    ]
    together = llm.generate(PROMPTS, [past_min, below_min], use_tqdm=False)
    assert _tokens(together) == _tokens(alone)
    assert len(together[1].outputs[0].token_ids) == 6


@pytest.mark.parametrize(
    "bad_words", [[[VOCAB_SIZE + 4]], [[]]]
)  # refused by check_vocab; by set_row
def test_a_request_the_sampler_refuses_leaves_no_row_behind(
    tiny_dir: Path, bad_words: list
) -> None:
    """BUG (sample/state.py add_request): SamplingState marks the row active before
    BadWordsTables.set_row validates bad_words_token_ids; when that raises, ModelRunner frees the
    InputBatch row but the sampler's row stays active, and every later request given that row fails
    with "row 0 already holds a request": one bad request wedges the engine for good.
    (SamplingParams.check_vocab did not check bad_words_token_ids either: now it does, and an empty
    word, which only set_row refuses, frees the sampler's row.)"""
    llm = _llm(tiny_dir, async_scheduling=False)
    greedy = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    expected = _tokens(llm.generate(PROMPTS[0], greedy, use_tqdm=False))
    bad = SamplingParams(temperature=0.0, max_tokens=3, bad_words_token_ids=bad_words)
    with pytest.raises(ValueError, match="bad_words_token_ids"):
        llm.generate(PROMPTS[0], bad, use_tqdm=False)
    assert _tokens(llm.generate(PROMPTS[0], greedy, use_tqdm=False)) == expected


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_request_id_reused_after_its_finish_gets_no_stale_token(
    tiny_dir: Path, async_scheduling: bool
) -> None:
    """BUG, fixed since in 26da3f8 (core/scheduler.py update_from_output looked requests up by id):
    "chat" finishes on a stop token at step N's update while step N+1, launched already, samples
    one more token for it. The caller reads the finished output and adds a new request under the
    same id; when step N+1's output came back, the new request took the old one's token (and lost
    a placeholder): its outputs started with a token of another sequence and lost their last one.
    tests/core/test_scheduler_robustness.py pins the abort and stop-string triggers; this one the
    token-level stop, through LLMEngine. Sync mode was right."""
    llm = _llm(tiny_dir, async_scheduling)
    engine = llm.llm_engine
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    first_turn = _tokens(llm.generate(PROMPTS[0], greedy, use_tqdm=False))[0]
    expected = _tokens(llm.generate(PROMPTS[1], greedy, use_tqdm=False))[0]
    stop_early = SamplingParams(temperature=0.0, max_tokens=6, stop_token_ids=[first_turn[1]])
    results = []
    for prompt, params in ((PROMPTS[0], stop_early), (PROMPTS[1], greedy)):
        engine.add_request("chat", prompt, params)  # the next turn as soon as the last finished
        finished = []
        while not finished:
            finished = [out for out in engine.step() if out.finished]
        results.append(finished[0].outputs[0])
    while engine.has_unfinished_requests():
        engine.step()
    assert (results[0].token_ids, results[0].finish_reason) == (first_turn[:2], "stop")
    assert (results[1].token_ids, results[1].finish_reason) == (expected, "length")


def test_an_empty_step_still_frees_the_requests_that_finished(tiny_dir: Path) -> None:
    """PATH (engine_core._launch, async): "stops" ends on a stop token at step 2's update while step
    3 is in flight; "fills" has reached max_tokens with its last token in flight, so the next
    schedule() has no token to run, only finished_req_ids. That empty plan must still reach the
    worker (it frees "stops"'s row): with max_num_seqs=2 the next two requests need both rows.
    Fails if _launch drops an empty plan that carries finished_req_ids (the rows leak: "all
    max_num_seqs=2 rows are taken")."""
    llm = _llm(tiny_dir, async_scheduling=True, max_num_seqs=2)
    greedy = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    expected = _tokens(llm.generate(PROMPTS, greedy, use_tqdm=False))
    runner = llm.llm_engine.engine_core.model_runner
    launched = []
    execute_forward = runner.execute_forward  # the step's first half: the engine core calls it

    def spy(sched):
        launched.append((sched.is_empty, set(sched.finished_req_ids)))
        return execute_forward(sched)

    runner.execute_forward = spy
    stops = SamplingParams(temperature=0.0, max_tokens=6, stop_token_ids=[expected[0][1]])
    outputs = llm.generate(PROMPTS, [stops, greedy], use_tqdm=False)
    assert _tokens(outputs) == [expected[0][:2], expected[1]]
    assert _tokens(llm.generate(PROMPTS, greedy, use_tqdm=False)) == expected
    assert (True, {"llm-2"}) in launched, launched  # the path: an empty plan freeing "stops"


@torch.no_grad()
def _hf_greedy_from_embeds(
    model: torch.nn.Module, prompt_embeds: torch.Tensor, num_tokens: int
) -> list[int]:
    """transformers' logits, argmax by hand (never stopping at EOS), from prompt embeddings."""
    embeds, tokens = prompt_embeds[None], []  # [1, P, hidden_size]
    embed_tokens = model.get_input_embeddings()
    for _ in range(num_tokens):
        tokens.append(int(model(inputs_embeds=embeds).logits[0, -1].argmax()))
        embeds = torch.cat([embeds, embed_tokens(torch.tensor([[tokens[-1]]]))], dim=1)
    return tokens


def test_prompt_embeds_request_preempted_with_outputs_resumes_right(tiny_dir: Path) -> None:
    """PATH (input_batch._embeds_spans, async engine with preemption): a prompt_embeds request
    preempted after generating tokens is recomputed in one chunk of its prompt rows (from its
    embeddings) and its outputs (from their token ids): only the scheduled prompt positions take
    embedding rows (`min(num_scheduled, num_prompt - num_computed)`). Every request must equal
    transformers' greedy tokens from the same embeddings. Fails if the span covers the whole chunk
    (shape mismatch) or if the resumed request loses its embeddings."""
    from transformers import AutoModelForCausalLM

    llm = _llm(
        tiny_dir,
        async_scheduling=True,
        num_gpu_blocks_override=9,
        block_size=8,
        max_num_batched_tokens=32,
    )
    llm.llm_engine.engine_core.scheduler.growth.enabled = False  # admit by the prompt: preempt
    runner = llm.llm_engine.engine_core.model_runner
    resumed = []
    execute_forward = runner.execute_forward  # the step's first half: the engine core calls it

    def spy(sched):
        resumed.extend(new.req_id for new in sched.new_reqs if new.output_token_ids)
        return execute_forward(sched)

    runner.execute_forward = spy
    generator = torch.Generator().manual_seed(0)
    prompts = [{"prompt_embeds": torch.randn(18, 64, generator=generator) * 0.5} for _ in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert resumed, "no request was resumed with outputs"  # all are prompt_embeds
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    for prompt, output in zip(prompts, outputs):
        assert output.outputs[0].token_ids == _hf_greedy_from_embeds(
            model, prompt["prompt_embeds"], 20
        )
