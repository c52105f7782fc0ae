"""Tied embeddings (the default model's layout): the embeddings are the LM head, so a reload or
an update of model.embed_tokens.weight changes both; an lm_head.weight sent is ignored."""

from __future__ import annotations

import pytest
from rl_helpers import greedy, save_tied

from pagedlm import LLM


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    a = save_tied(tmp_path_factory.mktemp("tied_a"), seed=2)
    b = save_tied(tmp_path_factory.mktemp("tied_b"), seed=3)
    assert a.greedy != b.greedy
    llm = LLM(
        str(a.folder),
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=64,
        num_gpu_blocks_override=64,
        device="cpu",
    )
    return llm, a, b


def test_tied_reload_and_update(tied) -> None:
    llm, a, b = tied
    assert greedy(llm) == a.greedy
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(b.folder)})
    assert greedy(llm) == b.greedy
    # a trainer's state_dict of a tied model names lm_head too: ignored, embeddings are the head
    state = a.hf_model.state_dict()
    assert "lm_head.weight" in state
    embeddings = state.pop("model.embed_tokens.weight")
    llm.update_weights_from_tensor(state.items())
    assert greedy(llm) != a.greedy  # B's embeddings, hence B's LM head, remain
    llm.update_weights_from_tensor([("model.embed_tokens.weight", embeddings)])
    assert greedy(llm) == a.greedy
