"""SpeculativeConfig (pagedlm/spec_decode/config.py) and EngineArgs' speculative_config: every key,
vLLM's defaults, and a one-line error naming the key for each bad value."""

from __future__ import annotations

import argparse
import json

import pytest

from pagedlm.config import EngineArgs
from pagedlm.spec_decode.config import SpeculativeConfig


def test_ngram_defaults_as_vllm() -> None:
    spec = SpeculativeConfig.from_user({"method": "ngram", "num_speculative_tokens": 4})
    assert (spec.prompt_lookup_min, spec.prompt_lookup_max) == (5, 5)
    assert spec.draft_sample_method == "greedy"
    assert spec.rejection_sample_method == "standard"
    assert spec.num_spec_tokens_for_batch(1) == spec.num_spec_tokens_for_batch(32) == 4
    # DEFAULT_K_BY_BATCH: at most 2 drafts from 33 to 64, plain above
    assert [spec.num_spec_tokens_for_batch(b) for b in (33, 64, 65)] == [2, 2, 0]
    assert [spec.max_logits_rows(n) for n in (8, 40, 64, 1024)] == [40, 160, 192, 1024]
    assert spec.expected_acceptance_length() is None


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"prompt_lookup_min": 2}, (2, 2)),
        ({"prompt_lookup_max": 7}, (7, 7)),
        ({"prompt_lookup_min": 2, "prompt_lookup_max": 4}, (2, 4)),
    ],
)
def test_one_lookup_bound_mirrors_the_other(given: dict, expected: tuple[int, int]) -> None:
    spec = SpeculativeConfig.from_user({"method": "ngram", "num_speculative_tokens": 3, **given})
    assert (spec.prompt_lookup_min, spec.prompt_lookup_max) == expected


def test_every_key_from_json() -> None:
    text = json.dumps(
        {
            "method": "draft_model",
            "model": "/some/draft",
            "num_speculative_tokens": 3,
            "draft_sample_method": "probabilistic",
            "rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": [0.9, 0.8, 0.5],
            "num_speculative_tokens_per_batch_size": [[1, 8, 3], [9, 32, 1], [33, 4096, 0]],
            "prompt_lookup_min": 1,
            "prompt_lookup_max": 3,
        }
    )
    spec = SpeculativeConfig.from_user(text)
    assert spec.model == "/some/draft" and spec.draft_sample_method == "probabilistic"
    assert spec.synthetic_acceptance_rates == (0.9, 0.8, 0.5)
    assert spec.expected_acceptance_length() == pytest.approx(1 + 0.9 + 0.72 + 0.36)
    assert [spec.num_spec_tokens_for_batch(b) for b in (1, 8, 9, 32, 33, 5000)] == [
        3,
        3,
        1,
        1,
        0,
        3,
    ]


def test_one_synthetic_rate_broadcasts() -> None:
    spec = SpeculativeConfig.from_user(
        {
            "method": "ngram",
            "num_speculative_tokens": 3,
            "rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": 0.5,
        }
    )
    assert spec.synthetic_acceptance_rates == (0.5, 0.5, 0.5)


BASE = {"method": "ngram", "num_speculative_tokens": 2}


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"typo_key": 1}, "typo_key"),
        ({"method": "eagle"}, "method"),
        ({"method": None}, "method"),
        ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"num_speculative_tokens": 1.5}, "num_speculative_tokens"),
        ({"num_speculative_tokens": True}, "num_speculative_tokens"),
        ({"num_speculative_tokens": 129}, "num_speculative_tokens"),
        ({"prompt_lookup_min": 4, "prompt_lookup_max": 2}, "prompt_lookup_min"),
        ({"prompt_lookup_min": 0}, "prompt_lookup_min"),
        ({"draft_sample_method": "beam"}, "draft_sample_method"),
        ({"rejection_sample_method": "block"}, "rejection_sample_method"),
        ({"rejection_sample_method": "synthetic"}, "synthetic_acceptance_rates"),
        ({"synthetic_acceptance_rates": [0.5, 0.5]}, "synthetic_acceptance_rates"),
        (
            {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.5, 1.5]},
            "synthetic_acceptance_rates",
        ),
        (
            {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.5, 0.5, 0.5]},
            "synthetic_acceptance_rates",
        ),
        (
            {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": "high"},
            "synthetic_acceptance_rates",
        ),
        ({"model": "/a/draft"}, "model"),
        ({"method": "draft_model"}, "model"),
        (
            {"num_speculative_tokens_per_batch_size": [[1, 8]]},
            "num_speculative_tokens_per_batch_size",
        ),
        (
            {"num_speculative_tokens_per_batch_size": [[8, 1, 1]]},
            "num_speculative_tokens_per_batch_size",
        ),
        (
            {"num_speculative_tokens_per_batch_size": [[1, 8, 3]]},
            "num_speculative_tokens_per_batch_size",
        ),
        (
            {"num_speculative_tokens_per_batch_size": [[1, 8, 1], [8, 9, 0]]},
            "num_speculative_tokens_per_batch_size",
        ),
    ],
)
def test_bad_values_name_the_key(change: dict, key: str) -> None:
    with pytest.raises(ValueError, match=rf"speculative_config\b.*{key}") as info:
        SpeculativeConfig.from_user({**BASE, **change})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("value", "fragment"), [("{not json", "not valid JSON"), ("[1, 2]", "JSON object")]
)
def test_bad_json_is_one_line(value: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        SpeculativeConfig.from_user(value)


def test_missing_required_keys() -> None:
    with pytest.raises(ValueError, match="speculative_config.method"):
        SpeculativeConfig.from_user({"num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="speculative_config.num_speculative_tokens"):
        SpeculativeConfig.from_user({"method": "ngram"})


def test_engine_args_parse_the_cli_flag(tiny_llama_with_tokenizer_dir) -> None:
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    namespace = parser.parse_args(
        ["--model", str(tiny_llama_with_tokenizer_dir), "--speculative-config", json.dumps(BASE)]
    )
    config = EngineArgs.from_cli_args(namespace).create_engine_config()
    assert config.speculative == SpeculativeConfig.from_user(BASE)
    assert (
        EngineArgs(model=str(tiny_llama_with_tokenizer_dir)).create_engine_config().speculative
        is None
    )


def test_a_draft_with_another_vocabulary_is_refused(
    tiny_llama_with_tokenizer_dir, tmp_path
) -> None:
    from tiny_hf_models import save_tiny_model

    draft = tmp_path / "draft"
    save_tiny_model(draft, "llama", vocab_size=77)
    target = str(tiny_llama_with_tokenizer_dir)
    spec = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 2}
    with pytest.raises(ValueError, match="speculative_config.model: the draft's vocabulary"):
        EngineArgs(model=target, speculative_config=spec).create_engine_config()
    same = {**spec, "model": target}
    assert EngineArgs(model=target, speculative_config=same).create_engine_config().speculative


def test_tensor_parallelism_takes_it_but_not_batch_sharded_sampling(
    tiny_llama_with_tokenizer_dir,
) -> None:
    """At tp > 1 every rank verifies every row (tests/distributed/test_tp_spec_decode.py)."""
    model = str(tiny_llama_with_tokenizer_dir)
    args = EngineArgs(model=model, speculative_config=BASE, tensor_parallel_size=2)
    assert args.create_engine_config().speculative is not None
    sharded = EngineArgs(
        model=model,
        speculative_config=BASE,
        tensor_parallel_size=2,
        enable_batch_sharded_sampling=True,
    )
    with pytest.raises(ValueError, match="enable_batch_sharded_sampling does not combine"):
        sharded.create_engine_config()
