"""Reasoning and tool calls through ``gguflm serve`` in each family's own format (issue 47),
driven by the official ``openai`` client on the tiny random-weight references of Qwen3.5,
Qwen3-MoE and gpt-oss with their families' real templates put in (``--chat-template-file``):

* reasoning arrives in ``reasoning_content`` and never in ``content``; streamed equals whole;
* ``--reasoning-budget`` (and ``reasoning_budget_tokens``) ends the block after N tokens, and
  a JSON schema then holds the answer, which validates;
* a forced tool call comes back as ``tool_calls`` with arguments valid for the function,
  written in the family's syntax (Harmony, Qwen3-Coder XML, Hermes JSON);
* ``chat_template_kwargs`` and ``reasoning_effort`` reach the template.

Random weights never close a ``<think>`` by themselves: the budget is what makes the answer
start, which is the point of it. The engine-level parts (the budget's state, the lazy
grammar, the stream's deltas) are checked without a server below.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import openai
import pytest

from gguflm.engine.reasoning import BudgetState, Thinking
from test_hostile_server import _start, _stop

TEMPLATES = Path(__file__).resolve().parents[3] / "shared" / "reference" / "chat"
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 12},
                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 9}},
           "required": ["city", "unit", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                           "parameters": WEATHER}}]
ANSWER = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CASES = {  # fixture, template, family
    "qwen35": ("qwen35_path", "Qwen3-Coder.jinja"),
    "qwen3moe": ("qwen3moe_path", "Qwen-Qwen3-0.6B.jinja"),
    "gpt-oss": ("gpt_oss_path", "openai-gpt-oss-120b.jinja"),
    "qwq": ("qwen35_path", "Qwen-QwQ-32B.jinja"),  # its generation prompt opens <think>
}


@pytest.fixture(scope="module", params=list(CASES))
def client(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[str, openai.OpenAI]]:
    fixture, template = CASES[request.param]
    if not (TEMPLATES / template).is_file():
        pytest.skip(f"{TEMPLATES / template} not found (../shared/reference/chat)")
    model = request.getfixturevalue(fixture)
    proc, url = _start(model, tmp_path_factory.mktemp("reasoning") / "log.txt", "-c", "2048",
                       "--chat-template-file", str(TEMPLATES / template), "-t", "1")
    yield request.param, openai.OpenAI(base_url=url, api_key="x", max_retries=0)
    assert proc.poll() is None, "the server died"
    _stop(proc)


def _both(client: openai.OpenAI, **kwargs: object) -> tuple[dict, dict]:
    """The whole reply's message, and the streamed deltas added up the same way."""
    whole = client.chat.completions.create(model="m", messages=ASK, temperature=0, **kwargs)
    message = whole.choices[0].message.model_dump()
    message["reasoning_content"] = (message.get("reasoning_content")
                                    or (whole.choices[0].message.model_extra or {})
                                    .get("reasoning_content") or "")
    added = {"content": "", "reasoning_content": "", "tool_calls": []}
    for chunk in client.chat.completions.create(model="m", messages=ASK, temperature=0,
                                                stream=True, **kwargs):
        for choice in chunk.choices:
            d = choice.delta.model_dump() | (choice.delta.model_extra or {})
            added["content"] += d.get("content") or ""
            added["reasoning_content"] += d.get("reasoning_content") or ""
            added["tool_calls"] += d.get("tool_calls") or []
    return message, added


def test_reasoning_stays_out_of_content(client: tuple[str, openai.OpenAI]) -> None:
    name, c = client
    message, added = _both(c, max_tokens=24, extra_body={"reasoning_budget_tokens": 6})
    assert added["content"] == (message["content"] or "")
    assert added["reasoning_content"] == message["reasoning_content"]
    for marker in ("<think>", "</think>", "<|channel|>", "<|message|>"):
        assert marker not in (message["content"] or "")
    if name == "qwq":  # the prompt opened the block: the first 6 tokens are reasoning
        assert message["reasoning_content"]


def test_schema_after_reasoning_validates(client: tuple[str, openai.OpenAI]) -> None:
    _, c = client
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
    message, added = _both(c, max_tokens=300, response_format=fmt,
                           extra_body={"reasoning_budget_tokens": 4})
    assert added["content"] == message["content"]
    jsonschema.validate(json.loads(message["content"]), ANSWER)


