"""The draft model's ModelConfig for `method: draft_model`, and the check that it shares the
target's vocabulary: the same vocabulary size and the same ids for the special tokens (the
configs' BOS/EOS/pad ids, and where both have a tokenizer, its special tokens' ids). Every error
is one line naming `speculative_config.model`.

The draft follows the target's dtype, max_model_len and device, and loads dummy weights when the
target does (benchmarks); it uses the target's block tables, so it needs no cache settings of its
own. Imports no torch at module level (pagedlm/config.py reads it)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pagedlm.config import ModelConfig, build_model_config

if TYPE_CHECKING:
    import torch

    from pagedlm.config import EngineConfig

KEY = "speculative_config.model"
_CONFIG_SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def draft_model_config(path: str, target: ModelConfig, device: torch.device) -> ModelConfig:
    """The draft at `path` (a folder or a GGUF file pagedlm loads), checked against `target`."""
    load_format = "dummy" if target.load_format == "dummy" else "auto"
    try:
        draft = build_model_config(
            path, load_format, target.dtype, device, target.max_model_len, True
        )
    except ValueError as exc:
        raise ValueError(f"{KEY}: {exc}") from exc
    check_same_vocabulary(draft, target)
    if target.sliding_window is not None and draft.sliding_window != target.sliding_window:
        raise ValueError(
            f"{KEY}: the draft's sliding window ({draft.sliding_window}) differs from the "
            f"target's ({target.sliding_window}), whose freed blocks it would read"
        )
    return draft


def draft_scratch_blocks(config: EngineConfig) -> int:
    """The draft cache's scratch blocks past the pool's (draft_inputs.Scratch): cdiv(k,
    block_size) for each request of the largest batch that drafts."""
    spec, block_size = config.speculative, config.cache.block_size
    max_seqs = config.scheduler.max_num_seqs
    drafting = [n for n in range(1, max_seqs + 1) if spec.num_spec_tokens_for_batch(n) > 0]
    return max(drafting, default=0) * -(-spec.num_speculative_tokens // block_size)


def check_same_vocabulary(draft: ModelConfig, target: ModelConfig) -> None:
    """ValueError naming speculative_config.model unless the draft's token ids mean the target's."""
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"{KEY}: the draft's vocabulary ({draft.vocab_size} ids) differs from the target's "
            f"({target.vocab_size}); a draft must share the target's vocabulary"
        )
    if Path(draft.model).resolve() == Path(target.model).resolve():
        return  # the same checkpoint (the draft is the target itself)
    differing = _differing(_config_special_ids(draft), _config_special_ids(target))
    if differing is None and target.tokenizer is not None:
        draft_tokens = _tokenizer_special_ids(draft.model)
        target_tokens = _tokenizer_special_ids(target.tokenizer)
        differing = _differing(draft_tokens, target_tokens) or _differing(
            _inverse(draft_tokens), _inverse(target_tokens)
        )
    if differing is not None:
        name, draft_value, target_value = differing
        raise ValueError(
            f"{KEY}: special token {name}: the draft's is {draft_value!r}, the target's "
            f"{target_value!r}; a draft must share the target's vocabulary"
        )


def _config_special_ids(config: ModelConfig) -> dict[str, Any]:
    ids: dict[str, Any] = {
        name: getattr(config.hf_config, name, None) for name in _CONFIG_SPECIAL_IDS
    }
    ids["eos_token_ids"] = config.eos_token_ids
    return {name: value for name, value in ids.items() if value is not None}


def _tokenizer_special_ids(source: str) -> dict[str, int]:
    """Special token -> id of the tokenizer at `source`; empty when it has none (a folder of
    weights only: the configs' ids are then all there is to compare)."""
    from pagedlm.engine.tokenizer import auto_tokenizer

    try:
        tokenizer = auto_tokenizer(source)
    except Exception:  # no tokenizer files
        return {}
    return dict(zip(tokenizer.all_special_tokens, tokenizer.all_special_ids, strict=True))


def _inverse(ids: dict[str, int]) -> dict[str, str]:
    """id -> token, keyed "id N": the same id naming another token is a conflict too."""
    return {f"id {token_id}": token for token, token_id in ids.items()}


def _differing(draft: dict[str, Any], target: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """The first name both define with different ids (a name only one defines is no conflict)."""
    for name in sorted(draft.keys() & target.keys()):
        if draft[name] != target[name]:
            return name, draft[name], target[name]
    return None
