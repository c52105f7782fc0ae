"""The Llama-family model, its layers and its weight loader."""

from __future__ import annotations

from pagedlm.model.llama import LlamaForCausalLM
from pagedlm.model.loader import load_model

__all__ = ["LlamaForCausalLM", "load_model"]
