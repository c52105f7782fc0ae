"""Masks, logit_bias and penalties against a per-request Python reference; logprobs; greedy."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
import torch

from pagedlm.sample import SamplingState
from pagedlm.sample.sampler import process_logits
from pagedlm.sampling_params import SamplingParams

VOCAB_SIZE = 40
EOS = [2, 3]


def reference_logits(
    logits: list[float], params: SamplingParams, prompt: list[int], outputs: list[int]
) -> list[float]:
    """One request, plain Python: allowed, min_tokens, logit_bias, then the penalties."""
    x = list(logits)
    if params.allowed_token_ids is not None:
        x = [v if t in params.allowed_token_ids else -float("inf") for t, v in enumerate(x)]
    if len(outputs) < params.min_tokens:
        for t in params.stop_token_ids + ([] if params.ignore_eos else EOS):
            x[t] = -float("inf")
    for t, bias in (params.logit_bias or {}).items():
        x[t] += bias
    for t in set(prompt) | set(outputs):
        r = params.repetition_penalty
        x[t] = x[t] / r if x[t] > 0 else x[t] * r
    for t, count in Counter(outputs).items():
        x[t] -= params.frequency_penalty * count + params.presence_penalty
    return x


def random_params(rng: random.Random, every_feature: bool) -> SamplingParams:
    def maybe(value: object, default: object) -> object:
        return value if every_feature or rng.random() < 0.5 else default

    return SamplingParams(
        temperature=rng.choice([0.0, 0.7, 1.0]),
        repetition_penalty=maybe(rng.uniform(0.5, 2.0), 1.0),
        frequency_penalty=maybe(rng.uniform(-2.0, 2.0), 0.0),
        presence_penalty=maybe(rng.uniform(-2.0, 2.0), 0.0),
        logit_bias=maybe(
            {t: rng.uniform(-5, 5) for t in rng.sample(range(VOCAB_SIZE), rng.randint(1, 6))}, None
        ),
        allowed_token_ids=maybe(rng.sample(range(VOCAB_SIZE), rng.randint(3, 20)), None),
        min_tokens=maybe(rng.randint(1, 4), 0),
        stop_token_ids=maybe(rng.sample(range(VOCAB_SIZE), 2), None),
        ignore_eos=rng.random() < 0.3,
        max_tokens=50,
    )


@pytest.mark.parametrize("every_feature", [False, True])  # some rows of a batch use it / all do
def test_processed_logits_match_reference_over_steps(every_feature: bool) -> None:
    rng = random.Random(0)
    torch.manual_seed(0)
    num_rows, num_reqs = 16, 12
    state = SamplingState(num_rows, VOCAB_SIZE, "cpu", seed=0)
    reqs: dict[int, tuple[SamplingParams, list[int], list[int]]] = {}

    def add(row: int) -> None:
        params = random_params(rng, every_feature)
        prompt = [rng.randrange(VOCAB_SIZE) for _ in range(rng.randint(1, 12))]
        outputs = [rng.randrange(VOCAB_SIZE) for _ in range(rng.choice([0, 0, 2, 5]))]  # resumed
        state.add_request(row, params, prompt, list(outputs), eos_token_ids=EOS)
        reqs[row] = (params, prompt, outputs)

    for row in rng.sample(range(num_rows), num_reqs):
        add(row)
    for step in range(6):
        if step == 3:  # a row changes hands: its device history must be rebuilt
            row = rng.choice(list(reqs))
            state.remove_request(row)
            del reqs[row]
            add(row)
        rows = rng.sample(list(reqs), rng.randint(4, len(reqs)))
        logits = torch.randn(len(rows), VOCAB_SIZE) * 3
        got = process_logits(logits.clone(), state.make_batch(np.array(rows)))
        for i, row in enumerate(rows):
            params, prompt, outputs = reqs[row]
            want = torch.tensor(reference_logits(logits[i].tolist(), params, prompt, outputs))
            torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-5, equal_nan=False)
        sampled = state.sample(logits.clone(), np.array(rows, dtype=np.int32)).sampled_token_ids
        for i, row in enumerate(rows):
            reqs[row][2].append(int(sampled[i]))


def test_greedy_rows_take_the_argmax_of_processed_logits() -> None:
    state = SamplingState(4, VOCAB_SIZE, "cpu", seed=0)
    penalised = SamplingParams(temperature=0.0, repetition_penalty=1e3)
    state.add_request(0, SamplingParams(temperature=0.0), [1], [])
    state.add_request(1, SamplingParams(temperature=0.0, logit_bias={7: 100.0}), [1], [])
    state.add_request(2, SamplingParams(temperature=1.0, top_k=3), [1], [])
    state.add_request(3, penalised, [1], [])
    outputs: list[int] = []
    for _ in range(5):
        logits = torch.randn(4, VOCAB_SIZE)
        logits[3, 1] = 50.0  # the prompt token: penalised away
        sampled = state.sample(logits.clone(), np.array([0, 1, 2, 3])).sampled_token_ids
        assert sampled[0] == logits[0].argmax()
        assert sampled[1] == 7
        assert sampled[2] in logits[2].topk(3).indices
        want = torch.tensor(reference_logits(logits[3].tolist(), penalised, [1], outputs)).argmax()
        assert sampled[3] == want and want != 1
        outputs.append(int(sampled[3]))


def test_min_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    state = SamplingState(3, VOCAB_SIZE, "cpu", seed=0)
    state.add_request(
        0,
        SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[9]),
        [1],
        [],
        eos_token_ids=EOS,
    )
    state.add_request(
        1, SamplingParams(temperature=0.0, min_tokens=3), [1], [5, 5], eos_token_ids=EOS
    )
    state.add_request(
        2,
        SamplingParams(temperature=0.8, min_tokens=2, ignore_eos=True, stop_token_ids=[9]),
        [1],
        [],
        eos_token_ids=EOS,
    )
    logits = torch.full((3, VOCAB_SIZE), -10.0)
    logits[:, 2], logits[:, 3], logits[:, 9], logits[:, 11] = 10.0, 9.0, 8.0, 0.0
    logits[2, 2] = 40.0  # row 2 samples at random: make EOS all but certain
    tokens = [
        state.sample(logits.clone(), np.arange(3)).sampled_token_ids.tolist() for _ in range(4)
    ]
    assert [t[0] for t in tokens] == [11, 11, 11, 2]
    assert [t[1] for t in tokens] == [9, 2, 2, 2]  # resumed: one output short of min_tokens
    assert [t[2] for t in tokens] == [2, 2, 2, 2]  # ignore_eos: EOS is not banned


def test_allowed_token_ids_restrict_random_and_greedy() -> None:
    allowed = [3, 10, 17, 33]
    state = SamplingState(2, VOCAB_SIZE, "cpu", seed=0)
    state.add_request(0, SamplingParams(temperature=1.5, allowed_token_ids=allowed), [1], [])
    state.add_request(1, SamplingParams(temperature=0.0, allowed_token_ids=allowed), [1], [])
    seen = set()
    for _ in range(60):
        logits = torch.randn(2, VOCAB_SIZE)
        sampled = state.sample(logits.clone(), np.array([0, 1])).sampled_token_ids
        assert sampled[0].item() in allowed
        assert sampled[1] == allowed[int(logits[1, allowed].argmax())]
        seen.add(sampled[0].item())
    assert seen == set(allowed)


def test_logprobs_are_log_softmax_of_raw_logits() -> None:
    state = SamplingState(6, VOCAB_SIZE, "cpu", seed=0)
    state.add_request(0, SamplingParams(temperature=0.0, logprobs=0), [1], [])
    state.add_request(
        1, SamplingParams(temperature=0.9, logprobs=3, repetition_penalty=1.8), [1, 4], []
    )
    state.add_request(
        2, SamplingParams(temperature=1.0, logprobs=5, top_k=4, logit_bias={6: 3.0}), [1], []
    )
    state.add_request(3, SamplingParams(temperature=2.0), [1], [])
    state.add_request(4, SamplingParams(temperature=0.0, presence_penalty=2.0, logprobs=2), [1], [])
    rows = np.array([4, 2, 0, 3, 1])
    for _ in range(4):
        logits = torch.randn(len(rows), VOCAB_SIZE) * 2
        out = state.sample(logits.clone(), rows)
        token_ids, logprobs, ranks = out.logprobs
        assert token_ids.shape == logprobs.shape == (len(rows), 6) and ranks.shape == (len(rows),)
        want = logits.log_softmax(dim=-1)
        sampled = out.sampled_token_ids
        assert torch.equal(token_ids[:, 0], sampled)
        torch.testing.assert_close(logprobs, want.gather(1, token_ids))
        assert torch.equal(token_ids[:, 1:], want.topk(5, dim=-1).indices)
        want_ranks = [int((want[i] >= want[i, sampled[i]]).sum()) for i in range(len(rows))]
        assert ranks.tolist() == want_ranks
        assert ranks[2] == 1  # greedy without penalties: the top token


def test_no_logprobs_when_nobody_asks() -> None:
    state = SamplingState(2, VOCAB_SIZE, "cpu", seed=0)
    state.add_request(0, SamplingParams(temperature=0.5), [1], [])
    assert state.sample(torch.randn(1, VOCAB_SIZE), np.array([0])).logprobs is None


def test_penalties_over_growing_and_empty_histories() -> None:
    """A history that outgrows the device table while sampling, one that arrives longer than
    it, and an empty prompt (prompt_embeds: no id may be penalised before the first output)."""
    rng = random.Random(1)
    params = SamplingParams(
        temperature=1.0, repetition_penalty=1.7, frequency_penalty=0.6, presence_penalty=-0.4
    )
    state = SamplingState(3, VOCAB_SIZE, "cpu", seed=0)
    histories: dict[int, tuple[list[int], list[int]]] = {}

    def add(row: int, prompt: list[int], outputs: list[int]) -> None:
        state.add_request(row, params, prompt, list(outputs))
        histories[row] = (prompt, outputs)

    add(0, [rng.randrange(VOCAB_SIZE) for _ in range(60)], [])  # 64 slots: grows at step 4
    add(1, [], [])
    for step in range(10):
        if step == 3:
            add(2, [rng.randrange(VOCAB_SIZE) for _ in range(150)], [5, 5, 7])
        rows = sorted(histories)
        logits = torch.randn(len(rows), VOCAB_SIZE) * 3
        logits[:, 0] = 2.0  # the id an empty history's slots hold: must stay untouched
        got = process_logits(logits.clone(), state.make_batch(np.array(rows)))
        for i, row in enumerate(rows):
            want = torch.tensor(reference_logits(logits[i].tolist(), params, *histories[row]))
            torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-5)
        sampled = state.sample(logits.clone(), np.array(rows)).sampled_token_ids
        for i, row in enumerate(rows):
            histories[row][1].append(int(sampled[i]))
    assert state._penalties().token_ids.shape[1] > 150
