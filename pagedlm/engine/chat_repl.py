"""An interactive chat: one line in, the reply streamed out as the engine produces it."""
from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, TextIO

from pagedlm.engine.tokenizer import Conversation, apply_chat_template
from pagedlm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from pagedlm.llm import LLM

EXIT_COMMAND = "/exit"


def run_chat_repl(llm: LLM, params: SamplingParams, stdin: TextIO, stdout: TextIO,
                  system: str | None = None) -> None:
    """Reads user lines until EOF or /exit; the conversation grows with every turn."""
    conversation: Conversation = [{"role": "system", "content": system}] if system else []
    interactive = stdin.isatty()
    for turn in itertools.count():
        if interactive:
            stdout.write("> ")
            stdout.flush()
        line = stdin.readline()
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


def stream_reply(llm: LLM, conversation: Conversation, params: SamplingParams, request_id: str,
                 stdout: TextIO) -> str:
    """Steps the engine and writes each new piece of the reply as it arrives."""
    engine = llm.llm_engine
    text, token_ids = apply_chat_template(llm.get_tokenizer(), conversation)
    engine.add_request(request_id, {"prompt": text, "prompt_token_ids": token_ids}, params)
    shown = ""
    finished = False
    try:
        while not finished and engine.has_unfinished_requests():
            for output in engine.step():
                if output.request_id != request_id:
                    continue
                current = output.outputs[0].text
                stdout.write(current[len(shown):])
                stdout.flush()
                shown, finished = current, output.finished
    except BaseException:  # e.g. Ctrl-C: the request must not linger in the engine
        engine.abort_request(request_id)
        raise
    stdout.write("\n")
    return shown
