"""Chat templates: a conversation -> the prompt text a model was trained on.

Models ship a Jinja template in ``tokenizer.chat_template``; we render it the way Hugging
Face's ``apply_chat_template`` does (transformers' ``_compile_jinja_template``): an
``ImmutableSandboxedEnvironment`` with ``trim_blocks``/``lstrip_blocks``, the loop-control
extension, a ``tojson`` filter that does not HTML-escape (``ensure_ascii=False``, ``indent``,
``separators``, ``sort_keys``), and the globals ``raise_exception`` and ``strftime_now``;
the special tokens (``bos_token``, ``eos_token``, ...) are passed as variables.

A template is untrusted code (it comes with the model file): it is compiled and rendered in
``sandbox.BoundedEnvironment``, under a deadline and caps on sizes and memory
(``TemplateLimits``); breaking one raises ``TemplateLimitError``. Each template text is
compiled once (a small cache keyed by the text).

A file without a template gets a built-in one chosen from its vocabulary: Gemma's when it has
``<start_of_turn>``, else ChatML (llama.cpp's default). Needs only jinja2 and the tokenizer.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes

from .sandbox import (
    COMPILE_LIMITS,
    BoundedEnvironment,
    Cancelled,
    LimitExceeded,
    TemplateLimits,
    bounded,
    to_text,
)
from .vocab import TokenizerError

__all__ = ["BUILTIN_TEMPLATES", "ChatTemplate", "ChatTemplateError", "TemplateCancelledError",
           "TemplateLimitError", "TemplateLimits", "encode_prompt", "load_template_file"]

# ChatML, as llama.cpp formats it when a model has no template of its own.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Gemma 3's template (google/gemma-3-*-it, tokenizer_config.json): no system role, so the
# system text is folded into the first user turn; roles must alternate user/model.
GEMMA3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

BUILTIN_TEMPLATES = {"chatml": CHATML, "gemma": GEMMA3}

# special-token variables HF passes to every template (its special_tokens_map)
_SPECIAL_VARS = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unk", "pad_token": "pad"}


class ChatTemplateError(TokenizerError):
    """A chat template that does not parse, fails while rendering, or rejects the
    conversation through ``raise_exception`` (then ``raised`` is True)."""

    def __init__(self, message: str, raised: bool = False) -> None:
        super().__init__(message)
        self.raised = raised


class TemplateLimitError(ChatTemplateError):
    """A chat template broke a bound while compiling or rendering: it ran past its deadline
    or would have built too much. ``limit`` says which: "time", "length" (a string or list
    longer than ``TemplateLimits.max_length``), "memory", "integer" or "source" (the
    template's own text is too long)."""

    def __init__(self, message: str, limit: str) -> None:
        super().__init__(message)
        self.limit = limit


class TemplateCancelledError(ChatTemplateError):
    """A render stopped because its ``cancel`` callback said so (the client left)."""


class _TemplateException(Exception):
    """What the template's ``raise_exception(message)`` throws (unwrapped by ``render``)."""


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (HF's assistant-mask marker): renders its
    body unchanged, so templates that use it parse."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise_exception(message: Any) -> None:
    raise _TemplateException(to_text(message))


def _strftime_now(fmt: str) -> str:
    if len(fmt) > 4096:  # one directive prints up to ~30 characters
        raise LimitExceeded("length", f"asked strftime_now for a {len(fmt):,}-character format")
    return datetime.now().strftime(fmt)


@functools.cache
def _environment() -> BoundedEnvironment:
    # HF's settings; its tojson (no HTML escaping, json.dumps options) is the sandbox's
    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True,
                             extensions=[jinja2.ext.loopcontrols, _GenerationTag])
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.guard_filters()
    return env


@functools.lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
    """The compiled template (cached: an LLM, a server's worker and a test share one).
    Constant folding runs under COMPILE_LIMITS; what it cannot fold waits for render."""
    with bounded(COMPILE_LIMITS):
        return _environment().from_string(source)


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text):,} chars)"


