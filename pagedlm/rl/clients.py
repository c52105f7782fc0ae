"""How a trainer reaches the engine's collective_rpc: an LLM in the same script, or a server's
POST /collective_rpc (started with --enable-dev-endpoints). Each returns an EngineRPC for
WeightSender: (worker method, kwargs) -> one result per engine worker."""

from __future__ import annotations

from typing import Any

from pagedlm.rl.sender import EngineRPC


def llm_rpc(llm: Any) -> EngineRPC:
    """Through LLM.collective_rpc, in this process."""
    return lambda method, kwargs: llm.collective_rpc(method, kwargs=kwargs)


def http_rpc(base_url: str, api_key: str | None = None, timeout_s: float = 600.0) -> EngineRPC:
    """Through a server's POST /collective_rpc ({"method", "args", "kwargs"} -> {"results"})."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = base_url.rstrip("/") + "/collective_rpc"

    def call(method: str, kwargs: dict[str, Any]) -> list[Any]:
        body = {"method": method, "args": [], "kwargs": kwargs}
        response = httpx.post(url, json=body, headers=headers, timeout=timeout_s)
        if response.status_code != 200:
            raise RuntimeError(f"{method}: HTTP {response.status_code}: {response.text}")
        return response.json()["results"]

    return call