def test_forced_tool_call_in_the_family_syntax(client: tuple[str, openai.OpenAI]) -> None:
    name, c = client
    message, added = _both(c, max_tokens=300, tools=TOOLS, tool_choice="required",
                           extra_body={"reasoning_budget_tokens": 4})
    calls = message["tool_calls"]
    assert calls and calls[0]["function"]["name"] == "get_weather", message
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), WEATHER)
    assert [t["function"]["arguments"] for t in added["tool_calls"]] == \
        [t["function"]["arguments"] for t in calls]


def test_template_kwargs_reach_the_template(client: tuple[str, openai.OpenAI]) -> None:
    name, c = client
    if name in ("qwen35", "qwq"):
        pytest.skip("Qwen3-Coder's and QwQ's templates read neither enable_thinking nor an "
                    "effort")

    def prompt_tokens(**extra: object) -> int:
        r = c.chat.completions.create(model="m", messages=ASK, max_tokens=1, extra_body=extra)
        return r.usage.prompt_tokens

    if name == "gpt-oss":  # "Reasoning: <effort>" against the default "medium"
        assert prompt_tokens(reasoning_effort="higher than the highest") > prompt_tokens()
    else:  # enable_thinking false adds an empty <think></think> (or drops the open one)
        off = {"chat_template_kwargs": {"enable_thinking": False}}
        assert prompt_tokens(**off) != prompt_tokens()
        _other_routes_take_the_kwargs(str(c.base_url), off, prompt_tokens(**off))


def _other_routes_take_the_kwargs(url: str, off: dict, n_off: int) -> None:
    """llama-server's extra chat fields work on Anthropic's and Ollama's routes too."""
    import anthropic
    import ollama

    base = url.removesuffix("/").removesuffix("/v1")
    a = anthropic.Anthropic(base_url=base, api_key="x", max_retries=0)
    counted = a.messages.count_tokens(model="m", messages=ASK, extra_body=off)
    assert counted.input_tokens == n_off
    o = ollama.Client(host=base)
    r = o.chat(model="m", messages=ASK, stream=False, options={"num_predict": 1})
    r_off = o._client.post("/api/chat", json={"model": "m", "messages": ASK, "stream": False,
                                              "options": {"num_predict": 1}, **off}).json()
    assert r_off["prompt_eval_count"] == n_off != r.prompt_eval_count


def test_bad_reasoning_fields_are_400(client: tuple[str, openai.OpenAI]) -> None:
    _, c = client
    for extra in ({"reasoning_format": "bogus"}, {"reasoning_budget_tokens": -5},
                  {"chat_template_kwargs": "enable_thinking"}):
        with pytest.raises(openai.BadRequestError):
            c.chat.completions.create(model="m", messages=ASK, max_tokens=1,
                                      extra_body=extra)


# --- without a server ------------------------------------------------------------------------

def _budget(opened: bool, budget: int, pieces: dict[int, bytes]) -> BudgetState:
    thinking = Thinking(b"<think>", b"</think>", opened, budget, (90, 91))
    return BudgetState(thinking, lambda t: pieces[t])


def test_budget_counts_from_the_start_tag_and_forces_the_end() -> None:
    pieces = {1: b"<th", 2: b"ink>\n", 3: b"x", 4: b"\xe2", 5: b"\x82\xac", 90: b"</th",
              91: b"ink>"}
    b = _budget(False, 2, pieces)
    for t in (3, 1, 2):  # idle until the tag, even split across tokens and with "\n" after
        assert b.forced() is None
        b.accept(t)
    b.accept(3)
    assert b.forced() is None
    b.accept(4)  # the budget ends inside a character: the character comes first
    assert b.forced() is None
    b.accept(5)
    assert b.forced() == 90
    b.accept(90)
    assert b.forced() == 91
    b.accept(91)
    assert b.forced() is None  # done
    b.accept(3)
    assert b.forced() is None


