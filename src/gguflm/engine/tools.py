"""Tool calling: OpenAI ``tools``/``tool_choice`` over a model's own tool-call format.

A model writes a tool call in the format its chat template taught it; ``detect_tool_format``
reads that from the template text:

* ``hermes`` (Qwen 2.5/3, Hermes, Granite): ``<tool_call>\\n{"name": "f", "arguments":
  {...}}\\n</tool_call>``, one block per call, text allowed around them;
* ``llama3`` (Llama 3.1-3.3): the whole reply is ``{"name": "f", "parameters": {...}}``;
* ``json``, the fallback for templates that do not take tools (SmolLM2, Gemma 3): the tools
  are described in the system message (``tools_prompt``) and the whole reply is
  ``{"name": "f", "arguments": {...}}``.

``plan_tools`` validates a request's tools and tool_choice and returns a ``ToolPlan``: the
messages to render (tool history rewritten for templates that cannot show it, the tool
prompt added for the fallback), the ``tools`` to pass to the template (native formats only),
the constraint for ``required`` or a named function (a call whose arguments match the
function's ``parameters``; ``auto`` and ``none`` constrain nothing), and a parser
(``toolcalls.ToolCallParser``) that turns the reply, whole or streamed, into OpenAI
``tool_calls`` plus the remaining content.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import regex

from .errors import ConstraintError, InvalidRequestError
from .grammar import JSON_WHITESPACE, Grammar, lark_grammar
from .schema import bounded_schema, check_schema, embed_schema
from .toolcalls import TOOL_FORMATS, ParsedReply, ToolCallParser

__all__ = ["TOOL_CHOICES", "TOOL_FORMATS", "NativeCalls", "Tool", "ToolPlan", "detect_tool_format",
           "plan_tools", "tool_call_grammar", "tools_prompt", "validate_tool_choice",
           "validate_tools"]

TOOL_CHOICES = ("auto", "none", "required")

_NAME = regex.compile(r"[A-Za-z0-9_.\-]{1,64}")
# what a hermes template writes after <tool_call>: a JSON object with "name" and "arguments"
# (quotes escaped or not, in the instructions or the history); not the XML variants
# (<function=...>, <arg_key>) other templates put inside the same tags
_HERMES = regex.compile(r'<tool_call>(?:\\n|\n|\s|\'|"|\+|\{\{-?|-?\}\})*\{\\?"(?:name|arguments)')
_LLAMA3 = regex.compile(r'\\?"parameters\\?": dictionary of argument name')


def detect_tool_format(template_source: str | None) -> str:
    """``hermes``, ``llama3`` or ``json`` (the fallback) for a chat template's source."""
    src = template_source or ""
    if "<function=" not in src and "arg_key" not in src and _HERMES.search(src):
        return "hermes"
    if _LLAMA3.search(src):
        return "llama3"
    return "json"


# --- the request's tools ---------------------------------------------------------------------

@dataclass(frozen=True)
class Tool:
    """One function a model may call."""

    name: str
    parameters: Mapping[str, Any]
    description: str | None = None

    def as_openai(self) -> dict[str, Any]:
        """The OpenAI tool object (what chat templates expect in ``tools``)."""
        fn: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            fn["description"] = self.description
        fn["parameters"] = dict(self.parameters)
        return {"type": "function", "function": fn}


