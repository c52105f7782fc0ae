"""The trainer process of the two-process transfer test. It reaches the engine (the test's
process) through a pipe the test serves: ("rpc", method, kwargs) runs LLM.collective_rpc there,
("generate", label) has it record its greedy outputs, ("record", label, value) a value of the
trainer's own (the bytes it sent each engine worker), ("done",) ends."""

from __future__ import annotations

import traceback
from multiprocessing.connection import Connection
from pathlib import Path

import torch
from safetensors.torch import load_file

from pagedlm.rl import WeightSender


def run(conn: Connection, weights_folder: str, device: str, transport: str) -> None:
    try:
        if device.startswith("cuda"):
            torch.cuda.set_device(device)  # NCCL: this rank's GPU
        _train(conn, weights_folder, device, transport)
        conn.send(("done",))
    except BaseException:
        conn.send(("failed", traceback.format_exc()))
        raise


def _train(conn: Connection, weights_folder: str, device: str, transport: str) -> None:
    def engine(method: str, kwargs: dict) -> list:
        conn.send(("rpc", method, kwargs))
        status, value = conn.recv()
        if status != "ok":
            raise RuntimeError(f"engine: {value}")
        return value

    originals = load_file(Path(weights_folder) / "model.safetensors")  # the trainer's model
    generator = torch.Generator().manual_seed(7)
    perturbed = {
        name: tensor + 0.5 * torch.randn(tensor.shape, generator=generator)
        for name, tensor in originals.items()
    }
    sender = WeightSender(engine, device=device, timeout_s=60, transport=transport)
    assert sender.send_weights(perturbed.items(), "perturbed", chunk_bytes=32 << 10) == "perturbed"
    _generate(conn, "perturbed")
    assert sender.send_weights(originals.items(), "restored") == "restored"
    _generate(conn, "restored")
    conn.send(("record", "bytes_sent", sender.bytes_sent))
    sender.close()


def _generate(conn: Connection, label: str) -> None:
    conn.send(("generate", label))
    assert conn.recv() == ("ok", None)