def test_budget_zero_and_natural_end() -> None:
    pieces = {3: b"x", 90: b"</th", 91: b"ink>"}
    b = _budget(True, 0, pieces)
    assert b.forced() == 90  # opened by the prompt, budget 0: the end at once
    b = _budget(True, 3, pieces)
    for t in (3, 90, 91):  # the model closes the block itself within the budget
        b.accept(t)
    for _ in range(5):
        b.accept(3)
        assert b.forced() is None


def test_stream_parse_is_linear_in_the_reply() -> None:
    from gguflm.chatformat import ChatFormat
    from gguflm.chatformat.stream import ReplyStream

    source = (TEMPLATES / "Qwen-QwQ-32B.jinja")
    if not source.is_file():
        pytest.skip(f"{source} not found")
    fmt = ChatFormat(source.read_text())
    prompt = fmt.generation_prompt(ASK)

    def seconds(n: int) -> float:
        s = ReplyStream(fmt, prompt, None, {}, "auto", lambda: "call_1")
        t0 = time.perf_counter()
        for _ in range(n):
            s.feed("word ")
        s.finish()
        return time.perf_counter() - t0

    small, large = seconds(20_000), seconds(200_000)  # 100 KB and 1 MB of thinking
    assert large < 25 * small + 0.5, (small, large)


def test_unique_items_is_accepted_and_left_to_the_client() -> None:
    """Pydantic's set[...] writes uniqueItems, which llama.cpp and ollama accept: the
    grammar holds the rest of the schema (docs/server.md says uniqueItems is not held)."""
    from gguflm.engine.grammar import json_schema_grammar
    from gguflm.engine.schema import bounded_schema

    schema = {"type": "object", "properties": {"tags": {
        "type": "array", "items": {"type": "string", "maxLength": 4}, "uniqueItems": True,
        "maxItems": 3}}, "required": ["tags"]}
    g = json_schema_grammar(schema)
    assert g.kind == "json_schema" and g.schema == schema  # the original, to validate with
    assert "uniqueItems" not in json.dumps(bounded_schema(schema))
    assert "maxItems" in json.dumps(bounded_schema(schema))


def test_anthropic_and_ollama_get_the_thinking_apart(client: tuple[str, openai.OpenAI]
                                                      ) -> None:
    """Anthropic's thinking blocks (whole and streamed) and Ollama's message.thinking carry
    what OpenAI's reasoning_content carries, for the same request."""
    import anthropic
    import ollama

    name, c = client
    base = str(c.base_url).removesuffix("/").removesuffix("/v1")
    budget = {"reasoning_budget_tokens": 4}
    message, _ = _both(c, max_tokens=16, extra_body=budget)
    a = anthropic.Anthropic(base_url=base, api_key="x", max_retries=0)
    args = {"model": "m", "max_tokens": 16, "messages": ASK,
            "thinking": {"type": "enabled", "budget_tokens": 4},
            "extra_body": {"temperature": 0}}
    whole = a.messages.create(**args)
    thinking = "".join(b.thinking for b in whole.content if b.type == "thinking")
    text = "".join(b.text for b in whole.content if b.type == "text")
    assert thinking == message["reasoning_content"] and text == (message["content"] or "")
    with a.messages.stream(**args) as s:
        final = s.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
    o = ollama.Client(host=base).chat(model="m", messages=ASK, stream=False,
                                      options={"temperature": 0, "num_predict": 16}, think=True)
    plain, _ = _both(c, max_tokens=16, extra_body={"think": True})  # Ollama has no budget
    assert (o.message.thinking or "") == plain["reasoning_content"]
    assert o.message.content == (plain["content"] or "")


@pytest.mark.parametrize(("args", "words"), [
    (["--chat-template-kwargs", "[1]"], "--chat-template-kwargs must be a JSON object"),
    (["--chat-template-kwargs", "{nope"], "--chat-template-kwargs is not JSON"),
    (["--reasoning-budget", "-3"], "--reasoning-budget must be -1 (no limit) or more"),
    (["--reasoning-format", "bogus"], "invalid choice"),
])
def test_bad_reasoning_options_are_one_error_line(qwen35_path: Path, args: list[str],
                                                  words: str) -> None:
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "gguflm.cli", "serve", str(qwen35_path), *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and words in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