def validate_tools(tools: Any) -> list[Tool]:
    """The request's ``tools`` as ``Tool``s; a malformed entry raises ``InvalidRequestError``
    whose ``param`` names the field (``tools[1].function.parameters``)."""
    if isinstance(tools, str | bytes | Mapping) or not isinstance(tools, Sequence):
        raise InvalidRequestError("tools must be an array of tool objects", param="tools")
    if not tools:
        raise InvalidRequestError("tools must not be empty (leave it out instead)",
                                  param="tools")
    out: list[Tool] = []
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise InvalidRequestError(f"{where} must be an object", param=where)
        if tool.get("type", "function") != "function":
            raise InvalidRequestError(f"{where}.type must be 'function', got "
                                      f"{tool.get('type')!r}", param=f"{where}.type")
        fn = tool.get("function")
        if not isinstance(fn, Mapping):
            raise InvalidRequestError(f"{where}.function must be an object with a name",
                                      param=f"{where}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidRequestError(
                f"{where}.function.name must be 1 to 64 letters, digits, '_', '.' or '-', "
                f"got {name!r}", param=f"{where}.function.name")
        if name in seen:
            raise InvalidRequestError(f"{where}.function.name: {name!r} is defined twice",
                                      param=f"{where}.function.name")
        seen.add(name)
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise InvalidRequestError(f"{where}.function.description must be a string",
                                      param=f"{where}.function.description")
        if "strict" in fn and not isinstance(fn["strict"], bool | None):
            raise InvalidRequestError(f"{where}.function.strict must be a boolean",
                                      param=f"{where}.function.strict")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        param = f"{where}.function.parameters"
        if not isinstance(params, Mapping):
            raise InvalidRequestError(f"{param} must be a JSON schema object", param=param)
        check_schema(params, param)
        if params.get("type", "object") != "object":
            raise InvalidRequestError(f"{param} must describe an object (type 'object'), "
                                      f"got type {params.get('type')!r}", param=param)
        out.append(Tool(name, params, desc))
    return out


def validate_tool_choice(tool_choice: Any, tools: Sequence[Tool]) -> str | Tool:
    """``auto``, ``none``, ``required`` or the named ``Tool`` (``{"type": "function",
    "function": {"name": ...}}``; a bare name is taken too). None means ``auto``."""
    if tool_choice is None:
        return "auto"
    if isinstance(tool_choice, str):
        if tool_choice in TOOL_CHOICES:
            return tool_choice
        name = tool_choice
    elif isinstance(tool_choice, Mapping) and tool_choice.get("type", "function") == "function" \
            and isinstance(tool_choice.get("function"), Mapping):
        name = tool_choice["function"].get("name")
    else:
        raise InvalidRequestError(
            "tool_choice must be 'auto', 'none', 'required' or {\"type\": \"function\", "
            "\"function\": {\"name\": ...}}", param="tool_choice")
    for tool in tools:
        if tool.name == name:
            return tool
    known = ", ".join(t.name for t in tools)
    raise InvalidRequestError(f"tool_choice names the function {name!r}, which is not among "
                              f"the tools ({known})", param="tool_choice")


# --- constraint and prompt -------------------------------------------------------------------

def _args_key(fmt: str) -> str:
    return "parameters" if fmt == "llama3" else "arguments"


def tool_call_grammar(tools: Sequence[Tool], choice: str | Tool, fmt: str,
                      parallel: bool = False) -> Grammar | None:
    """The constraint for ``choice``: for ``required`` a call of any of ``tools``, for a
    ``Tool`` a call of that one, in format ``fmt``, whose arguments match the function's
    ``parameters``; ``parallel`` allows several calls. ``auto``/``none``: None."""
    if not isinstance(choice, Tool) and choice != "required":
        return None
    chosen = [choice] if isinstance(choice, Tool) else list(tools)
    key = _args_key(fmt)
    rules = []
    for i, tool in enumerate(chosen):
        schema = {
            "x-guidance": {"whitespace_pattern": JSON_WHITESPACE, "lenient": False,
                           "coerce_one_of": False},
            "type": "object",
            "properties": {"name": {"const": tool.name},
                           key: embed_schema(bounded_schema(tool.parameters),
                                             f"/properties/{key}")},
            "required": ["name", key],
            "additionalProperties": False,
        }
        rules.append(f"fn{i}: %json {json.dumps(schema, ensure_ascii=False)}")
    body = " | ".join(f"fn{i}" for i in range(len(chosen)))
    if fmt == "hermes":
        call = 'call: "<tool_call>\\n" body "\\n</tool_call>"'
    else:
        call = "call: body"
    start = 'start: call ("\\n" call)*' if parallel else "start: call"
    header = [start, call, f"body: {body}"]
    text = "\n".join([*header, *rules])
    try:
        return lark_grammar(text, param="tools")
    except ConstraintError as e:
        # name the tool whose parameters failed: llguidance reports the line ("at 558(8)"),
        # and rule fn<i> is on line len(header) + i + 1 (the message also quotes the lines
        # around it, so the first "fn<i>" in it is not the one)
        msg = str(e)
        at = regex.search(r"\bat (\d+)\(\d+\)", msg)
        i = int(at.group(1)) - len(header) - 1 if at else -1
        if 0 <= i < len(chosen):
            raise ConstraintError(f"function {chosen[i].name!r}: {msg}", param="tools",
                                  code=e.code) from None
        raise


