"""Forced calls in each family's own syntax (``chatformat/call_grammars*.py``), checked as a
round trip through the family's own parser, for every reference chat template whose family
has a grammar (../shared/reference/chat, llama.cpp's templates):

1. the real calls in the reference replies (those llama.cpp parsed into tool calls) are
   accepted by the grammar built for the reference's tools;
2. random walks through the grammar on a real tokenizer (each step a token drawn uniformly
   among those llguidance allows, until the grammar accepts) give text that
   ``ChatFormat.parse`` turns into calls of the offered functions whose arguments validate
   against their schemas: one call, or with ``parallel`` one or more.

The grammars are made the way a request makes them (``engine.tools.native_call_grammar``,
which bounds the schemas and sets llguidance's JSON options), and spelled with the model's
``Speller``.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from functools import cache
from pathlib import Path

import jsonschema
import llguidance
import numpy as np
import pytest

from gguflm.chatformat import ChatFormat
from gguflm.chatformat.call_grammars import call_grammar, families_with_forced_calls
from gguflm.chatformat.reply import opened_tail
from gguflm.chatplan import Speller
from gguflm.engine.constraints import ll_tokenizer
from gguflm.engine.errors import InvalidRequestError
from gguflm.engine.tools import NativeCalls, native_call_grammar, validate_tools
from gguflm.tokenizer import Tokenizer

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference"
CHAT = REFERENCE / "chat"
VOCABS = {"qwen35": REFERENCE / "arch" / "qwen35" / "tiny-qwen35-f16.gguf",
          "gpt-oss": REFERENCE / "arch" / "gpt-oss" / "tiny-gpt-oss-f16.gguf"}
ASK = [{"role": "user", "content": "Book me a table and tell me the weather."}]

WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 12},
                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 9}},
           "required": ["city", "unit", "days"], "additionalProperties": False}
BOOK = {"type": "object",
        "properties": {"where": {"type": "object",
                                 "properties": {"city": {"type": "string", "maxLength": 8},
                                                "zip": {"type": "integer", "minimum": 0,
                                                        "maximum": 99999}},
                                 "required": ["city"], "additionalProperties": False},
                       "guests": {"type": "array", "maxItems": 3,
                                  "items": {"type": "string", "maxLength": 6}},
                       "note": {"type": "string", "maxLength": 10},
                       "seats": {"type": "integer", "minimum": -3, "maximum": 40}},
        "required": ["where", "guests"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "book_table", "description": "Book",
                                           "parameters": BOOK}}]
SCHEMAS = {"get_weather": WEATHER, "book_table": BOOK}
SEEDS = range(8)
MAX_STEPS = 1500
# the marker that ends a call where the reference replies stop before it (they are cut at
# the family's first stop marker)
CUT_END = {"harmony": "<|call|>"}
# families whose replies hold one call (Harmony: each call is a message of its own, ended
# by <|call|>; the sample's last is the tail the grammar takes)
ONE_CALL = {"harmony", "gigachat3", "gigachat3.1", "functionary-v3.2"}
# what a walk starts with where the grammar's own reasoning (Harmony's analysis message)
# is free text up to a marker that this vocabulary spells in several tokens, which a
# uniform walk would hardly ever write: one walk in two gives the analysis, then the call
WALK_START = {"harmony": ("<|channel|>analysis<|message|>Checking.<|end|><|start|>assistant",
                          "<|channel|>commentary"),
              "gemma4": ("<|channel>thought\nChecking.<channel|>", "<|tool_call>"),
              "gemma4-legacy": ("<|channel>thought\nChecking.<channel|>", "<|tool_call>"),
              "minimax-m3": ("<mm:think>Checking.</mm:think>", "]<]minimax[>[<tool_call>"),
              "kimi-k3": ("Checking.<|close|>think<|sep|>", "<|close|>think<|sep|>"),
              "muse-glimmer": (" to=self<|message|>Checking.<|eom|><|start|>assistant",
                               " to=get_weather", " to=book_table")}


def _templates() -> list[str]:
    if not CHAT.is_dir():
        return []
    forced = set(families_with_forced_calls())
    return [p.stem for p in sorted(CHAT.glob("*.jinja"))
            if ChatFormat(p.read_text()).name in forced]


TEMPLATES = _templates()


@cache
def _vocab(name: str) -> tuple[Tokenizer, llguidance.LLTokenizer, Speller]:
    if not VOCABS[name].is_file():
        pytest.skip(f"{VOCABS[name]} not found (../shared/reference/arch)")
    tok = Tokenizer.from_file(VOCABS[name])
    return tok, ll_tokenizer(tok), Speller(tok)


@cache
def _format(template: str) -> ChatFormat:
    """The template's chat format; a template that cannot write calls in its history
    (Granite 3.3, the R1 distills) has its calls read as if it could, since it is the
    family's syntax that is checked here."""
    fmt = ChatFormat((CHAT / f"{template}.jinja").read_text())
    if not fmt.family.template_calls:
        fmt.family = dataclasses.replace(fmt.family, template_calls=True)
    return fmt