class ChatTemplate:
    """A compiled chat template and the special-token strings it is rendered with."""

    def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None,
                 name: str = "template", limits: TemplateLimits | None = None) -> None:
        if not isinstance(source, str) or not source.strip():
            raise ChatTemplateError(f"the chat template ({name}) is empty")
        self.source = source
        self.name = name
        self.special_tokens = dict(special_tokens or {})
        self.limits = limits or TemplateLimits()
        if len(source) > self.limits.max_source:
            raise TemplateLimitError(
                f"the chat template ({name}) is {len(source):,} characters long (the limit "
                f"is {self.limits.max_source:,})", limit="source")
        try:
            self._template = _compile(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(
                f"the chat template ({name}) does not parse: line {e.lineno}: {e.message}"
            ) from None
        except LimitExceeded as e:
            raise TemplateLimitError(f"the chat template ({name}) {e}", e.limit) from None
        except Exception as e:  # noqa: BLE001 - too deep to compile, and the like
            raise ChatTemplateError(f"the chat template ({name}) does not compile: "
                                    f"{type(e).__name__}: {_short(str(e))}") from None

    @property
    def bos_token(self) -> str:
        return self.special_tokens.get("bos_token", "")

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, metadata: Mapping[str, Any] | None = None,
                      override: str | os.PathLike[str] | None = None) -> ChatTemplate:
        """The template to use with ``tokenizer``: the file ``override`` if given, else
        ``tokenizer.chat_template`` from ``metadata``, else a built-in one that fits the
        vocabulary (Gemma's turn markers, else ChatML)."""
        specials = special_token_strings(tokenizer)
        if override is not None:
            return cls(load_template_file(override), specials, name=str(override))
        source = (metadata or {}).get("tokenizer.chat_template")
        if isinstance(source, str) and source.strip():
            return cls(source, specials, name="tokenizer.chat_template")
        kind = "gemma" if tokenizer.token_id("<start_of_turn>") is not None else "chatml"
        return cls(BUILTIN_TEMPLATES[kind], specials, name=f"built-in {kind}")

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None, *,
               limits: TemplateLimits | None = None, cancel: Callable[[], bool] | None = None,
               **kwargs: Any) -> str:
        """The prompt text for ``messages`` (dicts with ``role`` and ``content``).

        ``add_generation_prompt`` appends the header of the assistant's next turn; ``tools``
        (OpenAI-style function schemas) and any ``kwargs`` are passed to the template as
        variables, as HF's ``apply_chat_template`` does.

        The render is bounded by ``limits`` (default: the template's, 2 s and the size caps
        of ``TemplateLimits``) and stops early when ``cancel()`` returns true (it is polled
        every few dozen steps); safe to call from several threads at once. Raises
        ``TemplateLimitError`` past a bound, ``TemplateCancelledError`` when cancelled, and
        ``ChatTemplateError`` for anything else the template does wrong.
        """
        check_messages(messages)
        context: dict[str, Any] = dict(self.special_tokens)
        context.update(kwargs)
        context["messages"] = [dict(m) for m in messages]
        context["add_generation_prompt"] = bool(add_generation_prompt)
        if tools is not None:
            context["tools"] = list(tools)
        template = self._template
        try:
            with bounded(limits or self.limits, cancel):
                # Template.render without its traceback rewriting (costly, and unused here)
                return template.environment.concat(  # type: ignore[attr-defined]
                    template.root_render_func(template.new_context(context)))
        except _TemplateException as e:
            raise ChatTemplateError(f"the chat template rejected the conversation: "
                                    f"{_short(str(e))}", raised=True) from None
        except LimitExceeded as e:
            raise TemplateLimitError(f"the chat template ({self.name}) {e}", e.limit) from None
        except Cancelled:
            raise TemplateCancelledError(
                f"rendering the chat template ({self.name}) was cancelled") from None
        except Exception as e:  # noqa: BLE001 - anything a template does wrong is its error
            kind = type(e).__name__
            raise ChatTemplateError(
                f"the chat template ({self.name}) failed: {kind}: {_short(str(e))}") from None

    def __repr__(self) -> str:
        return f"ChatTemplate({self.name}, {len(self.source)} chars)"


def check_messages(messages: Any) -> None:
    """Raise ChatTemplateError unless ``messages`` is a non-empty list of dicts with a string
    ``role`` and a ``content`` that is a string, a list of parts, or None."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not messages:
        raise ChatTemplateError("messages must be a non-empty list of {role, content} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ChatTemplateError(f"messages[{i}] must be an object with role and content")
        if not isinstance(m.get("role"), str):
            raise ChatTemplateError(f"messages[{i}].role must be a string")
        content = m.get("content")
        if content is not None and not isinstance(content, str | list):
            raise ChatTemplateError(
                f"messages[{i}].content must be a string or a list of content parts")


def special_token_strings(tokenizer: Any) -> dict[str, str]:
    """``bos_token`` etc. as the text of the tokenizer's special tokens (absent: left out)."""
    out = {}
    for var, which in _SPECIAL_VARS.items():
        tid = getattr(tokenizer, f"{which}_id", None)
        if tid is not None and 0 <= tid < tokenizer.n_vocab:
            out[var] = tokenizer.token_text(tid)
    return out


def load_template_file(path: str | os.PathLike[str]) -> str:
    """A template from a file: Jinja text, or a Hugging Face ``tokenizer_config.json`` (its
    ``chat_template``: a string, or a list of named templates, of which ``default``)."""
    from ..textfile import TEMPLATE_FILES, TextFileError, read_limited

    try:
        text = read_limited(path, *TEMPLATE_FILES)
    except TextFileError as e:  # not a regular file, over the cap, not UTF-8
        raise ChatTemplateError(e.say(f"the chat template {path}")) from None
    if str(path).endswith(".json"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ChatTemplateError(f"{path} is not valid JSON: {e}") from None
        tmpl = data.get("chat_template") if isinstance(data, dict) else None
        if isinstance(tmpl, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in tmpl if isinstance(t, dict)}
            tmpl = named.get("default")
        if not isinstance(tmpl, str):
            raise ChatTemplateError(f"{path} has no chat_template string")
        return tmpl
    return text


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a rendered chat prompt: special tokens in it parsed, and BOS added as the
    vocabulary asks unless the text already begins with it (templates often write
    ``{{ bos_token }}`` themselves, and llama.cpp would then start with two)."""
    ids = tokenizer.encode(text, add_special=False, parse_special=True)
    bos = tokenizer.bos_id
    if tokenizer.add_bos and bos is not None and (not ids or ids[0] != bos):
        ids.insert(0, bos)
    return ids  # no EOS even when add_eos: the model is to continue after the prompt
