"""Real chat templates through the bounded renderer vs. jinja's plain sandbox (HF's setup).

    python benchmarks/check_templates.py [FOLDER ...] [--repeat 20]

FOLDER holds ``*.jinja`` files (default: llama.cpp's ``models/templates``, 70 templates
copied from Hugging Face, in the unpacked llama-cpp-python source at /work/llama.cpp-src);
the built-in templates and those of the cached models are added. Each template renders a
set of conversations (plain, system prompt, tools with calls and responses, content parts)
with ``ChatTemplate`` and with an unbounded ``ImmutableSandboxedEnvironment`` configured as
``transformers`` does it; the two must agree exactly (the same text, or both raising the
template's own ``raise_exception``, or both failing). Prints mismatches, the compile time of
the largest template, and the bounded/unbounded render time ratio (same process, same run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

import gguflm.gguf as gguf
from gguflm.tokenizer.chat import (
    BUILTIN_TEMPLATES,
    ChatTemplate,
    ChatTemplateError,
    _compile,
    _GenerationTag,  # the same {% generation %} tag
)

TEMPLATES = Path("/work/llama.cpp-src/vendor/llama.cpp/models/templates")
CACHE = Path(os.environ.get("GGUFLM_HOME", Path.home() / ".cache" / "gguflm"))
SPECIALS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}]
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}
CONVERSATIONS: list[tuple[str, list[dict[str, Any]], dict[str, Any]]] = [
    ("user", [{"role": "user", "content": "Hello!"}], {}),
    ("system+turns", [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Hi! How can I help?"},
        {"role": "user", "content": "Capital of France?"}], {}),
    ("tools", [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18 C"},
        {"role": "user", "content": "Thanks"}], {"tools": TOOLS}),
    ("tools-json-args", [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {**CALL, "function": {**CALL["function"], "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}], {"tools": TOOLS}),
    ("parts", [{"role": "user", "content": [{"type": "text", "text": "Hello"},
                                            {"type": "text", "text": " there"}]}], {}),
    ("no-generation-prompt", [{"role": "user", "content": "Hi"},
                              {"role": "assistant", "content": "Hello"}],
     {"add_generation_prompt": False}),
]


class _Raised(Exception):
    pass


def _raise(message: str) -> None:
    raise _Raised(message)


def plain_environment() -> ImmutableSandboxedEnvironment:
    """transformers' _compile_jinja_template, without any bound."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, _GenerationTag])

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: "26 Jul 2024"
    return env


def outcome_plain(tmpl: jinja2.Template, messages: list[dict[str, Any]], extra: dict) -> str:
    ctx = {**SPECIALS, "messages": messages, "add_generation_prompt": True, **extra}
    try:
        return "text:" + tmpl.render(**ctx)
    except _Raised as e:
        return f"raised:{e}"
    except Exception as e:  # noqa: BLE001
        return f"failed:{type(e).__name__}"


def outcome_bounded(tmpl: ChatTemplate, messages: list[dict[str, Any]], extra: dict) -> str:
    extra = dict(extra)
    agp = extra.pop("add_generation_prompt", True)
    try:
        return "text:" + tmpl.render(messages, agp, **extra)
    except ChatTemplateError as e:
        if e.raised:
            return "raised:" + str(e).split("rejected the conversation: ", 1)[1]
        return "failed:" + str(e).split(" failed: ", 1)[-1].split(":")[0]


def sources(folders: list[Path]) -> dict[str, str]:
    out = {f"built-in {k}": v for k, v in BUILTIN_TEMPLATES.items()}
    for p in sorted(CACHE.glob("*.gguf")):
        with gguf.open(p) as f:
            t = f.metadata.get("tokenizer.chat_template")
        if isinstance(t, str):
            out[p.name] = t
    for folder in folders:
        for p in sorted(folder.glob("*.jinja")):
            out[p.name] = p.read_text(encoding="utf-8")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="*", type=Path)
    ap.add_argument("--repeat", type=int, default=20, help="renders per case for the timing")
    args = ap.parse_args()
    folders = args.folders or ([TEMPLATES] if TEMPLATES.is_dir() else [])
    templates = sources(folders)
    env = plain_environment()
    # the strftime_now stub must match: both renderers get the same fixed date
    import gguflm.tokenizer.chat as chat
    chat._environment().globals["strftime_now"] = lambda fmt: "26 Jul 2024"

    mismatches = same_text = same_error = 0
    t_plain = t_bounded = 0.0
    for name, src in templates.items():
        try:
            plain = env.from_string(src)
        except jinja2.TemplateError as e:
            print(f"{name}: does not compile in plain jinja either ({e})")
            continue
        bounded = ChatTemplate(src, SPECIALS, name=name)
        for label, msgs, extra in CONVERSATIONS:
            a = outcome_plain(plain, msgs, extra)
            b = outcome_bounded(bounded, msgs, extra)
            if a != b:
                mismatches += 1
                print(f"MISMATCH {name} / {label}:\n  plain:   {a[:300]!r}\n  bounded: {b[:300]!r}")
                continue
            if a.startswith("text:"):
                same_text += 1
                t0 = time.perf_counter()
                for _ in range(args.repeat):
                    outcome_plain(plain, msgs, extra)
                t1 = time.perf_counter()
                for _ in range(args.repeat):
                    outcome_bounded(bounded, msgs, extra)
                t2 = time.perf_counter()
                t_plain += t1 - t0
                t_bounded += t2 - t1
            else:
                same_error += 1
    largest = max(templates.items(), key=lambda kv: len(kv[1]))
    _compile.cache_clear()
    t0 = time.perf_counter()
    ChatTemplate(largest[1], name=largest[0])
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    env.from_string(largest[1])
    plain_compile_s = time.perf_counter() - t0
    print(f"{len(templates)} templates x {len(CONVERSATIONS)} conversations: {same_text} "
          f"identical texts, {same_error} identical errors, {mismatches} mismatches")
    print(f"render time bounded/plain: {t_bounded / max(t_plain, 1e-9):.2f}x "
          f"({t_bounded * 1e6 / max(same_text * args.repeat, 1):.0f} us vs "
          f"{t_plain * 1e6 / max(same_text * args.repeat, 1):.0f} us per render)")
    print(f"compile of the largest ({largest[0]}, {len(largest[1]):,} chars): "
          f"{compile_s * 1e3:.0f} ms bounded, {plain_compile_s * 1e3:.0f} ms plain")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
