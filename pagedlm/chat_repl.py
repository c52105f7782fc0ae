"""An interactive chat: one line in, the reply streamed out as the engine produces it.

Ctrl-C during a reply stops that reply (what was shown of it stays in the conversation); at the
prompt, a Ctrl-C right after another one, Ctrl-D (end of input) or /exit leaves."""

from __future__ import annotations

import contextlib
import itertools
import signal
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, TextIO

from pagedlm.engine.tokenizer import Conversation, apply_chat_template
from pagedlm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from pagedlm.llm import LLM

EXIT_COMMAND = "/exit"
STOPPED = " [stopped]"
LEAVE_HINT = f"(Ctrl-C again, Ctrl-D or {EXIT_COMMAND} to leave)"


def run_chat_repl(
    llm: LLM, params: SamplingParams, stdin: TextIO, stdout: TextIO, system: str | None = None
) -> None:
    """Reads user lines until the user leaves; the conversation grows with every turn."""
    conversation: Conversation = [{"role": "system", "content": system}] if system else []
    interactive = stdin.isatty()
    interrupted = False  # the last prompt ended in Ctrl-C
    for turn in itertools.count():
        if interactive:
            stdout.write("> ")
            stdout.flush()
        try:
            line = stdin.readline()
        except KeyboardInterrupt:
            if interrupted:
                stdout.write("\n")
                break
            interrupted = True
            stdout.write(f"\n{LEAVE_HINT}\n")
            stdout.flush()
            continue
        interrupted = False
        if not line or line.strip() == EXIT_COMMAND:
            break
        if not line.strip():
            continue
        conversation.append({"role": "user", "content": line.rstrip("\n")})
        try:
            reply = stream_reply(llm, conversation, params, f"chat-{turn}", stdout)
        except ValueError as exc:  # e.g. the conversation outgrew max_model_len
            conversation.pop()
            stdout.write(f"error: {exc}\n")
            continue
        conversation.append({"role": "assistant", "content": reply})


def stream_reply(
    llm: LLM, conversation: Conversation, params: SamplingParams, request_id: str, stdout: TextIO
) -> str:
    """Steps the engine and writes each new piece of the reply as it arrives; the reply. Ctrl-C
    stops it between two steps (a step cut in half could leave the engine inconsistent): the
    reply is then what was shown."""
    engine = llm.llm_engine
    shown = ""
    finished = False
    with _ctrl_c_as_event() as ctrl_c:
        text, token_ids = apply_chat_template(llm.get_tokenizer(), conversation)
        engine.add_request(request_id, {"prompt": text, "prompt_token_ids": token_ids}, params)
        try:
            while not finished and not ctrl_c.is_set() and engine.has_unfinished_requests():
                for output in engine.step():
                    if output.request_id != request_id:
                        continue
                    current = output.outputs[0].text
                    stdout.write(current[len(shown) :])
                    stdout.flush()
                    shown, finished = current, output.finished
        finally:  # stopped, or an error: the request must not linger in the engine
            if not finished:
                engine.abort_request(request_id)
    stdout.write(f"{STOPPED}\n" if ctrl_c.is_set() and not finished else "\n")
    return shown


@contextlib.contextmanager
def _ctrl_c_as_event() -> Iterator[threading.Event]:
    """SIGINT sets the event instead of raising KeyboardInterrupt, inside the block. Signal
    handlers belong to the main thread: elsewhere the event is never set."""
    ctrl_c = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield ctrl_c
        return
    previous = signal.signal(signal.SIGINT, lambda *_: ctrl_c.set())
    try:
        yield ctrl_c
    finally:
        signal.signal(signal.SIGINT, previous)
