"""The four-phase transfer between two processes over gloo: a trainer process perturbs the weights
(the engine's outputs change), then sends the originals back (they are restored exactly)."""

from __future__ import annotations

import multiprocessing

import rl_trainer
from rl_helpers import greedy

TIMEOUT_S = 120


def test_trainer_process_perturbs_then_restores(llm, model_a) -> None:
    context = multiprocessing.get_context("spawn")
    conn, child_conn = context.Pipe()
    trainer = context.Process(target=rl_trainer.run, args=(child_conn, str(model_a.folder)))
    trainer.start()
    outputs = {}
    try:
        while True:
            assert conn.poll(TIMEOUT_S), "the trainer went quiet"
            message = conn.recv()
            if message[0] == "done":
                break
            assert message[0] != "failed", message[1]
            if message[0] == "generate":
                outputs[message[1]] = greedy(llm)
                conn.send(("ok", None))
                continue
            _, method, kwargs = message
            try:
                conn.send(("ok", llm.collective_rpc(method, kwargs=kwargs)))
            except Exception as exc:  # the trainer raises it
                conn.send(("error", repr(exc)))
    finally:
        trainer.join(TIMEOUT_S)
        if trainer.is_alive():
            trainer.kill()
    assert trainer.exitcode == 0
    assert outputs["perturbed"] != model_a.greedy
    assert outputs["restored"] == model_a.greedy
    assert llm.collective_rpc("get_weight_version") == ["restored"]