def _grammar(fmt: ChatFormat, tools: list, parallel: bool, speller: Speller) -> str:
    native = NativeCalls(fmt.name, lambda functions, par: call_grammar(
        fmt.name, functions, par, speller))
    grammar = native_call_grammar(validate_tools(tools), "required", parallel, native)
    assert grammar is not None
    return grammar.ll_grammar


def _matcher(ll: llguidance.LLTokenizer, grammar: str) -> llguidance.LLMatcher:
    m = llguidance.LLMatcher(ll, grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    return m


def _accepts(tok: Tokenizer, ll: llguidance.LLTokenizer, grammar: str, text: str,
             markers: dict[str, int] | None = None) -> bool:
    m = _matcher(ll, grammar)
    return m.consume_tokens(_encode(tok, text, markers or {})) and m.is_accepting()


def _parse(fmt: ChatFormat, text: str, tools: list) -> list[dict]:
    """The calls ``fmt`` reads in ``text`` (the thinking block closed first where the
    generation prompt opened it: the grammar follows the reasoning)."""
    start, end = fmt.family.think
    if fmt.family.reader is None and start and end and opened_tail(
            fmt.generation_prompt(ASK, tools), start, end) is not None:
        text = end + text
    return fmt.parse(text, ASK, tools)["tool_calls"]


@cache
def _pieces(name: str) -> list[bytes]:
    tok = _vocab(name)[0]
    return [tok.token_to_piece(t, special=True) for t in range(tok.n_vocab)]


def _walk(vocab: str, grammar: str, seed: int, parallel: bool, start: str = "",
          markers: dict[str, int] | None = None) -> str:
    """Tokens drawn at random among those the grammar allows until it accepts (with
    ``parallel``, stopping there only half the time, so that more calls come). Each step
    draws a first byte uniformly among the allowed tokens' first bytes, then a token
    with it: where the grammar chooses between going on (``,``: many tokens) and closing
    (``]``: few), both are as likely, so walks end. ``start``: text given first;
    ``markers``: texts that are one special token each (their ids)."""
    tok, ll, _ = _vocab(vocab)
    pieces = list(_pieces(vocab))
    for text, i in (markers or {}).items():
        pieces[i] = text.encode()
    rng = random.Random(seed)
    m = _matcher(ll, grammar)
    assert m.consume_tokens(_encode(tok, start, markers or {}))
    eos = set(tok.eog_ids)
    bits = np.zeros((ll.vocab_size + 31) // 32, dtype=np.int32)
    out = start.encode()
    for step in range(MAX_STEPS):
        if m.is_accepting() and (not parallel or rng.random() < 0.5 or step > MAX_STEPS // 3):
            break
        m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        allowed = [t for t in np.flatnonzero(np.unpackbits(bits.view(np.uint8),
                                                           bitorder="little"))
                   if t < tok.n_vocab and t not in eos]
        if not allowed:
            break
        first = rng.choice(sorted({pieces[t][:1] for t in allowed}))
        t = int(rng.choice([t for t in allowed if pieces[t][:1] == first]))
        assert m.consume_token(t), m.get_error()
        out += pieces[t]
    assert m.is_accepting(), f"no accepting state after {MAX_STEPS} tokens: {out!r}"
    return out.decode("utf-8")


def _encode(tok: Tokenizer, text: str, markers: dict[str, int]) -> list[int]:
    """``text``'s tokens, each of ``markers`` as its one special token."""
    if not markers:
        return tok.encode(text, add_special=False, parse_special=True)
    parts = re.split("(" + "|".join(map(re.escape, markers)) + ")", text)
    return [t for i, part in enumerate(parts) for t in (
        [markers[part]] if i % 2 else tok.encode(part, add_special=False) if part else [])]


def _samples(template: str) -> list[tuple[dict, str]]:
    """The reference replies with calls (not cut off): request and reply."""
    data = json.loads((CHAT / f"{template}.json").read_text())
    return [(p, p["input"]) for p in data["parses"]
            if p["request"].get("tools") and not p["is_partial"]
            and "error" not in p["expected"] and p["expected"].get("tool_calls")]


def _call_suffix(tok, ll, grammar: str, text: str) -> str | None:
    """The longest tail of ``text`` the grammar accepts whole (the call, less the
    reasoning and content before it)."""
    for at in range(len(text)):
        tail = text[at:].rstrip()
        if tail and _accepts(tok, ll, grammar, tail):
            return tail
    return None


# families whose content sits in a section the call grammar does not write (a forced call
# has no content), so a reply with content has no tail that is a call alone
CONTENT_INSIDE = {"kimi-k3"}


@pytest.mark.parametrize("template", TEMPLATES)
def test_reference_calls_are_accepted(template: str) -> None:
    tok, ll, speller = _vocab("qwen35")
    fmt = _format(template)
    samples = _samples(template)
    if not samples:
        pytest.skip(f"{template}: llama.cpp parsed no calls in its reference replies")
    for case, text in samples:
        if fmt.name in CONTENT_INSIDE and case["expected"]["content"]:
            continue
        tools = case["request"]["tools"]
        grammar = _grammar(fmt, tools, True, speller)
        end = CUT_END.get(fmt.name, "")
        if end:  # the first call, ended by its marker
            text = text.split(end)[0] + end
        tail = _call_suffix(tok, ll, grammar, text)
        assert tail is not None, (case["name"], text)
        got = _parse(fmt, tail, tools)
        got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got]
        want = [(c["name"], json.loads(c["arguments"])) for c in case["expected"]["tool_calls"]]
        if fmt.name in ONE_CALL:
            assert len(got) == 1 and got[0] in want, (case["name"], tail)
        else:
            assert got == want, (case["name"], tail)


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("template", TEMPLATES)
def test_random_walks_parse_into_valid_calls(template: str, parallel: bool) -> None:
    _check_walks(template, parallel, "qwen35", SEEDS)


@pytest.mark.parametrize("template", TEMPLATES)
def test_random_walks_on_another_vocabulary(template: str) -> None:
    """The same on gpt-oss's (Llama 3 BPE) vocabulary: other tokens, other splits."""
    _check_walks(template, False, "gpt-oss", range(3))


def _check_walks(template: str, parallel: bool, vocab: str, seeds: range) -> None:
    speller = _vocab(vocab)[2]
    fmt = _format(template)
    grammar = _grammar(fmt, TOOLS, parallel, speller)
    most = 0
    for seed in seeds:
        starts = WALK_START.get(fmt.name, ("",))
        text = _walk(vocab, grammar, seed, parallel, starts[seed % len(starts)])
        calls = _parse(fmt, text, TOOLS)
        assert calls if parallel else len(calls) == 1, (seed, text, calls)
        for call in calls:
            name = call["function"]["name"]
            assert name in SCHEMAS, (seed, text)
            jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])
        most = max(most, len(calls))
    if parallel and fmt.name not in ONE_CALL:  # some walk wrote several, all read back
        assert most > 1, template


