"""Speculative decoding: the configuration, the n-gram proposer, the rejection sampler and the
acceptance accounting. Imports nothing heavy: config.py is read by the planner's config."""
