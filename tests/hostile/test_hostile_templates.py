"""Chat templates are untrusted code: hostile templates stop with a clear error, in bounded
time and memory, and real templates render exactly as before.

Each hostile template of issue 12 is rendered here (exponent, nested loops, string doubling,
tojson indent, format widths, and their relatives): the render must raise
``TemplateLimitError`` naming the template and the bound, quickly, without allocating more
than a bounded amount (traced), and without harming other renders running in other threads.
The real templates (SmolLM2's from the pulled file, the built-in Gemma 3, and Llama 3.1's
and Qwen2.5's as published in their tokenizer_config.json, copied below) must render the
same text as jinja's plain sandbox configured as ``transformers`` does it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from gguflm import gguf
from gguflm.tokenizer import Tokenizer
from gguflm.tokenizer.chat import (
    BUILTIN_TEMPLATES,
    ChatTemplate,
    ChatTemplateError,
    TemplateCancelledError,
    TemplateLimitError,
    TemplateLimits,
    _GenerationTag,
)
from real_templates import LLAMA31, QWEN25

FAST = TemplateLimits(timeout=0.5, max_memory=32 << 20)  # quick tests, small traces
USER = [{"role": "user", "content": "hi"}]

# the reproductions first, then their relatives: template -> the bound it breaks
HOSTILE = {
    "power": ("{{ 10 ** 1000000000 }}", "integer"),
    "power-5000": ("{{ 10 ** 5000 }}", "integer"),
    "nested-range-loops": ("{% for a in range(100000) %}{% for b in range(100000) %}"
                           "{% endfor %}{% endfor %}{{ messages[0].content }}", "time"),
    "namespace-doubling": ('{% set ns = namespace(x="a") %}{% for i in range(40) %}'
                           "{% set ns.x = ns.x ~ ns.x %}{% endfor %}{{ ns.x|length }}", "length"),
    "tojson-indent": ("{{ messages | tojson(indent=10**9) }}", "length"),
    "format-width": ('{{ "%0999999999d"|format(1) }}', "length"),
    "percent-width": ('{{ "%0999999999d" % 1 }}', "length"),
    "percent-star-width": ('{{ "%*d" % (999999999, 1) }}', "length"),
    "str-format-width": ('{{ "{:>999999999}".format(1) }}', "length"),
    "str-format-fields": ('{{ "{0}{0}{0}{0}{0}".format("x" * 1000000) }}', "length"),
    "center": ('{{ "x"|center(10**9) }}', "length"),
    "center-method": ('{{ "x".center(10**9) }}', "length"),
    "ljust-method": ('{{ "x".ljust(10**9) }}', "length"),
    "indent": ('{{ "a\nb"|indent(10**9) }}', "length"),
    "indent-string": ('{{ "a\nb"|indent("x" * 1000000 * 4) }}', "length"),
    "repeat": ('{{ "x" * 10**10 }}', "length"),
    "list-repeat": ("{{ messages * 10**9 }}", "length"),
    "concat-doubling": ('{% set ns = namespace(x="ab") %}{% for i in range(40) %}'
                        "{% set ns.x = ns.x + ns.x %}{% endfor %}", "length"),
    "print-shared-list": ('{{ ["x" * 1000000] * 1000 }}', "length"),
    "join-shared-list": ('{{ (["x" * 1000000] * 1000) | join }}', "length"),
    "str-join": ('{{ "".join(["x" * 1000000] * 1000) }}', "length"),
    "tojson-shared-list": ('{{ (["x" * 1000000] * 1000) | tojson }}', "length"),
    "replace": ('{{ ("x" * 100000).replace("x", "y" * 1000) }}', "length"),
    "translate": ('{{ "abc".translate({97: "x" * 100000000}) }}', "length"),
    "expandtabs": ('{{ ("\t" * 1000).expandtabs(10**7) }}', "length"),
    "wordwrap": ('{{ ("a " * 100000)|wordwrap(1, wrapstring="x" * 1000) }}', "length"),
    "to-bytes": ('{{ (1).to_bytes(10**9, "big") }}', "length"),
    "lipsum": ("{{ lipsum(10**6) }}", "length"),
    "batch-fill": ('{{ [1]|batch(10**9, "x")|list }}', "length"),
    "slice-count": ("{{ [1]|slice(10**8)|list|length }}", "length"),
    "sum-of-lists": ("{{ ([[1] * 1000] * 10000) | sum(start=[]) | length }}", "length"),
    "strftime": ('{{ strftime_now("%c" * 100000) }}', "length"),
    "raise-huge": ('{{ raise_exception(["x" * 1000000] * 100) }}', "length"),
    "int-squaring": ("{% set ns = namespace(x=2) %}{% for i in range(40) %}"
                     "{% set ns.x = ns.x * ns.x %}{% endfor %}", "integer"),
    "macro-fan-out": ("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}"
                      "{% endmacro %}{{ f(60) }}", "time"),
    "stored-range-loops": ("{% set r = range(100000) %}{% for a in r %}{% for b in r %}"
                           "{% for c in r %}{% endfor %}{% endfor %}{% endfor %}", "time"),
    "string-loops": ('{% set s = "x" * 1000000 %}{% for a in s %}{% for b in s %}{% endfor %}'
                     "{% endfor %}", "time"),
    "recursive-loop": ("{% for x in range(100000) recursive %}{% for y in range(100000) %}"
                       "{% endfor %}{% endfor %}", "time"),
    "hash-of-shared-tuples": ("{% set ns = namespace(t=(1,)) %}{% for i in range(60) %}"
                              "{% set ns.t = (ns.t, ns.t) %}{% endfor %}{{ ns.t in {} }}",
                              "length"),
    "compare-shared-lists": ("{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(60) %}"
                             "{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b] * 2 %}"
                             "{% endfor %}{{ ns.a == ns.b }}", "length"),
    "macro-output": ('{% macro m() %}{% for i in range(100000) %}{{ "x" * 100000 }}'
                     "{% endfor %}{% endmacro %}{{ m() }}", "memory"),
    "accumulate-list": ("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
                        '{% set ns.l = ns.l + ["x" * 100000 ~ i] %}{% endfor %}', "memory"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_template_stops_with_a_clear_error(name: str) -> None:
    source, limit = HOSTILE[name]
    tracemalloc.start()
    start = time.monotonic()
    try:
        tmpl = ChatTemplate(source, name=f"{name}.jinja", limits=FAST)  # compiles at once
        with pytest.raises(TemplateLimitError) as info:
            tmpl.render(USER)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    elapsed = time.monotonic() - start
    err = info.value
    assert isinstance(err, ChatTemplateError) and not err.raised
    assert err.limit == limit, str(err)
    assert str(err).startswith(f"the chat template ({name}.jinja) ")
    # bounded: the deadline (with a loose margin for a loaded machine, not a speed test) and
    # memory (the render's allowance plus the largest single value refused before it exists)
    assert elapsed < FAST.timeout + 5, f"{elapsed:.1f} s"
    assert peak < 96 << 20, f"{peak >> 20} MiB traced"


def test_compiling_folds_no_hostile_constant() -> None:
    # jinja folds constants while compiling: these hung (or raised from deep inside jinja)
    # when a model was loaded; now the operators are left for render time, where they fail
    for source in ("{{ 10 ** 1000000000 }}", "{{ 10 ** 5000 }}", '{{ "%0999999999d"|format(1) }}',
                   '{{ "x"|center(1000000000) }}', "{{ [0] * 1000000000 }}"):
        start = time.monotonic()
        tmpl = ChatTemplate(source, name="t", limits=FAST)
        assert time.monotonic() - start < 5
        with pytest.raises(TemplateLimitError):
            tmpl.render(USER)


def test_limit_messages_name_the_template_and_the_bound() -> None:
    tmpl = ChatTemplate(HOSTILE["power"][0], name="tokenizer.chat_template")
    with pytest.raises(TemplateLimitError, match=r"^the chat template \(tokenizer\.chat_template\)"
                                                 r" would compute an integer of 4,000,000,000 "
                                                 r"bits \(the limit is 8,192\)$"):
        tmpl.render(USER)
    slow = ChatTemplate(HOSTILE["nested-range-loops"][0], name="t",
                        limits=TemplateLimits(timeout=0.2))
    with pytest.raises(TemplateLimitError, match=r"ran for more than 0.2 s"):
        slow.render(USER)


def test_template_source_is_bounded() -> None:
    limits = TemplateLimits(max_source=1000)
    ChatTemplate("x" * 1000, limits=limits)
    with pytest.raises(TemplateLimitError, match="1,001 characters long") as info:
        ChatTemplate("x" * 1001, name="t", limits=limits)
    assert info.value.limit == "source"
    with pytest.raises(ChatTemplateError, match="does not compile: RecursionError"):
        ChatTemplate("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}")


def test_limits_per_render_and_per_template() -> None:
    source = ("{% for a in range(10000) %}{% for b in range(3) %}{% endfor %}{% endfor %}"
              "done")
    tmpl = ChatTemplate(source, name="t")
    assert tmpl.render(USER) == "done"  # 30k iterations are fine within the default 2 s
    with pytest.raises(TemplateLimitError, match="more than 1e-06 s"):
        tmpl.render(USER, limits=TemplateLimits(timeout=1e-6))
    tight = ChatTemplate('{{ "x" * 100 }}', name="t", limits=TemplateLimits(max_length=99))
    with pytest.raises(TemplateLimitError, match="of 100 characters"):
        tight.render(USER)
    assert tight.render(USER, limits=TemplateLimits(max_length=100)) == "x" * 100


def test_a_spinning_render_does_not_stop_others() -> None:
    # the server renders in worker threads: a hostile template stops at its own deadline,
    # while other renders (their own budgets) go on and finish normally meanwhile
    evil = ChatTemplate(HOSTILE["nested-range-loops"][0], name="evil",
                        limits=TemplateLimits(timeout=1.5))
    good = ChatTemplate(BUILTIN_TEMPLATES["chatml"], name="chatml")
    errors: list[BaseException] = []

    def spin() -> None:
        try:
            evil.render(USER)
        except BaseException as e:  # noqa: BLE001 - collected and checked below
            errors.append(e)

    threads = [threading.Thread(target=spin) for _ in range(2)]
    for t in threads:
        t.start()
    expected = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert good.render(USER) == expected
    assert all(t.is_alive() for t in threads)  # the good render did not wait for them
    for _ in range(20):
        assert good.render(USER) == expected
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert [type(e) for e in errors] == [TemplateLimitError] * 2
    assert all(e.limit == "time" for e in errors)  # type: ignore[attr-defined]


def test_render_can_be_cancelled() -> None:
    tmpl = ChatTemplate(HOSTILE["nested-range-loops"][0], name="t",
                        limits=TemplateLimits(timeout=120))
    gone = threading.Event()
    result: list[BaseException] = []

    def render() -> None:
        try:
            tmpl.render(USER, cancel=gone.is_set)
        except BaseException as e:  # noqa: BLE001 - collected and checked below
            result.append(e)

    t = threading.Thread(target=render)
    t.start()
    time.sleep(0.2)
    assert t.is_alive()
    gone.set()  # the client left
    t.join(timeout=10)
    assert not t.is_alive()
    assert len(result) == 1 and isinstance(result[0], TemplateCancelledError)
    assert "was cancelled" in str(result[0])


def test_each_template_text_is_compiled_once() -> None:
    a, b = ChatTemplate(QWEN25), ChatTemplate(QWEN25, name="another")
    assert a._template is b._template


# --- real templates render as before ------------------------------------------------------------

class _Raised(Exception):
    pass


def _raise(message: str) -> None:
    raise _Raised(message)


def _plain_render(source: str, specials: dict[str, str], messages: list[dict[str, Any]],
                  **kwargs: Any) -> str:
    """What transformers' apply_chat_template renders: jinja's plain immutable sandbox, no
    bounds (its own tojson, raise_exception; the loop-control and generation tags)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, _GenerationTag])

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None,
               separators: Any = None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = _raise
    kwargs.setdefault("add_generation_prompt", True)
    return env.from_string(source).render(messages=messages, **specials, **kwargs)


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "City name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}}]
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
CONVERSATIONS: list[tuple[list[dict[str, Any]], dict[str, Any]]] = [
    (USER, {}),
    ([{"role": "system", "content": "You are a helpful assistant."},
      {"role": "user", "content": "Hello!"},
      {"role": "assistant", "content": "Hi! How can I help?"},
      {"role": "user", "content": "Caf\u00e9 <b> & \U0001f600?"}], {}),
    ([{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi"}],
     {"add_generation_prompt": False}),
    ([{"role": "system", "content": "Use the tools."},
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 18}'},
      {"role": "user", "content": "Thanks"}], {"tools": TOOLS}),
]
SPECIALS = {"bos_token": "<s>", "eos_token": "</s>"}


def _check_identical(tmpl: ChatTemplate, source: str, specials: dict[str, str]) -> list[str]:
    outputs = []
    for messages, kwargs in CONVERSATIONS:
        kwargs = dict(kwargs)
        want = _plain_render(source, specials, messages, **kwargs)
        agp = kwargs.pop("add_generation_prompt", True)
        assert tmpl.render(messages, agp, **kwargs) == want
        outputs.append(want)
    return outputs


@pytest.mark.parametrize("name", ["llama3.1", "qwen2.5"])
def test_published_templates_render_as_before(name: str) -> None:
    source = {"llama3.1": LLAMA31, "qwen2.5": QWEN25}[name]
    outputs = _check_identical(ChatTemplate(source, SPECIALS, name=name), source, SPECIALS)
    tools_prompt = outputs[-1]
    # the tool paths were taken: schemas through tojson (Llama's with indent=4), the call
    assert '"name": "get_weather"' in tools_prompt and '"city": "Paris"' in tools_prompt
    if name == "llama3.1":
        assert '{\n    "type": "function",' in tools_prompt
    else:
        assert "<tools>\n{\"type\": \"function\"" in tools_prompt
        assert "<tool_response>\n{\"temp\": 18}\n</tool_response>" in tools_prompt


def test_smollm2_template_renders_as_before(smollm2_path: Path) -> None:
    f = gguf.open(smollm2_path)
    tok = Tokenizer.from_gguf(f)
    tmpl = ChatTemplate.for_tokenizer(tok, f.metadata)
    assert tmpl.name == "tokenizer.chat_template"
    _check_identical(tmpl, f.metadata["tokenizer.chat_template"], tmpl.special_tokens)


def test_gemma3_builtin_template_renders_as_before(gemma3_path: Path) -> None:
    f = gguf.open(gemma3_path)
    tok = Tokenizer.from_gguf(f)
    tmpl = ChatTemplate.for_tokenizer(tok, f.metadata)
    assert tmpl.name == "built-in gemma"
    for messages, kwargs in CONVERSATIONS[:3]:  # Gemma 3 has no tool format
        kwargs = dict(kwargs)
        want = _plain_render(BUILTIN_TEMPLATES["gemma"], tmpl.special_tokens, messages, **kwargs)
        assert tmpl.render(messages, kwargs.pop("add_generation_prompt", True)) == want


# --- the command line -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["nested-range-loops", "power-5000"])
def test_chat_command_says_error_at_start_up(tmp_path: Path, smollm2_path: Path,
                                             name: str) -> None:
    # `gguflm chat` renders the template once at start-up: it hung on the first, and printed
    # a traceback on the second
    template = tmp_path / "evil.jinja"
    template.write_text(HOSTILE[name][0])
    proc = subprocess.run(
        [sys.executable, "-m", "gguflm.cli", "chat", str(smollm2_path), "--chat-template",
         str(template)], input="", capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and f"the chat template ({template})" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
