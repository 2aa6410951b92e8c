"""``gguflm chat [MODEL]``: an interactive, streaming, multi-turn chat in the terminal.

Each turn renders the whole conversation with the model's chat template; the engine reuses
the KV cache of everything before the new user message, so only the new tokens are
evaluated. Commands (ollama's where it has them): /help, /set, /show, /reset (/clear),
/bye (/exit, /quit); ``\"\"\"`` starts and ends a message of several lines. When the
conversation no longer fits the context with room for a reply, its oldest turns are
dropped (the system message stays) and the chat says so.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from . import CLIError, UsageError
from .common import (
    add_color_option,
    add_constraint_options,
    add_load_options,
    add_lookup_option,
    add_model_argument,
    add_status_options,
    color_on,
    constraint_spec,
)
from .serve import add_model_options, load_llm

DEFAULT_N_PREDICT = 512  # tokens per reply: a small model left unbounded can loop forever
HELP = "/help lists the commands; /bye leaves; Ctrl-C stops a reply"
COMMANDS = """\
  /help, /?              this list
  /set NAME VALUE        change a setting: temperature, top_p, top_k, min_p, typical_p,
                         repeat_penalty, repeat_last_n, presence_penalty,
                         frequency_penalty, seed (-1: random), samplers, mirostat,
                         mirostat_tau, mirostat_eta, max_tokens (-1: the context)
  /set system TEXT       replace the system message (starts the conversation over)
  /set verbose | quiet   show token counts and speeds after each reply, or not
  /show                  the current settings
  /reset, /clear         forget the conversation (the system message stays)
  /bye, /exit, /quit     leave (as does Ctrl-D)
  \"\"\"                    start a message of several lines; end it with \"\"\" too
  Ctrl-C                 stop the reply being written; the chat goes on"""
GREEN, RESET = "\033[1;32m", "\033[0m"
# /set names that mean the same as a sampling parameter (ollama's and llama.cpp's words)
ALIASES = {"temp": "temperature", "num_predict": "max_tokens", "n_predict": "max_tokens",
           "n": "max_tokens", "repeat_last": "repeat_last_n"}


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..engine.params import add_cli_options
    from ..hub import DEFAULT_MODEL

    p = subparsers.add_parser(
        "chat", help="chat with a model in the terminal",
        description=f"Chat with MODEL (a GGUF file or a known model name, default "
                    f"{DEFAULT_MODEL}) through its chat template. Replies stream as they are "
                    f"generated; earlier turns are not evaluated again. {HELP}.")
    add_model_argument(p, optional=True)
    p.add_argument("--system", "-sys", "--system-prompt", metavar="TEXT",
                   help="a system message to start with")
    p.add_argument("-p", "--prompt", metavar="TEXT",
                   help="the first message, answered before you type (llama-cli's -p)")
    p.add_argument("-st", "--single-turn", action="store_true",
                   help="answer the first message (-p, or the first line typed), then leave")
    p.add_argument("-n", "--n-predict", type=int, default=DEFAULT_N_PREDICT, metavar="N",
                   help=f"tokens per reply at most; -1: until the model ends its turn or the "
                        f"context is full (default: {DEFAULT_N_PREDICT})")
    add_model_options(p)
    add_cli_options(p)
    add_constraint_options(p)
    add_lookup_option(p)
    p.add_argument("-v", "--verbose", action="store_true",
                   help="after each reply, show token counts (new and cached prompt tokens) "
                        "and speeds")
    add_color_option(p, "show what you type in colour")
    add_status_options(p, perf=False)
    add_load_options(p)
    p.set_defaults(func=chat, owns_cores=True)  # one user's command: spinning workers


def default_args() -> argparse.Namespace:
    """The options of ``gguflm chat`` with nothing given (for ``run -i``)."""
    from .common import finish_model_argument

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    ns = parser.parse_args(["chat"])
    finish_model_argument(ns)
    return ns


class Chat:
    """The conversation and its settings."""

    def __init__(self, llm: Any, args: argparse.Namespace,
                 constraint: dict[str, Any] | None = None) -> None:
        from ..engine.params import cli_stops, cli_values

        self.llm = llm
        self.system = args.system
        self.sampling: dict[str, Any] = cli_values(args)
        self.stop = cli_stops(args)
        # every reply kept valid (``constraint_spec``, read before the model loads)
        self.constraint = constraint_spec(args) if constraint is None else constraint
        self.max_tokens = args.n_predict
        self.verbose = args.verbose
        self.color = color_on(args, sys.stdout) if isinstance(args.color, str) \
            else bool(args.color) and sys.stdout.isatty()
        self.messages = self.start()

    def start(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}] if self.system else []

    def request(self, max_tokens: int | None) -> Any:
        """The engine request for the conversation (InvalidRequestError if it cannot be)."""
        from ..engine.spec import GenerationSpec

        spec = GenerationSpec.from_kwargs("chat", self.sampling | self.constraint | {
            "max_tokens": max_tokens, "stop": self.stop or None})
        req, _ = self.llm.chat_request(self.messages, spec)
        return req


def chat(args: argparse.Namespace) -> int:
    from ..api import InvalidRequestError

    if args.n_predict == -2:  # llama.cpp's "until the context is filled"
        args.n_predict = -1
    if args.n_predict < -1:
        raise UsageError(f"-n must be -1 (unlimited) or at least 0, got {args.n_predict}")
    constraint = constraint_spec(args)  # its files and syntax: refused before the model loads
    llm = load_llm(args, parallel=1, generate=True)
    state = Chat(llm, args, constraint)
    try:  # bad sampling values or a template failing fail here, once
        state.messages.append({"role": "user", "content": "hi"})
        state.request(0)
    except InvalidRequestError as e:
        if e.param in ("messages", "prompt", "model"):  # the template or the model (an
            # encoder): not an option's fault
            raise CLIError(str(e)) from None
        raise UsageError(str(e)) from None
    finally:
        state.messages = state.start()
    try:
        import readline  # noqa: F401 - line editing and history for input()
    except ImportError:
        pass
    banner = say if not getattr(args, "log_disable", False) else (lambda text: None)
    banner(f"gguflm chat: {llm.model_id} (n_ctx {llm.n_ctx}, chat template: "
        f"{llm.chat_template.name}, replies of up to {_limit(state.max_tokens)}). {HELP}.")
    if llm.chat_template.name.startswith("built-in") and not args.chat_template:
        say(f"note: {llm.model_path.name} has no chat template (it may be a pretrained base "
            f"model, not tuned for chat); using gguflm's {llm.chat_template.name} template")
    first = getattr(args, "prompt", None)  # llama-cli's -p: the first message
    while True:
        if first is not None:
            message, first = (first, True), None
        elif getattr(args, "single_turn", False) and len(state.messages) > (1 if state.system
                                                                             else 0):
            return 0  # -st: one reply, then leave
        else:
            message = read_message(state.color)
        if message is None:
            return 0
        text, quoted = message
        if not text.strip():
            continue
        if text.lstrip().startswith("/") and not quoted:
            if command(state, text.strip()) == "quit":
                return 0
            continue
        state.messages.append({"role": "user", "content": text})
        reply = _reply(state)
        if reply is None:
            state.messages.pop()
        else:
            state.messages.append({"role": "assistant", "content": reply})


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _limit(n: int) -> str:
    return "the context" if n < 0 else f"{n} tokens"


def read_message(color: bool, read: Callable[[str], str] = input
                 ) -> tuple[str, bool] | None:
    """One message and whether it was quoted: a line, or the lines between two lines of
    three double quotes (ollama's habit; a quoted message is never a command); None at the
    end of input. Ctrl-C at the prompt starts a fresh line, as a shell does."""
    prompt = f"\001{GREEN}\002> " if color else "> "
    try:
        try:
            line = read(prompt)
        finally:
            if color:
                sys.stdout.write(RESET)
        if not line.lstrip().startswith('"""'):
            return line, False
        first = line.lstrip()[3:]
        if first.rstrip().endswith('"""'):  # quoted on one line
            return first.rstrip()[:-3], True
        lines = [first] if first else []
        while True:
            line = read(". ")
            if line.rstrip().endswith('"""'):
                last = line.rstrip()[:-3]
                if last:
                    lines.append(last)
                return "\n".join(lines), True
            lines.append(line)
    except EOFError:
        print()
        return None
    except KeyboardInterrupt:
        print()
        return "", False


def command(state: Chat, text: str) -> str | None:
    """Carry out a /command; "quit" to leave. Unknown commands never reach the model."""
    word, _, rest = text.partition(" ")
    rest = rest.strip()
    if word in ("/bye", "/exit", "/quit"):
        return "quit"
    if word in ("/help", "/?"):
        say(COMMANDS)
    elif word in ("/reset", "/clear"):
        state.messages = state.start()
        say("[conversation cleared]")
    elif word == "/show":
        say(f"[sampling: {_sampling_shown(state)}; max_tokens {state.max_tokens}; stop "
            f"{state.stop or 'none'}; verbose {'on' if state.verbose else 'off'}; system: "
            f"{state.system!r}; {len(state.messages)} messages]")
    elif word == "/set":
        _set(state, rest)
    else:
        say(f"[unknown command {word}; /help lists the commands]")
    return None


def _sampling_shown(state: Chat) -> str:
    """Every sampling setting's value in effect (the defaults are llama.cpp's)."""
    from ..engine.params import PARAMS

    shown = []
    for prm in PARAMS:
        value = state.sampling.get(prm.name)
        if value is None:
            value = "random" if prm.name == "seed" else prm.default
        if isinstance(value, tuple | list):
            value = ";".join(value)
        shown.append(f"{prm.name} {value}")
    return ", ".join(shown)


def _set(state: Chat, rest: str) -> None:
    from ..engine.params import BY_NAME, sampler_params
    from ..engine.sampling import SamplingError

    if rest in ("verbose", "quiet"):
        state.verbose = rest == "verbose"
        say(f"[verbose {'on' if state.verbose else 'off'}]")
        return
    name, _, value = rest.partition(" ")
    if name == "parameter":  # ollama's /set parameter NAME VALUE
        name, _, value = value.strip().partition(" ")
    if name == "system":
        state.system = value.strip() or None
        state.messages = state.start()
        say("[system message set; conversation cleared]")
        return
    name = ALIASES.get(name.replace("-", "_"), name.replace("-", "_"))
    value = value.strip()
    if not name or not value:
        say("[usage: /set NAME VALUE, /set system TEXT, /set verbose, /set quiet]")
        return
    if name == "max_tokens":
        try:
            n = int(value)
            if n < -1:
                raise ValueError
        except ValueError:
            say(f"[max_tokens must be -1 or an integer of at least 0, got {value!r}]")
            return
        state.max_tokens = n
        say(f"[max_tokens {n}]")
        return
    if name not in BY_NAME:
        say(f"[unknown setting {name!r}; /help lists them]")
        return
    try:
        typed = BY_NAME[name].type(value)
        sampler_params({**state.sampling, name: typed})  # checks the value
    except (ValueError, SamplingError) as e:
        say(f"[{name}: {e}]")
        return
    state.sampling[name] = None if name == "seed" and typed == -1 else typed
    say(f"[{name} {typed}]")


def _fit(state: Chat) -> int:
    """Drop the oldest turns (never the system message, nor the new user message) until
    the conversation leaves room for a reply; the number of messages dropped. Raises
    InvalidRequestError when even the last message alone does not fit."""
    from ..api import InvalidRequestError

    llm = state.llm
    n_ctx = llm.n_ctx
    room = state.max_tokens if state.max_tokens > 0 else n_ctx // 4
    room = min(room, n_ctx // 2)
    first = 1 if state.messages and state.messages[0]["role"] == "system" else 0
    dropped = 0
    while True:
        try:
            n = len(llm.chat_prompt_ids(state.messages))
        except InvalidRequestError as e:
            if e.code != "context_length_exceeded" or len(state.messages) - first <= 1:
                raise
            n = n_ctx + 1
        if n + room <= n_ctx or len(state.messages) - first <= 1:
            if n >= n_ctx:
                raise InvalidRequestError(
                    f"the message is {n} tokens with the system message, too long for the "
                    f"context of {n_ctx}", code="context_length_exceeded")
            return dropped
        # a user turn and the reply to it: the template's roles keep alternating
        k = 2 if (len(state.messages) - first > 2
                  and state.messages[first + 1]["role"] == "assistant") else 1
        del state.messages[first:first + k]
        dropped += k


def _reply(state: Chat) -> str | None:
    """Stream one reply to stdout; its text (partial if cut off), or None if the
    conversation cannot be answered (the reason is shown)."""
    from ..api import InvalidRequestError

    llm = state.llm
    try:
        dropped = _fit(state)
        if dropped:
            say(f"[the context is full: dropped the {dropped} oldest messages"
                f"{' (the system message stays)' if state.system else ''}]")
        max_tokens = None if state.max_tokens < 0 else state.max_tokens
        seq = llm.engine.submit(state.request(max_tokens))
    except (InvalidRequestError, ValueError) as e:
        say(f"[{e}; /reset to start over]" if getattr(e, "code", None)
            == "context_length_exceeded" else f"[{e}]")
        return None
    parts: list[str] = []
    try:
        for piece in seq:
            if piece.text:
                parts.append(piece.text)
                sys.stdout.write(piece.text)
                sys.stdout.flush()
        stop = seq.stopped_by
    except KeyboardInterrupt:  # stop this reply, keep the conversation
        seq.cancel()
        seq.wait()
        stop = "interrupted"
    sys.stdout.write("\n")
    sys.stdout.flush()
    if stop == "max_tokens":
        say(f"[reply cut off at the limit of {state.max_tokens} tokens; /set max_tokens N "
            "changes it]")
    elif stop == "context":
        say("[reply cut off: the context is full; the oldest turns will be dropped]")
    elif stop == "error":
        say(f"[generation failed: {seq.error}]")
    if state.verbose:
        u, t = seq.usage(), seq.timings_dict()
        cached = u["prompt_tokens_details"]["cached_tokens"]
        say(f"[{u['completion_tokens']} tokens, stop: {stop}; prompt {u['prompt_tokens']} "
            f"tokens: {u['prompt_tokens'] - cached} new, {cached} cached; "
            f"{t['prompt_tokens_per_second']:.1f} tok/s prompt, "
            f"{t['generation_tokens_per_second']:.1f} tok/s generation]")
    return "".join(parts)
