"""SamplingState: seeded reproducibility, the all-greedy short path, rows, bad input."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import pagedlm.sample.sampler as sampler_module
import pagedlm.sample.state as state_module
from pagedlm.sample import SamplingState
from pagedlm.sampling_params import SamplingParams

VOCAB_SIZE = 64
NUM_STEPS = 8
SEEDED = SamplingParams(temperature=1.0, top_k=20, top_p=0.95, seed=1234)


def step_logits(step: int) -> torch.Tensor:
    """The seeded request's logits at a step, the same in every scenario. [V]"""
    return torch.randn(VOCAB_SIZE, generator=torch.Generator().manual_seed(step))


def mixed_params(rng: random.Random) -> SamplingParams:
    return rng.choice(
        [
            SamplingParams(temperature=0.0),
            SamplingParams(temperature=0.7, top_p=0.8),
            SamplingParams(temperature=1.3, top_k=5, min_p=0.1),
            SamplingParams(temperature=1.0, repetition_penalty=1.5, presence_penalty=0.5),
            SamplingParams(temperature=0.9, logit_bias={3: 4.0}, logprobs=2),
            SamplingParams(temperature=1.0, allowed_token_ids=[1, 2, 3, 4], seed=7),
            SamplingParams(temperature=1.0, min_tokens=3, stop_token_ids=[5]),
        ]
    )


def run_seeded(
    row: int,
    num_others: int,
    state_seed: int,
    first_step: int = 0,
    outputs: list[int] | None = None,
) -> list[int]:
    """The seeded request at `row` among `num_others` mixed requests, in a shuffled batch."""
    rng = random.Random(state_seed)
    num_rows = max(row, num_others) + 1
    state = SamplingState(num_rows, VOCAB_SIZE, "cpu", seed=state_seed)
    state.add_request(row, SEEDED, [1, 2, 3], list(outputs or []))
    others = [r for r in range(num_rows) if r != row][:num_others]
    for other in others:
        state.add_request(other, mixed_params(rng), [rng.randrange(VOCAB_SIZE)], [])
    tokens = []
    for step in range(first_step, NUM_STEPS):
        rows = [row] + others
        rng.shuffle(rows)
        logits = torch.randn(len(rows), VOCAB_SIZE) * 2
        logits[rows.index(row)] = step_logits(step)
        sampled = state.sample(logits, np.array(rows, dtype=np.int32)).sampled_token_ids
        tokens.append(int(sampled[rows.index(row)]))
    return tokens


def test_seeded_request_is_reproducible_anywhere() -> None:
    alone = run_seeded(row=0, num_others=0, state_seed=0)
    assert len(set(alone)) > 2  # it does sample at random
    assert run_seeded(row=5, num_others=15, state_seed=1) == alone
    assert run_seeded(row=13, num_others=6, state_seed=2) == alone
    # resumed after preemption with three outputs: the noise picks up where it left off
    assert (
        run_seeded(row=2, num_others=4, state_seed=3, first_step=3, outputs=alone[:3]) == alone[3:]
    )


def test_other_seed_or_step_other_tokens() -> None:
    state = SamplingState(2, VOCAB_SIZE, "cpu", seed=0)
    state.add_request(0, SamplingParams(seed=1), [1], [])
    state.add_request(1, SamplingParams(seed=2), [1], [])
    logits = torch.zeros(2, VOCAB_SIZE)  # uniform: the tokens are the noise's choice
    tokens = [
        state.sample(logits.clone(), np.array([0, 1])).sampled_token_ids.tolist() for _ in range(10)
    ]
    assert [t[0] for t in tokens] != [t[1] for t in tokens]
    assert len({t[0] for t in tokens}) > 3  # fresh noise at each step


