"""``gguflm chat [MODEL]``: an interactive, streaming, multi-turn chat in the terminal.

Each turn renders the whole conversation with the model's chat template; the LLM reuses the
KV cache of everything before the new user message, so only the new tokens are evaluated.
"""

from __future__ import annotations

import argparse
import sys

from . import CLIError
from .common import add_model_argument
from .serve import add_model_options, load_llm

HELP = ("/reset clears the conversation, /exit (or Ctrl-D) leaves; Ctrl-C stops a reply")


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..engine.params import add_cli_options
    from ..hub import DEFAULT_MODEL

    p = subparsers.add_parser(
        "chat", help="chat with a model in the terminal",
        description=f"Chat with MODEL (a GGUF file or a known model name, default "
                    f"{DEFAULT_MODEL}) through its chat template. Replies stream as they are "
                    f"generated; earlier turns are not evaluated again. {HELP}.")
    add_model_argument(p, optional=True)
    p.add_argument("--system", metavar="TEXT", help="a system message to start with")
    p.add_argument("-n", "--n-predict", type=int, default=-1, metavar="N",
                   help="tokens per reply at most; -1: until the model ends its turn (default)")
    add_model_options(p)
    add_cli_options(p)
    p.add_argument("-v", "--verbose", action="store_true",
                   help="after each reply, show token counts (new and cached prompt tokens)")
    p.set_defaults(func=chat)


def chat(args: argparse.Namespace) -> int:
    from ..api import InvalidRequestError

    if args.n_predict < -1:
        raise CLIError(f"-n must be -1 (unlimited) or at least 0, got {args.n_predict}")
    from ..engine.params import cli_values

    llm = load_llm(args, parallel=1)
    opts = cli_values(args)
    try:  # a first dry run: bad sampling values or a template failing fail here, once
        llm.chat(_start(args) + [{"role": "user", "content": "hi"}], stream=True,
                 max_tokens=0, **opts).close()
    except InvalidRequestError as e:
        raise CLIError(str(e)) from None
    try:
        import readline  # noqa: F401 - line editing and history for input()
    except ImportError:
        pass
    print(f"gguflm chat: {llm.model_id} (n_ctx {llm.n_ctx}, chat template: "
          f"{llm.chat_template.name}). {HELP}.", file=sys.stderr, flush=True)
    messages = _start(args)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:  # at the prompt: a fresh line, as a shell does
            print()
            continue
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            return 0
        if text == "/reset":
            messages = _start(args)
            print("[conversation cleared]", file=sys.stderr, flush=True)
            continue
        if text.startswith("/") and " " not in text:
            print(f"[unknown command {text}; {HELP}]", file=sys.stderr, flush=True)
            continue
        messages.append({"role": "user", "content": line})
        reply = _reply(llm, messages, args, opts)
        if reply is None:
            messages.pop()
        else:
            messages.append({"role": "assistant", "content": reply})


def _start(args: argparse.Namespace) -> list[dict]:
    return [{"role": "system", "content": args.system}] if args.system else []


def _reply(llm, messages: list[dict], args: argparse.Namespace,  # noqa: ANN001 - LLM
           opts: dict) -> str | None:
    """Stream one reply to stdout; its text (partial if interrupted), or None if the
    conversation cannot be answered (the reason is shown)."""
    from ..api import InvalidRequestError

    try:
        chunks = llm.chat(messages, stream=True, include_usage=True,
                          max_tokens=args.n_predict, **opts)
    except InvalidRequestError as e:
        hint = "; /reset to start over" if e.code == "context_length_exceeded" else ""
        print(f"[{e}{hint}]", file=sys.stderr, flush=True)
        return None
    parts: list[str] = []
    usage = finish = None
    try:
        for chunk in chunks:
            if not chunk["choices"]:
                usage = chunk["usage"]
                continue
            choice = chunk["choices"][0]
            piece = choice["delta"].get("content")
            if piece:
                parts.append(piece)
                sys.stdout.write(piece)
                sys.stdout.flush()
            finish = choice["finish_reason"] or finish
    except KeyboardInterrupt:  # stop this reply, keep the conversation
        chunks.close()
        finish = "interrupted"
    sys.stdout.write("\n")
    sys.stdout.flush()
    if args.verbose and usage:
        new = usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"]
        print(f"[{usage['completion_tokens']} tokens, stop: {finish}; prompt "
              f"{usage['prompt_tokens']} tokens: {new} new, "
              f"{usage['prompt_tokens_details']['cached_tokens']} cached]",
              file=sys.stderr, flush=True)
    elif args.verbose:
        print(f"[stop: {finish}]", file=sys.stderr, flush=True)
    return "".join(parts)