def tools_prompt(tools: Sequence[Tool], choice: str | Tool) -> str:
    """The system-message text that teaches a model without native tool support the
    ``json`` format (our own wording)."""
    lines = ["You can call the following functions. Each is given with its name, what it "
             "does and its parameters as a JSON schema:"]
    for tool in tools:
        entry: dict[str, Any] = {"name": tool.name}
        if tool.description:
            entry["description"] = tool.description
        entry["parameters"] = tool.parameters
        lines.append(json.dumps(entry, ensure_ascii=False))
    form = 'a JSON object of the form {"name": <function name>, "arguments": <object of ' \
           'argument values>}'
    if isinstance(choice, Tool):
        lines.append(f"Call the function {choice.name!r} now: reply with only {form}.")
    elif choice == "required":
        lines.append(f"Call one of these functions now: reply with only {form}.")
    else:
        lines.append(f"To call a function, reply with only {form}. If no function is "
                     "needed, answer normally.")
    return "\n".join(lines)


# --- the plan for one request ----------------------------------------------------------------

@dataclass
class ToolPlan:
    """How to run one chat request with tools: render ``messages`` with ``template_tools``
    as the template's ``tools`` (None: pass none), constrain with ``grammar`` (None: free),
    and read the reply with ``parser()`` (streaming) or ``parse(text)``."""

    format: str
    tools: list[Tool]
    choice: str | Tool
    messages: list[dict[str, Any]]
    template_tools: list[dict[str, Any]] | None
    grammar: Grammar | None
    parallel: bool = True

    def parser(self, new_id: Callable[[], str] | None = None) -> ToolCallParser:
        """A streaming parser for the reply (no calls are recognised with ``none``); the
        ``native`` format's calls are read by the chat format instead (chatformat/)."""
        tools = [] if self.choice == "none" else self.tools
        return ToolCallParser(self.format, tools, new_id=new_id)

    def parse(self, text: str) -> ParsedReply:
        """The finished reply as content and tool calls."""
        return self.parser().parse(text)

    def watcher(self) -> Callable[[str], bool] | None:
        """For ``Request.watch``: fed the reply as it is generated, True once the model
        repeats a call it has made (small models loop on parallel calls: the same call
        again and again until max_tokens, the last one cut off). None with ``none``."""
        if self.choice == "none" or self.format == "native":
            return None
        parser = self.parser()

        def repeated(text: str) -> bool:
            parser.feed(text)
            return parser.repeated
        return repeated


@dataclass(frozen=True)
class NativeCalls:
    """A template whose family's own call syntax the chat format reads (chatformat/):
    ``family`` names it, ``grammar(functions, parallel)`` writes the Lark text of a forced
    call in that syntax (None where the family has none)."""

    family: str
    grammar: Callable[[Sequence[tuple[str, Any]], bool], str | None]


def plan_tools(messages: Sequence[Mapping[str, Any]], tools: Any, tool_choice: Any = None,
               template_source: str | None = None,
               parallel_tool_calls: bool | None = None,
               native: NativeCalls | None = None) -> ToolPlan | None:
    """Validate ``tools``/``tool_choice`` and prepare the request (see ``ToolPlan``). Returns
    None when the request has no tools (``tools`` None); ``tool_choice`` then must be absent
    or ``none``. A template that is none of the formats read here but whose family the
    chat format reads (``native``) gets the tools itself, format ``native``. Raises
    ``InvalidRequestError`` naming the bad field."""
    if tools is None:
        if tool_choice not in (None, "none"):
            raise InvalidRequestError("tool_choice needs tools", param="tool_choice")
        return None
    checked = validate_tools(tools)
    choice = validate_tool_choice(tool_choice, checked)
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise InvalidRequestError("parallel_tool_calls must be a boolean",
                                  param="parallel_tool_calls")
    parallel = True if parallel_tool_calls is None else parallel_tool_calls
    fmt = detect_tool_format(template_source)
    if fmt == "json" and native is not None:
        fmt = "native"
    msgs = _history(messages, fmt)
    template_tools = None
    if choice != "none":
        if fmt == "json":
            msgs = _with_system(msgs, tools_prompt(checked, choice))
        else:
            template_tools = [t.as_openai() for t in checked]
    if fmt == "native":
        grammar = native_call_grammar(checked, choice, parallel, native)
    else:
        grammar = tool_call_grammar(checked, choice, fmt, parallel)
    return ToolPlan(fmt, checked, choice, msgs, template_tools, grammar, parallel)


