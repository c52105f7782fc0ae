"""The worker: persistent request rows, the ragged batch, the model runner, KV-cache sizing."""