# markers that are special tokens in the families' real vocabularies, spelled here as the
# gpt-oss reference vocabulary's spare special tokens: a grammar must then name them as
# tokens (llguidance takes none inside a lexeme, so free text ends where they come)
SPECIAL_MARKERS = {
    "openai-gpt-oss-120b": ("<|end|>", "<|call|>", "<|channel|>"),
    "google-gemma-4-31B-it-interleaved": ('<|"|>', "<channel|>", "<tool_call|>"),
    "Kimi-K3": ("<|close|>", "<|sep|>", "<|open|>"),
    "MiniMax-M3": ("]<]minimax[>[",),
    "mistralai-Ministral-3-14B-Reasoning-2512": ("[TOOL_CALLS]", "[ARGS]"),
    "Mistral-Small-3.2-24B-Instruct-2506": ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"),
    "Qwen3-Coder": ("<tool_call>", "</tool_call>"),
}


class _MarkerSpeller(Speller):
    """The gpt-oss vocabulary's speller, with ``markers`` as special tokens."""

    def __init__(self, tok: Tokenizer, markers: dict[str, int]) -> None:
        super().__init__(tok)
        self.ids = markers
        names = sorted(markers, key=len, reverse=True)
        self.split = re.compile("(" + "|".join(map(re.escape, names)) + ")")


