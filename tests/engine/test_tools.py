"""Tool calling (engine/tools.py): formats from real chat templates, tools/tool_choice
validation, the history rewriting, parsing of replies (whole and streamed in any chunks), and
constrained calls on both real models in all three formats.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from constrained import (
    LLAMA31,
    QWEN,
    TEMPLATES,
    TOOL_QUESTIONS,
    TOOLS,
    Chat,
    tool_parameters,
)
from gguflm.engine.constraints import Constraint
from gguflm.engine.errors import InvalidRequestError
from gguflm.engine.toolcalls import ParsedReply, ToolCallParser, parse_tool_calls
from gguflm.engine.tools import (
    detect_tool_format,
    plan_tools,
    tool_call_grammar,
    tools_prompt,
    validate_tool_choice,
    validate_tools,
)
from gguflm.tokenizer.chat import BUILTIN_TEMPLATES, ChatTemplate

CALL_ID = re.compile(r"call_[0-9a-f]{24}")
CHECKED = validate_tools(TOOLS)


@pytest.fixture(scope="module")
def smollm(smollm2_path: Path) -> Chat:
    return Chat.of(smollm2_path)


@pytest.fixture(scope="module")
def gemma(gemma3_path: Path) -> Chat:
    return Chat.of(gemma3_path)


# --- formats -----------------------------------------------------------------------------------

def test_formats_are_read_from_the_templates(smollm: Chat) -> None:
    assert detect_tool_format(QWEN.read_text()) == "hermes"
    assert detect_tool_format(
        (TEMPLATES / "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja").read_text()) == "hermes"
    assert detect_tool_format(LLAMA31.read_text()) == "llama3"
    assert detect_tool_format(
        (TEMPLATES / "meta-llama-Llama-3.2-3B-Instruct.jinja").read_text()) == "llama3"
    # templates that take no tools: the JSON fallback
    assert detect_tool_format(smollm.template.source) == "json"
    assert detect_tool_format(BUILTIN_TEMPLATES["gemma"]) == "json"
    assert detect_tool_format(BUILTIN_TEMPLATES["chatml"]) == "json"
    assert detect_tool_format(None) == "json"
    # <tool_call> around something else than hermes JSON (GLM's XML-like arguments)
    assert detect_tool_format("{{ '<tool_call>' + name + '<arg_key>' }}") == "json"


# --- validation --------------------------------------------------------------------------------

def _fn(**fn) -> list[dict]:
    return [{"type": "function", "function": fn}]


BAD_TOOLS = [
    ("not a list", {"type": "function"}, "tools", "array"),
    ("empty", [], "tools", "must not be empty"),
    ("entry not an object", ["get_weather"], "tools[0]", "must be an object"),
    ("wrong type", [{"type": "retrieval", "function": {"name": "f"}}], "tools[0].type",
     "'function'"),
    ("no function", [{"type": "function"}], "tools[0].function", "must be an object"),
    ("no name", _fn(parameters={}), "tools[0].function.name", "got None"),
    ("bad name", _fn(name="get weather"), "tools[0].function.name", "'get weather'"),
    ("long name", _fn(name="f" * 65), "tools[0].function.name", "1 to 64"),
    ("duplicate", _fn(name="f") + _fn(name="f"), "tools[1].function.name", "defined twice"),
    ("description", _fn(name="f", description=3), "tools[0].function.description", "string"),
    ("parameters not object", _fn(name="f", parameters="x"), "tools[0].function.parameters",
     "JSON schema object"),
    ("parameters not type object", _fn(name="f", parameters={"type": "string"}),
     "tools[0].function.parameters", "type 'object'"),
    ("unknown keyword", _fn(name="f", parameters={"type": "object", "propertise": {}}),
     "tools[0].function.parameters", "'propertise'"),
    ("strict", _fn(name="f", strict="yes"), "tools[0].function.strict", "boolean"),
]


@pytest.mark.parametrize("tools, param, words", [b[1:] for b in BAD_TOOLS],
                         ids=[b[0] for b in BAD_TOOLS])
def test_malformed_tools_name_the_field(tools, param, words) -> None:
    with pytest.raises(InvalidRequestError) as e:
        validate_tools(tools)
    assert e.value.param == param and words in str(e.value), str(e.value)


def test_unsupported_parameters_are_refused_when_the_grammar_is_built() -> None:
    tools = validate_tools(_fn(name="f", parameters={
        "type": "object", "properties": {"xs": {"type": "array", "contains": {"type": "string"}}}}))
    with pytest.raises(InvalidRequestError) as e:
        tool_call_grammar(tools, "required", "json")
    assert e.value.param == "tools" and "'f'" in str(e.value)
    assert "contains" in str(e.value)


def test_tool_choice() -> None:
    assert validate_tool_choice(None, CHECKED) == "auto"
    for c in ("auto", "none", "required"):
        assert validate_tool_choice(c, CHECKED) == c
    named = validate_tool_choice({"type": "function", "function": {"name": "add"}}, CHECKED)
    assert named.name == "add"
    for bad, words in (({"type": "function", "function": {"name": "nope"}}, "'nope'"),
                       ("sometimes", "'sometimes'"), (3, "must be 'auto'"),
                       ({"type": "function"}, "must be 'auto'")):
        with pytest.raises(InvalidRequestError) as e:
            validate_tool_choice(bad, CHECKED)
        assert e.value.param == "tool_choice" and words in str(e.value)
    with pytest.raises(InvalidRequestError, match="tool_choice needs tools"):
        plan_tools([{"role": "user", "content": "hi"}], None, "required")
    assert plan_tools([{"role": "user", "content": "hi"}], None) is None
    with pytest.raises(InvalidRequestError) as e:
        plan_tools([{"role": "user", "content": "hi"}], TOOLS, parallel_tool_calls="yes")
    assert e.value.param == "parallel_tool_calls"


# --- plans and prompts -------------------------------------------------------------------------

HISTORY = [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}},
        {"id": "call_2", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Rome", "unit": "celsius"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "24 C, cloudy"},
    {"role": "user", "content": "And in Oslo?"},
]


def test_fallback_plan_describes_the_tools_and_rewrites_the_history(gemma: Chat) -> None:
    plan = plan_tools(HISTORY, TOOLS, "auto", gemma.template.source)
    assert plan.format == "json" and plan.template_tools is None and plan.grammar is None
    system, user, assistant, results = plan.messages
    assert system["role"] == "system" and system["content"] == tools_prompt(CHECKED, "auto")
    assert '"name": "book_meeting"' in system["content"]
    assert "tool_calls" not in assistant
    assert [json.loads(line) for line in assistant["content"].splitlines()] == [
        {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
        {"name": "get_weather", "arguments": {"city": "Rome", "unit": "celsius"}}]
    assert results == {"role": "user", "content": "Result of call_1: 18 C, sunny\n"
                       "Result of call_2: 24 C, cloudy\n\nAnd in Oslo?"}
    # Gemma's template demands alternating turns: results and question share one turn
    prompt = gemma.template.render(plan.messages)
    assert prompt.count("<start_of_turn>user") == 2 and "Result of call_2" in prompt
    # a system message of the caller's own is kept, the tools added after it
    plan = plan_tools([{"role": "system", "content": "Be brief."}] + HISTORY[:1], TOOLS,
                      "required", gemma.template.source)
    assert plan.messages[0]["content"].startswith("Be brief.\n\nYou can call")
    assert "Call one of these functions now" in plan.messages[0]["content"]


def test_native_plan_passes_the_tools_to_the_template(smollm: Chat) -> None:
    qwen = ChatTemplate.for_tokenizer(smollm.tokenizer, override=QWEN)
    plan = plan_tools(HISTORY, TOOLS, "auto", qwen.source)
    assert plan.format == "hermes" and plan.template_tools == [t.as_openai() for t in CHECKED]
    assert plan.messages[0] == HISTORY[0]  # no prompt of ours
    # the template applies tojson to arguments: they are objects now, not JSON text
    assert plan.messages[1]["tool_calls"][0]["function"]["arguments"] == {
        "city": "Paris", "unit": "celsius"}
    prompt = qwen.render(plan.messages, tools=plan.template_tools)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", ' in prompt
    assert "<tool_response>\n24 C, cloudy\n</tool_response>" in prompt
    assert '"name": "book_meeting"' in prompt  # the tools, in Qwen's own words
    # with tool_choice none the model is not told about the tools and no call is read
    plan = plan_tools(HISTORY, TOOLS, "none", qwen.source)
    assert plan.template_tools is None and plan.grammar is None
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert plan.parse(text) == ParsedReply(text, [])


def test_bad_history_names_the_message() -> None:
    bad = [{"role": "assistant", "tool_calls": [{"function": {"name": "f",
                                                              "arguments": "{oops"}}]}]
    with pytest.raises(InvalidRequestError) as e:
        plan_tools(bad, TOOLS)
    assert e.value.param == "messages[0].tool_calls[0].function.arguments"
    with pytest.raises(InvalidRequestError) as e:
        plan_tools([{"role": "assistant", "tool_calls": "x"}], TOOLS)
    assert e.value.param == "messages[0].tool_calls"


# --- parsing -----------------------------------------------------------------------------------

REPLIES = [  # (format, reply, content, [(name, arguments)])
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
     '{"city": "Paris", "unit": "celsius"}}\n</tool_call>\n<tool_call>\n{"name": "add", '
     '"arguments": {"a": 1, "b": 2}}\n</tool_call>',
     "Let me check.", [("get_weather", '{"city": "Paris", "unit": "celsius"}'),
                       ("add", '{"a": 1, "b": 2}')]),
    ("hermes", "No tools needed: 1 < 2 and <tool is not a tag.",
     "No tools needed: 1 < 2 and <tool is not a tag.", []),
    ("hermes", '<tool_call>\n{"arguments": {"a": 5, "b": 6}, "name": "add"}\n</tool_call>',
     None, [("add", '{"a": 5, "b": 6}')]),  # keys in the other order: taken whole
    ("hermes", '<tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call> done',
     '<tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call> done', []),  # unknown
    ("hermes", '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}',
     None, [("add", '{"a": 1, "b": 2}')]),  # no closing tag (stopped at it)
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "celsius"}}',
     None, [("get_weather", '{"city": "Oslo", "unit": "celsius"}')]),
    ("llama3", '<|python_tag|>{"name": "add", "parameters": {"a": 3, "b": 4}}',
     None, [("add", '{"a": 3, "b": 4}')]),
    ("llama3", "It is sunny in Oslo.", "It is sunny in Oslo.", []),
    ("json", '{"name": "add", "arguments": {"a": 3, "b": {"note": "} \\" {"}}}',
     None, [("add", '{"a": 3, "b": {"note": "} \\" {"}}')]),  # braces inside strings
    ("json", '{"city": "Paris"}', '{"city": "Paris"}', []),  # JSON, but not a call
    ("json", 'Sure! {"name": "add"}', 'Sure! {"name": "add"}', []),
    ("json", '{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}',
     None, [("add", '{"a": 1, "b": 2}')]),  # arguments as a JSON string
    ("json", '{"name": "add", "arguments": {"a": 1, "b": 2}}\n{"name": "get_weather", '
     '"arguments": {"city": "X", "unit": "celsius"}}',
     None, [("add", '{"a": 1, "b": 2}'), ("get_weather", '{"city": "X", "unit": "celsius"}')]),
    ("json", "  \n  ", None, []),
]
# cut off by max_tokens inside a call: the call is left out, never half an object
CUT_OFF = [  # (format, reply, content, [(name, arguments)] of the complete calls)
    ("json", '{"name": "add", "arguments": {"a": 1, "b', None, []),
    ("json", '{"name": "add", "arguments": "{\\"a\\": 1', None, []),  # string-encoded
    ("json", '{"name": "ad', None, []),  # inside the name
    ("json", '{"name": "add", "arguments": {"a": 1, "b": 2}}\n{"name": "get_weather", '
     '"arguments": {"city": "Pa', None, [("add", '{"a": 1, "b": 2}')]),
    ("hermes", 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
     '</tool_call>\n<tool_call>\n{"name": "get_weather", "argu', "Sure.",
     [("add", '{"a": 1, "b": 2}')]),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Oslo"', None, []),
]


@pytest.mark.parametrize("fmt, text, content, calls", REPLIES)
def test_replies_parse_into_content_and_calls(fmt, text, content, calls) -> None:
    reply = parse_tool_calls(text, fmt, CHECKED)
    assert reply.content == content
    assert [(c.name, c.arguments) for c in reply.tool_calls] == calls
    assert all(CALL_ID.fullmatch(c.id) for c in reply.tool_calls)
    assert reply.finish_reason("stop") == ("tool_calls" if calls else "stop")
    # out of tokens after the last complete call: the calls are made
    assert reply.finish_reason("length") == ("tool_calls" if calls else "length")
    assert not reply.truncated and reply.detail() is None
    message = reply.message()
    assert message["role"] == "assistant" and message["content"] == content
    assert ("tool_calls" in message) == bool(calls)


@pytest.mark.parametrize("fmt, text, content, calls", CUT_OFF)
def test_a_call_cut_off_is_left_out_and_the_reply_says_so(fmt, text, content, calls) -> None:
    for chunks in ([text], list(text)):  # whole, and streamed a character at a time
        parser, deltas = _stream(fmt, chunks)
        reply = parser.result()
        assert reply.content == content and reply.truncated
        assert [(c.name, c.arguments) for c in reply.tool_calls] == calls
        assert [(n, a) for _, n, a in _accumulate(deltas)[1]] == calls
        for c in reply.tool_calls:
            json.loads(c.arguments)  # whole JSON
        assert reply.finish_reason("length") == "length"
        assert "ran out inside a tool call" in reply.detail()


def test_a_repeated_call_is_dropped_and_ends_the_reply() -> None:
    one = '{"name": "add", "arguments": {"a": 1, "b": 2}}'
    other = '{"name": "add", "arguments": {"a": 3, "b": 4}}'
    parser = ToolCallParser("json", CHECKED)
    deltas = parser.feed(one + "\n" + other)
    assert not parser.repeated
    deltas += parser.feed("\n" + one.replace(": ", ":"))  # the same call, spaced otherwise
    assert parser.repeated
    deltas += parser.finish()
    reply = parser.result()
    assert [json.loads(c.arguments)["a"] for c in reply.tool_calls] == [1, 3]
    assert len(_accumulate(deltas)[1]) == 2
    assert reply.finish_reason("stop") == "tool_calls" and not reply.truncated


def _accumulate(deltas: list[dict]) -> tuple[str | None, list[tuple[str, str, str]]]:
    """What an OpenAI client makes of the stream: content joined, calls by index."""
    content = "".join(d["content"] for d in deltas if "content" in d)
    calls: dict[int, list[str]] = {}
    for d in deltas:
        for tc in d.get("tool_calls", []):
            if "id" in tc:
                assert tc["index"] == len(calls) and tc["type"] == "function"
                calls[tc["index"]] = [tc["id"], tc["function"]["name"], ""]
            calls[tc["index"]][2] += tc["function"].get("arguments", "")
    return content or None, [tuple(calls[i]) for i in sorted(calls)]


def _stream(fmt: str, chunks: list[str]) -> tuple[ToolCallParser, list[dict]]:
    parser = ToolCallParser(fmt, CHECKED)
    deltas = []
    for chunk in chunks:
        deltas += parser.feed(chunk)
    deltas += parser.finish()
    return parser, deltas


@pytest.mark.parametrize("fmt, text, content, calls", REPLIES)
def test_streamed_deltas_add_up_to_the_parsed_reply(fmt, text, content, calls) -> None:
    parser, deltas = _stream(fmt, list(text))  # one character at a time
    got_content, got_calls = _accumulate(deltas)
    reply = parser.result()
    assert got_content == reply.content == content
    assert got_calls == [(c.id, c.name, c.arguments) for c in reply.tool_calls]
    assert [(n, a) for _, n, a in got_calls] == calls


def test_a_call_streams_once_its_arguments_are_whole() -> None:
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 30}}\n</tool_call>'
    parser = ToolCallParser("hermes", CHECKED)
    assert parser.feed(text[:text.index("}")]) == []  # held back: it might be cut off
    (delta,) = parser.feed(text[text.index("}"):])
    assert delta["tool_calls"][0]["function"] == {"name": "add",
                                                  "arguments": '{"a": 12, "b": 30}'}
    assert not parser.finish()


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(REPLIES), st.lists(st.integers(0, 200), max_size=8))
def test_any_chunking_gives_the_same_reading(reply, cuts) -> None:
    fmt, text, content, calls = reply
    points = sorted({min(c, len(text)) for c in cuts})
    chunks = [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]
    parser, deltas = _stream(fmt, chunks)
    got_content, got_calls = _accumulate(deltas)
    assert got_content == content and [(n, a) for _, n, a in got_calls] == calls


# --- constrained calls on the real models -----------------------------------------------------

# Each format on one model (the full cross, both temperatures, three questions, is in
# benchmarks/check_structured.py); only the tools a question needs, to keep prompts short.
@pytest.mark.parametrize("model, fmt, choice, tool, temp", [
    ("smollm", "json", "required", 0, 0.0),
    ("gemma", "json", "named", 1, 0.8),
    ("smollm", "hermes", "named", 2, 0.8),
    ("gemma", "llama3", "required", 0, 0.0)])
def test_required_and_named_calls_are_valid(request, model, fmt, choice, tool, temp) -> None:
    chat: Chat = request.getfixturevalue(model)
    template = {"json": chat.template,
                "hermes": ChatTemplate.for_tokenizer(chat.tokenizer, override=QWEN),
                "llama3": ChatTemplate.for_tokenizer(chat.tokenizer, override=LLAMA31)}[fmt]
    name = TOOLS[tool]["function"]["name"]
    tools = [TOOLS[tool], TOOLS[(tool + 1) % len(TOOLS)]]
    if choice == "named":
        choice = {"type": "function", "function": {"name": name}}
    plan = plan_tools([{"role": "user", "content": TOOL_QUESTIONS[tool]}], tools, choice,
                      template.source, parallel_tool_calls=False)
    assert plan.format == fmt and plan.grammar is not None
    run = chat.run(chat.prompt(plan.messages, template, plan.template_tools), plan.grammar,
                   temp=temp, max_tokens=128)
    assert run.stop == "eos", run.text
    reply = plan.parse(run.text)
    assert reply.finish_reason("stop") == "tool_calls" and reply.content is None
    (call,) = reply.tool_calls
    if isinstance(choice, dict):
        assert call.name == name
    jsonschema.validate(json.loads(call.arguments), tool_parameters(call.name))
    # the stream of the same text gives the same call
    parser, deltas = _stream(fmt, [run.text[i:i + 3] for i in range(0, len(run.text), 3)])
    assert [(n, a) for _, n, a in _accumulate(deltas)[1]] == [(call.name, call.arguments)]


def test_parallel_calls_grammar_allows_several(smollm: Chat) -> None:
    plan = plan_tools([{"role": "user", "content": "Weather in Paris and in Rome?"}], TOOLS,
                      {"type": "function", "function": {"name": "get_weather"}},
                      QWEN.read_text(), parallel_tool_calls=True)
    c = Constraint(plan.grammar, smollm.tokenizer)
    one = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
           '"celsius"}}\n</tool_call>')
    for t in smollm.tokenizer.encode(one + "\n" + one.replace("Paris", "Rome"),
                                     add_special=False):
        c.accept(t)
    assert c.is_accepting()
    reply = plan.parse(one + "\n" + one.replace("Paris", "Rome"))
    assert [json.loads(c.arguments)["city"] for c in reply.tool_calls] == ["Paris", "Rome"]