class Calls:
    def __init__(self, fn):  # noqa: ANN001
        self.fn, self.count = fn, 0

    def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204
        self.count += 1
        return self.fn(*args, **kwargs)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, Calls]:
    """Count the device work of each optional feature (and every host-to-device upload)."""
    watched = {
        "upload": (state_module, "upload"),
        "top_k_top_p": (sampler_module, "top_k_top_p_threshold"),
        "truncate": (sampler_module, "truncate"),
        "noise": (sampler_module, "gumbel_draw"),
        "penalties": (sampler_module, "apply_penalties"),
    }
    counters = {}
    for name, (module, attr) in watched.items():
        counters[name] = Calls(getattr(module, attr))
        monkeypatch.setattr(module, attr, counters[name])
    return counters


def test_all_greedy_batch_is_just_argmax(calls: dict[str, Calls]) -> None:
    state = SamplingState(3, VOCAB_SIZE, "cpu", seed=0)
    for row in range(3):  # truncation and seeds mean nothing to greedy requests
        state.add_request(
            row, SamplingParams(temperature=0.0, top_k=3, top_p=0.5, min_p=0.2, seed=row), [1], []
        )
    calls["upload"].count = 0  # not counting the tables' first upload
    for _ in range(3):
        logits = torch.randn(3, VOCAB_SIZE)
        sampled = state.sample(logits.clone(), np.array([2, 0, 1])).sampled_token_ids
        assert torch.equal(sampled, logits.argmax(dim=-1))
    assert {name: c.count for name, c in calls.items()} == dict.fromkeys(calls, 0)


def test_features_launch_only_when_a_row_uses_them(calls: dict[str, Calls]) -> None:
    state = SamplingState(4, VOCAB_SIZE, "cpu", seed=0)
    state.add_request(0, SamplingParams(temperature=1.0), [1], [])
    state.add_request(1, SamplingParams(temperature=0.0, frequency_penalty=1.0), [1], [])
    state.add_request(2, SamplingParams(temperature=0.5, top_k=4), [1], [])
    state.add_request(3, SamplingParams(temperature=0.5, min_p=0.1), [1], [])
    state.sample(torch.randn(1, VOCAB_SIZE), np.array([0]))
    assert (
        calls["noise"].count,
        calls["top_k_top_p"].count,
        calls["truncate"].count,
        calls["penalties"].count,
    ) == (1, 0, 0, 0)
    state.sample(torch.randn(2, VOCAB_SIZE), np.array([1, 2]))
    assert (calls["top_k_top_p"].count, calls["truncate"].count, calls["penalties"].count) == (
        1,
        1,
        1,
    )
    state.sample(torch.randn(2, VOCAB_SIZE), np.array([3, 0]))  # min-p: a threshold, no top-k/top-p
    assert (calls["top_k_top_p"].count, calls["truncate"].count, calls["penalties"].count) == (
        1,
        2,
        1,
    )


def test_row_reuse_forgets_the_old_request() -> None:
    state = SamplingState(2, VOCAB_SIZE, "cpu", seed=0)
    state.add_request(
        0, SamplingParams(temperature=0.0, logit_bias={9: 50.0}, presence_penalty=2.0), [9], [9, 9]
    )
    state.remove_request(0)
    state.add_request(0, SamplingParams(temperature=0.0), [1], [])
    logits = torch.randn(1, VOCAB_SIZE)
    assert state.sample(logits.clone(), np.array([0])).sampled_token_ids[0] == logits.argmax()


