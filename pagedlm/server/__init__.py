"""The OpenAI-compatible server. Nothing here is imported by `import pagedlm` or the offline LLM:
fastapi, uvicorn, pydantic, zmq, msgspec and prometheus_client load only when serving."""
