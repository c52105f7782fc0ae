"""pagedlm: a high-throughput LLM inference engine."""