def test_bad_input_raises_value_error_naming_the_parameter() -> None:
    state = SamplingState(2, VOCAB_SIZE, "cpu", seed=0)
    with pytest.raises(ValueError, match="row must be in"):
        state.add_request(2, SamplingParams(), [1], [])
    with pytest.raises(ValueError, match="eos_token_ids"):
        state.add_request(0, SamplingParams(), [1], [], eos_token_ids=[-1])
    state.add_request(0, SamplingParams(), [1], [])
    with pytest.raises(ValueError, match="already holds"):
        state.add_request(0, SamplingParams(), [1], [])
    with pytest.raises(ValueError, match="logits must have shape"):
        state.sample(torch.randn(2, VOCAB_SIZE), np.array([0]))
    with pytest.raises(ValueError, match="rows_np holds rows without"):
        state.sample(torch.randn(1, VOCAB_SIZE), np.array([1]))
    with pytest.raises(ValueError, match="rows_np must be in"):
        state.sample(torch.randn(1, VOCAB_SIZE), np.array([-1]))
    with pytest.raises(ValueError, match="holds no request"):
        state.remove_request(1)
    with pytest.raises(ValueError, match="max_num_reqs"):
        SamplingState(0, VOCAB_SIZE, "cpu", seed=0)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8),
        SamplingParams(temperature=0.0, logprobs=0),
        SamplingParams(temperature=0.0, repetition_penalty=1.2),
        SamplingParams(temperature=0.0, logit_bias={3: 1.0}),
        SamplingParams(temperature=0.0, allowed_token_ids=[1, 2]),
        SamplingParams(temperature=0.0, bad_words_token_ids=[[4]]),
    ],
    ids=["random", "logprobs", "penalty", "bias", "allowed", "bad_words"],
)
def test_is_greedy_only_without_any_other_feature(params: SamplingParams) -> None:
    state = SamplingState(3, VOCAB_SIZE, "cpu", seed=0)
    state.add_request(0, SamplingParams(temperature=0.0, top_k=3, seed=1), [1], [])  # greedy
    state.add_request(2, params, [1], [])
    assert state.is_greedy(np.array([0])) and not state.is_greedy(np.array([0, 2]))
    assert not state.is_greedy(np.array([2]))
    with pytest.raises(ValueError, match="count_sampled"):
        state.count_sampled(np.array([2, 0]))
    with pytest.raises(ValueError, match="rows_np holds rows without"):
        state.is_greedy(np.array([1]))


def test_min_tokens_is_greedy_once_reached() -> None:
    """Bans on EOS and stop ids apply while fewer than min_tokens were sampled, whether by
    sample() or reported by count_sampled(); a row resumed with outputs counts those."""
    state = SamplingState(3, VOCAB_SIZE, "cpu", seed=0)
    params = SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[7])
    state.add_request(0, params, [1], [])
    state.add_request(1, params, [1], [5, 5, 5])  # resumed: at min_tokens already
    state.add_request(2, SamplingParams(temperature=0.0, min_tokens=2), [1], [])  # nothing to ban
    rows = np.array([0, 1, 2])
    assert state.is_greedy(np.array([1, 2])) and not state.is_greedy(rows)
    logits = torch.zeros(3, VOCAB_SIZE)
    logits[:, 7] = 1.0  # the stop id leads
    assert state.sample(logits.clone(), rows).sampled_token_ids.tolist() == [0, 7, 7]
    assert not state.is_greedy(rows)
    state.sample(logits.clone(), rows)  # the second token of row 0
    assert not state.is_greedy(rows)
    with pytest.raises(ValueError, match="count_sampled"):
        state.count_sampled(rows)
    state.sample(logits.clone(), rows)  # the third
    assert state.is_greedy(rows)
    state.count_sampled(rows)
    assert state.sample(logits.clone(), rows).sampled_token_ids.tolist() == [7, 7, 7]


def test_rows_checked_again_after_a_row_changes_owner() -> None:
    state = SamplingState(2, VOCAB_SIZE, "cpu", seed=0)
    state.add_request(0, SamplingParams(temperature=0.0), [1], [])
    state.add_request(1, SamplingParams(temperature=0.0), [1], [])
    rows = np.array([0, 1])
    assert state.is_greedy(rows)
    state.remove_request(1)
    with pytest.raises(ValueError, match="rows_np holds rows without"):
        state.sample(torch.randn(2, VOCAB_SIZE), rows)  # the same array, checked again
