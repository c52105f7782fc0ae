"""Reinforcement-learning helpers for the trainer's side: push weights to an engine
(WeightSender, over torch.distributed) through an LLM in the same script or a server."""

from __future__ import annotations

from pagedlm.rl.clients import http_rpc, llm_rpc
from pagedlm.rl.sender import WeightSender

__all__ = ["WeightSender", "http_rpc", "llm_rpc"]