def native_call_grammar(tools: Sequence[Tool], choice: str | Tool, parallel: bool,
                        native: NativeCalls) -> Grammar | None:
    """The constraint for a forced call in the family's own syntax (None unless forced)."""
    if not isinstance(choice, Tool) and choice != "required":
        return None
    chosen = [choice] if isinstance(choice, Tool) else list(tools)
    functions = [(t.name, {"x-guidance": {"whitespace_pattern": JSON_WHITESPACE,
                                          "lenient": False, "coerce_one_of": False}}
                  | dict(bounded_schema(t.parameters))) for t in chosen]
    text = native.grammar(functions, parallel)
    if text is None:
        what = "a named function" if isinstance(choice, Tool) else "'required'"
        raise InvalidRequestError(
            f"tool_choice {what} is not supported for this model's tool-call format "
            f"({native.family}) yet: use 'auto'", param="tool_choice")
    return lark_grammar(text, param="tools")


def _with_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    if messages and messages[0].get("role") == "system" and isinstance(
            messages[0].get("content"), str):
        first = dict(messages[0])
        first["content"] = f"{first['content']}\n\n{text}" if first["content"] else text
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _history(messages: Sequence[Mapping[str, Any]], fmt: str) -> list[dict[str, Any]]:
    """The conversation with earlier tool calls in a form the template can render: for
    native formats, arguments as objects (templates apply ``tojson`` to them); for the
    fallback, calls written out as the JSON the model is asked for and tool results as a
    user turn (merged with each other and with a user message right after them, so that
    user and assistant turns still alternate)."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise InvalidRequestError("messages must be a list", param="messages")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise InvalidRequestError(f"messages[{i}] must be an object", param="messages")
        m = dict(m)
        calls = m.get("tool_calls")
        if calls is not None:
            parsed = _history_calls(calls, i)
            if fmt == "json":
                text = "\n".join(json.dumps({"name": n, "arguments": a}, ensure_ascii=False)
                                 for n, a in parsed)
                content = m.get("content")
                m["content"] = f"{content}\n{text}" if isinstance(content, str) and content \
                    else text
                del m["tool_calls"]
            else:
                m["tool_calls"] = [
                    {**c, "function": {**c["function"], "arguments": a}}
                    for c, (_, a) in zip(calls, parsed)]
        if fmt == "json" and m.get("role") == "tool":
            label = m.get("name") or m.get("tool_call_id") or "the function"
            text = f"Result of {label}: {_text(m.get('content'))}"
            if out and out[-1].get("_tool_result"):
                out[-1]["content"] += "\n" + text
                continue
            m = {"role": "user", "content": text, "_tool_result": True}
        elif fmt == "json" and m.get("role") == "user" and out and out[-1].get("_tool_result"):
            out[-1]["content"] += "\n\n" + _text(m.get("content"))
            del out[-1]["_tool_result"]
            continue
        out.append(m)
    for m in out:
        m.pop("_tool_result", None)
    return out


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    return json.dumps(content, ensure_ascii=False)


def _history_calls(calls: Any, i: int) -> list[tuple[str, Any]]:
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise InvalidRequestError(f"{where} must be an array", param=where)
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise InvalidRequestError(f"{where}[{j}].function must be an object with a name",
                                      param=f"{where}[{j}].function")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                raise InvalidRequestError(f"{where}[{j}].function.arguments is not valid JSON",
                                          param=f"{where}[{j}].function.arguments") from None
        out.append((fn["name"], args))
    return out
