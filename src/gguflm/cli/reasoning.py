"""llama.cpp's reasoning options for ``gguflm serve`` and ``gguflm chat``: what a chat
request leaves out (``LLM.chat_defaults``; a request's own fields win).

``--reasoning-format`` (none: reasoning stays in the content; auto/deepseek: it goes to
``reasoning_content``), ``--reasoning-budget N`` (-1 no limit, 0 no thinking, N tokens then
the block is closed) and ``--reasoning-budget-message``, ``-rea/--reasoning on|off|auto``
(the template's ``enable_thinking``), ``--reasoning-effort LEVEL``,
``--reasoning-preserve``/``--no-reasoning-preserve`` and ``--chat-template-kwargs JSON``
(more template variables).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..chatplan import REASONING_FORMATS, ChatDefaults
from .common import CLIError

__all__ = ["add_reasoning_options", "chat_defaults"]


def add_reasoning_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("reasoning models (docs/reasoning.md)")
    g.add_argument("--reasoning-format", choices=REASONING_FORMATS, default="auto",
                   help="where a reply's reasoning goes: none leaves it in the content; "
                        "auto and deepseek put it in reasoning_content (default: auto)")
    g.add_argument("--reasoning-budget", type=int, default=-1, metavar="N",
                   help="tokens of thinking before the block is closed: -1 no limit "
                        "(default), 0 none")
    g.add_argument("--reasoning-budget-message", default="", metavar="TEXT",
                   help="text written before the closing tag when the budget runs out")
    g.add_argument("-rea", "--reasoning", choices=("on", "off", "auto"), default="auto",
                   help="turn the template's thinking on or off (enable_thinking); auto: "
                        "as the template does by default")
    g.add_argument("--reasoning-effort", metavar="LEVEL",
                   help="the template's reasoning effort (gpt-oss: low, medium, high)")
    g.add_argument("--reasoning-preserve", dest="reasoning_preserve", action="store_true",
                   default=None, help="keep earlier turns' reasoning in the prompt, for "
                                      "templates that can")
    g.add_argument("--no-reasoning-preserve", dest="reasoning_preserve",
                   action="store_false", help="drop earlier turns' reasoning")
    g.add_argument("--chat-template-kwargs", metavar="JSON",
                   help="more variables for the chat template, as a JSON object "
                        "(e.g. '{\"enable_thinking\": false}')")


def chat_defaults(args: argparse.Namespace) -> ChatDefaults:
    """The options as ``LLM.chat_defaults`` (the defaults for a command without them);
    CLIError for a bad value."""
    if not hasattr(args, "reasoning_format"):
        return ChatDefaults()
    kwargs: dict[str, Any] = {}
    text = getattr(args, "chat_template_kwargs", None)
    if text:
        try:
            kwargs = json.loads(text)
        except ValueError as e:
            raise CLIError(f"--chat-template-kwargs is not JSON: {e}") from None
        if not isinstance(kwargs, dict):
            raise CLIError("--chat-template-kwargs must be a JSON object")
    if args.reasoning != "auto":
        kwargs["enable_thinking"] = args.reasoning == "on"
    if args.reasoning_effort:
        kwargs["reasoning_effort"] = args.reasoning_effort
    if args.reasoning_preserve is not None:
        kwargs["preserve_reasoning"] = args.reasoning_preserve
    if args.reasoning_budget < -1:
        raise CLIError(f"--reasoning-budget must be -1 (no limit) or more, got "
                       f"{args.reasoning_budget}")
    return ChatDefaults(kwargs, args.reasoning_format, args.reasoning_budget,
                        args.reasoning_budget_message)
