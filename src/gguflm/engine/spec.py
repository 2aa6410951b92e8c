"""One request spec: what a generation request asks for, whatever door it came in by.

``FIELDS`` is the one table of a request's generation fields: the sampling parameters (rows
of ``params.PARAMS``), the limits, the stop strings, ``logit_bias``, ``lookup``, the
constraint fields and the tool fields, each with the JSON types a wire body may give it and
the words an error uses for them. ``GenerationSpec`` holds one request's values. It is built
once, by ``from_kwargs`` (the Python API, the CLI) or by ``from_body`` (a wire format's
parser, which type-checks the JSON against the table), and checked once when the API turns
it into the engine's ``Request``. A new field is a row here; a new wire format is a parser
that fills a GenerationSpec (docs/engine.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidRequestError
from .params import SAMPLING_FIELDS

__all__ = ["CHAT_FIELDS", "CONSTRAINT_FIELDS", "DEFAULT_MAX_TOKENS", "EXTRA_CHAT_FIELDS",
           "FIELDS", "Field", "GenerationSpec", "chat_extras",
           "check_json_types"]


@dataclass(frozen=True)
class Field:
    """A generation field: its ``kind`` (sampling, limit, constraint, tools), the JSON
    ``types`` a body may give (None always means "the default"; a bool is never a number)
    and ``what`` those types are in an error's words."""

    kind: str
    types: tuple[type, ...]
    what: str


FIELDS: dict[str, Field] = {n: Field("sampling", *t) for n, t in SAMPLING_FIELDS.items()} | {
    "max_tokens": Field("limit", (int,), "an integer"),
    "stop": Field("limit", (str, list), "a string or a list of strings"),
    "logit_bias": Field("limit", (dict, list), "an object mapping token ids to biases"),
    "lookup": Field("limit", (int,), "an integer"),  # prompt-lookup drafts (lookup.py)
    # structured output (grammar.py): OpenAI's response_format, llama-server's fields
    "response_format": Field("constraint", (dict,), "an object"),
    "json_schema": Field("constraint", (dict, str), "a JSON schema (an object, or its JSON "
                         "text)"),
    "grammar": Field("constraint", (str,), "a string (a GBNF or Lark grammar)"),
    "regex": Field("constraint", (str,), "a string (a regular expression)"),
    # tool calls (tools.py); chat only
    "tools": Field("tools", (list,), "a list of tools"),
    "tool_choice": Field("tools", (str, dict), "\"none\", \"auto\", \"required\" or a named "
                         "function"),
    "parallel_tool_calls": Field("tools", (bool,), "a boolean"),
    # reasoning and the chat template (chatformat/, engine/reasoning.py); chat only
    "chat_template_kwargs": Field("chat", (dict,), "an object"),
    "reasoning_format": Field("chat", (str,), "\"none\", \"auto\" or \"deepseek\""),
    "reasoning_effort": Field("chat", (str,), "a string (low, medium, high)"),
    "reasoning_budget_tokens": Field("chat", (int,), "an integer (-1: no limit)"),
    "think": Field("chat", (bool,), "a boolean"),
}
CONSTRAINT_FIELDS = tuple(n for n, f in FIELDS.items() if f.kind == "constraint")
_TOOL_FIELDS = tuple(n for n, f in FIELDS.items() if f.kind == "tools")
CHAT_FIELDS = tuple(n for n, f in FIELDS.items() if f.kind == "chat")
_SAMPLING = tuple(n for n, f in FIELDS.items() if f.kind == "sampling" and n != "seed")

# max_tokens when a request does not give it: OpenAI's 16 for completions, and for a
# conversation (and the engine's own submit) until the model ends its turn or the context
# is full (-1)
DEFAULT_MAX_TOKENS = {"completion": 16, "chat": -1, "submit": -1}
_ABSENT = object()


# llama-server's extra body fields every chat route takes, whatever its wire format
EXTRA_CHAT_FIELDS = ("chat_template_kwargs", "reasoning_format", "reasoning_budget_tokens")


def chat_extras(body: Mapping[str, Any]) -> dict[str, Any]:
    """The ``EXTRA_CHAT_FIELDS`` a body gives, type-checked (InvalidRequestError)."""
    table = {n: FIELDS[n] for n in EXTRA_CHAT_FIELDS}
    check_json_types(body, table)
    return {n: body[n] for n in EXTRA_CHAT_FIELDS if body.get(n) is not None}


def check_json_types(body: Mapping[str, Any], fields: Mapping[str, Field]) -> None:
    """Each of ``fields`` present in ``body`` has one of its JSON types (None is always
    allowed); an InvalidRequestError naming the first that does not."""
    for name, f in fields.items():
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) and bool not in f.types or not isinstance(value, f.types):
            raise InvalidRequestError(f"'{name}' must be {f.what}, got {_short(value)}",
                                      param=name)


def _short(value: Any) -> str:
    import json

    try:
        return json.dumps(value)[:40]
    except (ValueError, TypeError):
        return type(value).__name__


@dataclass
class GenerationSpec:
    """One request's generation fields (see the module's docstring). ``max_tokens`` None:
    until the turn ends (-1); ``sampling`` holds the sampling keywords given (seed apart);
    ``constraint`` the constraint fields given; the tool fields and ``chat`` (the reasoning
    and template fields given) are chat's."""

    max_tokens: Any = -1
    stop: Any = None
    seed: Any = None
    logit_bias: Any = None
    lookup: Any = None
    sampling: dict[str, Any] = field(default_factory=dict)
    constraint: dict[str, Any] = field(default_factory=dict)
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    chat: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_kwargs(cls, route: str, kwargs: Mapping[str, Any]) -> GenerationSpec:
        """From Python keywords (``max_tokens`` absent: the route's default, None: no
        limit); a TypeError for a keyword that is no generation field."""
        unknown = set(kwargs) - set(FIELDS)
        if unknown:
            raise TypeError(f"unexpected argument(s): {', '.join(sorted(unknown))}")
        max_tokens = kwargs.get("max_tokens", _ABSENT)
        return cls._of(dict(kwargs), DEFAULT_MAX_TOKENS[route] if max_tokens is _ABSENT
                       else max_tokens)

    @classmethod
    def from_body(cls, route: str, body: Mapping[str, Any],
                  max_tokens: Any = None) -> GenerationSpec:
        """From a JSON body whose types ``check_json_types`` has checked; ``max_tokens``
        is the wire format's own limit field (null or absent: the route's default)."""
        values = {k: body[k] for k in FIELDS if body.get(k) is not None}
        return cls._of(values, DEFAULT_MAX_TOKENS[route] if max_tokens is None
                       else max_tokens)

    @classmethod
    def _of(cls, values: dict[str, Any], max_tokens: Any) -> GenerationSpec:
        return cls(max_tokens=max_tokens, stop=values.get("stop"), seed=values.get("seed"),
                   logit_bias=values.get("logit_bias"), lookup=values.get("lookup"),
                   sampling={k: values[k] for k in _SAMPLING if values.get(k) is not None},
                   constraint={k: values[k] for k in CONSTRAINT_FIELDS
                               if values.get(k) is not None},
                   chat={k: values[k] for k in CHAT_FIELDS if values.get(k) is not None},
                   **{k: values.get(k) for k in _TOOL_FIELDS})

    @property
    def has_tools(self) -> bool:
        return any(getattr(self, k) is not None for k in _TOOL_FIELDS)