@pytest.mark.parametrize("template", [t for t in SPECIAL_MARKERS if t in TEMPLATES])
def test_markers_as_special_tokens(template: str) -> None:
    tok = _vocab("gpt-oss")[0]
    spare = [i for i in sorted(_vocab("gpt-oss")[2].ids.values()) if i not in tok.eog_ids]
    markers = dict(zip(SPECIAL_MARKERS[template], spare, strict=False))
    speller = _MarkerSpeller(tok, markers)
    fmt = _format(template)
    ll = _vocab("gpt-oss")[1]
    for case, text in _samples(template)[:2]:
        grammar = _grammar(fmt, case["request"]["tools"], True, speller)
        text = text.split(CUT_END[fmt.name])[0] + CUT_END[fmt.name] \
            if fmt.name in CUT_END else text
        tails = [text[at:].rstrip() for at in range(len(text))]
        assert any(_accepts(tok, ll, grammar, t, markers) for t in tails if t), case["name"]
    grammar = _grammar(fmt, TOOLS, True, speller)
    for seed in range(3):
        starts = WALK_START.get(fmt.name, ("",))
        text = _walk("gpt-oss", grammar, seed, True, starts[seed % len(starts)], markers)
        calls = _parse(fmt, text, TOOLS)
        assert calls, (seed, text)
        for call in calls:
            name = call["function"]["name"]
            jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])


@pytest.mark.parametrize(("template", "parameters"), [
    ("google-gemma-4-31B-it-interleaved",
     {"type": "object", "properties": {"x": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}),
    ("LFM2-8B-A1B", {"type": "object", "properties": {"two words": {"type": "string"}}}),
    ("GLM-4.6", {"type": "object", "properties": {"a<b": {"type": "integer"}}}),
])
def test_schema_the_syntax_cannot_hold_is_refused(template: str, parameters: dict) -> None:
    """A schema the family's notation cannot spell as the parser reads it back is a 400
    naming tool_choice, not a grammar that writes something else."""
    if template not in TEMPLATES:
        pytest.skip(f"{template} not found")
    tools = [{"type": "function", "function": {"name": "f", "parameters": parameters}}]
    with pytest.raises(InvalidRequestError) as e:
        _grammar(_format(template), tools, False, _vocab("qwen35")[2])
    assert e.value.param == "tool_choice"
