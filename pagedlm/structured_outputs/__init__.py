"""Structured outputs: xgrammar constraints on a request's tokens (the engine core side)."""
