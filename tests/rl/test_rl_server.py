"""A training script's path to a server: WeightSender over POST /collective_rpc into the server's
core process (--enable-dev-endpoints), gloo or a shared bucket between this process and the core's
worker."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from tiny_hf_models import save_tiny_model

from pagedlm.config import default_model_path
from pagedlm.rl import WeightSender, http_rpc

PROMPT = [5, 17, 99, 230]
START_TIMEOUT_S = 120


def _save(folder: Path, seed: int) -> torch.nn.Module:
    """A tiny Llama with the default model's vocabulary, so the server takes its tokenizer."""
    return save_tiny_model(
        folder, "llama", seed, vocab_size=49152, config_overrides={"tie_word_embeddings": True}
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("rl_server")
    model_a, model_b = _save(root / "a", 0), _save(root / "b", 1)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # fmt: off
    command = [
        sys.executable, "-m", "pagedlm.cli", "serve", str(root / "a"), "--port", str(port),
        "--tokenizer", default_model_path(), "--dtype", "float32", "--kv-cache-memory-gib", "0.05",
        "--enable-dev-endpoints",
    ]
    # fmt: on
    log = (root / "server.log").open("w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(process, url, root / "server.log")
        yield url, model_a, model_b
    finally:
        process.terminate()
        process.wait(60)


def _wait_healthy(process: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    pytest.fail(f"the server did not start:\n{log.read_text()[-3000:]}")


def _complete(url: str) -> str:
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    response = httpx.post(url + "/v1/completions", json=body, timeout=60)
    response.raise_for_status()
    return response.json()["choices"][0]["text"]


@pytest.mark.slow
def test_weight_sender_over_http(server) -> None:
    """Both transports: the ipc bucket's handle crosses JSON and the core process's msgpack."""
    url, model_a, model_b = server
    text_a = _complete(url)
    for transport in ("distributed", "ipc"):
        sender = WeightSender(http_rpc(url), timeout_s=60, transport=transport)
        try:
            assert sender.send_weights(model_b.named_parameters(), "b", chunk_bytes=1 << 20) == "b"
            text_b = _complete(url)
            sender.send_weights(model_a.named_parameters(), "a")
            assert _complete(url) == text_a != text_b, transport
        finally:
            sender.close()
    bad = {"method": "reload_weights", "kwargs": {"weights_path": "/nowhere"}}
    response = httpx.post(url + "/collective_rpc", json=bad, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == "args"
