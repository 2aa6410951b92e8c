"""A request's constraint as a checked grammar: JSON Schema, GBNF, Lark or regex.

``constraint_from_request`` reads the constraint fields of a request (OpenAI
``response_format``, llama-server's ``json_schema`` and ``grammar``, ``regex``, ``lark``)
and returns a ``Grammar`` that llguidance accepted, or raises ``ConstraintError`` naming the
request field and the problem. Nothing is ignored: llguidance's ``lenient`` and
``coerce_one_of`` are forced off (an unimplemented keyword, an unknown ``format`` or a
``oneOf`` not provably an ``anyOf`` is an error), unknown keywords are refused
(``schema.check_schema``) and grammar warnings are errors. Before llguidance sees a grammar
its size is bounded (``check_grammar_size``, ``check_regex_size``, ``check_schema_size``),
and what llguidance says is passed on only through ``client_message`` (never a panic).

JSON whitespace is limited to what llama.cpp's schema grammars allow (one space, or one or
two newlines and an indent of up to 20 spaces/tabs, between tokens), and numbers and
formatted strings to ``schema.bounded_schema``'s lengths, so that a model cannot loop on
whitespace or digits; a schema's own ``x-guidance`` object can change the whitespace.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import llguidance
from llguidance.gbnf_to_lark import is_lark_syntax

from .errors import ConstraintError
from .schema import bounded_schema, check_refs, check_schema, check_unicode, load_schema

if TYPE_CHECKING:
    from ..tokenizer import Tokenizer

__all__ = ["CONSTRAINT_PARAMS", "JSON_WHITESPACE", "MAX_GRAMMAR_BYTES", "MAX_GRAMMAR_NESTING",
           "MAX_GRAMMAR_SYMBOLS", "TOO_COMPLEX", "Grammar", "check_grammar_size",
           "check_regex_size", "check_schema_size", "client_message", "constraint_from_request",
           "gbnf_grammar", "is_panic", "json_schema_grammar", "lark_grammar", "limits_for",
           "llguidance_errors", "one_line", "regex_grammar", "release_memory"]

# the request fields that carry a constraint, in the order they are looked at
CONSTRAINT_PARAMS = ("response_format", "json_schema", "grammar", "regex", "lark")

# llama.cpp's JSON whitespace (json-schema-to-grammar's SPACE_RULE): a space, or a line
# break or two and an indent of at most 20
JSON_WHITESPACE = r"(?: |\n{1,2}[ \t]{0,20})"
_JSON_DEFAULTS = {"whitespace_pattern": JSON_WHITESPACE}
_JSON_STRICT = {"lenient": False, "coerce_one_of": False}

# llguidance's resource limits, tighter than its defaults where a few bytes of grammar could
# cost seconds and hundreds of MB (``(c{1000}){1000}`` with the defaults): the lexer's fuel
# grows with the grammar's text (the work is in proportion to what the client sent), its
# states bound its memory, and errors never carry llguidance's parser state (which echoed
# the grammar and internals back to the client). Figures: docs/security.md.
MIN_LEXER_FUEL = 200_000
LEXER_FUEL_PER_BYTE = 20
MAX_LEXER_STATES = 50_000


# Bounds checked before llguidance sees a grammar, by a linear scan of its text (a schema:
# a walk of its values). llguidance's own limits act only once it has compiled a grammar,
# its work grows faster than the grammar, and past 65,535 symbols its symbol table (u16
# ids) overflows in a Rust panic. So a grammar's bytes (a schema's strings), its symbols
# (rules, alternatives, names, literals, character classes, groups, repetitions; a schema's
# keys and values) and its groups' nesting are bounded, well inside what llguidance takes.
MAX_GRAMMAR_BYTES = 256 * 1024
MAX_GRAMMAR_SYMBOLS = 20_000
MAX_GRAMMAR_NESTING = 100
# what a client reads instead of llguidance's panic text (a Rust backtrace) or an internal
# failure
TOO_COMPLEX = "the grammar is too large or complex for the constraint engine"
MAX_MESSAGE_CHARS = 300  # llguidance's messages quote the grammar's line, however long


def limits_for(ll_grammar: str) -> llguidance.LLParserLimits:
    """The limits a grammar is validated and compiled under (see above)."""
    return llguidance.LLParserLimits(
        initial_lexer_fuel=max(MIN_LEXER_FUEL, LEXER_FUEL_PER_BYTE * len(ll_grammar)),
        max_lexer_states=MAX_LEXER_STATES, verbose_errors=False)


@dataclass(frozen=True)
class Grammar:
    """A checked constraint, ready to be compiled for a tokenizer by ``Constraint``.

    ``kind`` is ``json_schema``, ``gbnf``, ``lark`` or ``regex``; ``ll_grammar`` llguidance's
    grammar (serialised); ``param`` the request field it came from (for errors);
    ``schema`` the JSON schema for ``json_schema`` grammars (to validate outputs with);
    ``check_seconds`` the time conversion and validation took."""

    kind: str
    ll_grammar: str
    param: str
    schema: Any = None
    check_seconds: float = 0.0


def one_line(message: str) -> str:
    """llguidance's multi-line messages (regex errors draw a caret line) on one line."""
    lines = [ln.strip() for ln in str(message).splitlines()]
    return "; ".join(ln for ln in lines if ln and set(ln) - set("^ |~0123456789"))


# the marks of a Rust panic (its message, the backtrace pyo3 or llguidance attach to it)
_PANIC = re.compile(r"\bpanic(?:ked)?\b|<backtrace>|stack backtrace|assertion failed|"
                    r"RUST_BACKTRACE|^\s*\d+: (?:<unknown>|0x[0-9a-f]+)|^\s*at \S+\.rs:\d+",
                    re.I | re.M)
_GBNF_PREFIX = "Failed to convert the grammar from GBNF to Lark: "


def client_message(message: Any) -> str:
    """An llguidance message as a client may read it: on one line, at most 300 characters,
    and never a panic's text or backtrace (``TOO_COMPLEX`` instead)."""
    text = str(message)
    if _PANIC.search(text):
        return TOO_COMPLEX
    text = one_line(text).removeprefix(_GBNF_PREFIX)
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS - 3] + "..."


def is_panic(e: BaseException) -> bool:
    """pyo3's PanicException (a Rust panic that reached Python), a BaseException."""
    return type(e).__name__ == "PanicException"


@contextmanager
def llguidance_errors(param: str, what: str) -> Iterator[None]:
    """Around a call into llguidance: its exceptions (ValueError for a grammar it cannot
    read, pyo3's PanicException, RecursionError from its Python GBNF converter) as a
    ConstraintError naming ``param``, in ``client_message``'s words."""
    try:
        yield
    except ConstraintError:
        raise
    except (ValueError, TypeError, RuntimeError) as e:
        raise ConstraintError(f"invalid {what}: {client_message(e)}", param=param) from None
    except BaseException as e:
        if not is_panic(e):
            raise
        raise ConstraintError(f"invalid {what}: {TOO_COMPLEX}", param=param) from None


def _validate(ll_grammar: str, param: str, what: str,
              tokenizer: Tokenizer | None = None) -> None:
    ll = None
    if tokenizer is not None:
        from .constraints import ll_tokenizer  # (it imports this module)

        ll = ll_tokenizer(tokenizer)
    try:
        with llguidance_errors(param, what):
            is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
                ll_grammar, ll, limits=limits_for(ll_grammar))
    finally:
        if len(ll_grammar) > 2**16:  # what checking a big grammar took, given back
            release_memory()
    if ll is None:  # special token names are checked once compiled for a vocabulary
        messages = [m for m in messages if "no tokenizer" not in m]
    if messages:  # a warning is something llguidance ignored or changed: refused as well
        msg = client_message(messages[0])
        if what == "JSON schema" and _unsupported(msg):
            raise ConstraintError(f"unsupported JSON schema feature: {msg}", param=param,
                                  code="unsupported_schema")
        raise ConstraintError(f"invalid {what}: {msg}", param=param)


def release_memory() -> None:
    """Give freed heap memory back to the system (glibc's ``malloc_trim``): llguidance
    frees a big grammar's memory when it is dropped, but glibc keeps it in the arena of the
    thread that compiled it, so a server's resident size would only grow."""
    global _TRIM
    if _TRIM is None:
        import ctypes
        import ctypes.util

        try:
            _TRIM = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _TRIM = False
    if _TRIM:
        _TRIM(0)


_TRIM: Any = None


def _unsupported(msg: str) -> bool:
    return any(s in msg for s in ("Unimplemented", "not supported", "Unknown format",
                                  "is not present in a registry"))


def _timed(kind: str, ll_grammar: str, param: str, t0: float, schema: Any = None) -> Grammar:
    return Grammar(kind, ll_grammar, param, schema, time.perf_counter() - t0)


def json_schema_grammar(schema: Any, param: str = "json_schema",
                        tokenizer: Tokenizer | None = None) -> Grammar:
    """A grammar for JSON values that match ``schema`` (a dict, ``True``, or its JSON text)."""
    t0 = time.perf_counter()
    schema = load_schema(schema, param)
    check_schema_size(schema, param)
    check_schema(schema, param)
    with llguidance_errors(param, "JSON schema"):
        ll = llguidance.LLMatcher.grammar_from_json_schema(
            bounded_schema(schema), defaults=_JSON_DEFAULTS, overrides=_JSON_STRICT)
    _validate(ll, param, "JSON schema", tokenizer)
    return _timed("json_schema", ll, param, t0, schema)


def gbnf_grammar(text: Any, param: str = "grammar",
                 tokenizer: Tokenizer | None = None) -> Grammar:
    """A grammar from llama.cpp GBNF text (Lark text is recognised and taken as it is)."""
    t0 = time.perf_counter()
    text = _text(text, param, "a GBNF grammar")
    check_grammar_size(text, param, lark=is_lark_syntax(text))
    with llguidance_errors(param, "GBNF grammar"):
        ll = llguidance.grammar_from("gbnf", text)
    _validate(ll, param, "grammar", tokenizer)
    return _timed("gbnf", ll, param, t0)


def lark_grammar(text: Any, param: str = "lark", tokenizer: Tokenizer | None = None) -> Grammar:
    """A grammar from llguidance's Lark syntax (``%json {...}`` embeds a JSON schema)."""
    t0 = time.perf_counter()
    text = _text(text, param, "a Lark grammar")
    check_grammar_size(text, param, lark=True)
    with llguidance_errors(param, "Lark grammar"):
        ll = llguidance.LLMatcher.grammar_from_lark(text)
    _validate(ll, param, "Lark grammar", tokenizer)
    return _timed("lark", ll, param, t0)


def regex_grammar(pattern: Any, param: str = "regex",
                  tokenizer: Tokenizer | None = None) -> Grammar:
    """A grammar whose outputs match ``pattern`` as a whole. Rust ``regex`` syntax (no
    look-around or back-references) with ``\\d`` and ``\\w`` meaning ASCII ``[0-9]`` and
    ``[0-9A-Za-z_]``, as in JSON Schema patterns (Rust's are Unicode: ``\\d`` would let a
    model write a date in digits from other scripts)."""
    t0 = time.perf_counter()
    text = _text(pattern, param, "a regular expression")
    check_regex_size(text, param)
    with llguidance_errors(param, "regular expression"):
        plain = llguidance.LLMatcher.grammar_from_regex(text)
    _validate(plain, param, "regular expression")
    with llguidance_errors(param, "regular expression"):
        ll = llguidance.LLMatcher.grammar_from_lark(
            f"start: /{llguidance.regex_to_lark(text, 'dw')}/")
    _validate(ll, param, "regular expression", tokenizer)
    return _timed("regex", ll, param, t0)


def _text(value: Any, param: str, what: str) -> str:
    if not isinstance(value, str):
        raise ConstraintError(f"{param} must be a string ({what}), got {type(value).__name__}",
                              param=param)
    if not value.strip():
        raise ConstraintError(f"{param} is empty", param=param)
    if "\x00" in value:
        raise ConstraintError(f"{param} contains a NUL character", param=param)
    check_unicode(value, param)
    return value


# --- size: bounded before llguidance sees a grammar ------------------------------------------

# one token of a GBNF grammar (llama.cpp's syntax): a comment, space and ``::=`` count for
# nothing; a literal, a character class, a name, ``|`` and a repetition for one symbol each
_GBNF_TOKEN = re.compile(r"""
    (?P<space> \s+ | \#[^\n]* | ::= )
  | (?P<open> \( )
  | (?P<close> \) )
  | (?P<item> "[^"\\]*(?:\\.[^"\\]*)*"? | \[[^\]\\]*(?:\\.[^\]\\]*)*\]? | [\w-]+ | [|*+?{] )
  | (?P<other> . )
""", re.X | re.S)
# one token of a Lark grammar (llguidance's syntax): ``[...]`` is an optional group there,
# ``/.../`` a regex (one lexeme), ``%json`` a JSON schema (sized as one, below). Every
# token that scans ahead may end at the end of the text (or line): no input makes the
# scan go back over what it read
_LARK_TOKEN = re.compile(r"""
    (?P<space> \s+ | //[^\n]* )
  | (?P<json> %json\b )
  | (?P<open> [(\[] )
  | (?P<close> [)\]] )
  | (?P<item> "[^"\\]*(?:\\.[^"\\]*)*"?i? | /[^/\\\n]*(?:\\.[^/\\\n]*)*/?[imslux]*
            | %?[\w.]+ | [|*+?~{] )
  | (?P<other> . )
""", re.X | re.S)
# a regex's parentheses, outside character classes and escapes
_REGEX_TOKEN = re.compile(r"\\.|\[|\]|\(|\)|[^\\\[\]()]+", re.S)
_JSON = json.JSONDecoder()
_SPACE = re.compile(r"\s*")


def _too_large(param: str, what: str) -> ConstraintError:
    return ConstraintError(f"{param} is too large for the constraint engine: {what}",
                           param=param)


def _check_bytes(n: int, param: str) -> None:
    if n > MAX_GRAMMAR_BYTES:
        raise _too_large(param, f"{n / 1024:,.0f} KiB, over the limit of "
                                f"{MAX_GRAMMAR_BYTES // 1024} KiB")


def _symbols_over(param: str) -> ConstraintError:
    return _too_large(param, f"more than {MAX_GRAMMAR_SYMBOLS:,} symbols (rules, "
                             "alternatives, literals, character classes, groups; a schema's "
                             "keys and values)")


def _nested_over(param: str) -> ConstraintError:
    return ConstraintError(f"{param} nests groups more than {MAX_GRAMMAR_NESTING} deep",
                           param=param)


def check_grammar_size(text: str, param: str, lark: bool = False) -> None:
    """Refuse a GBNF (or, ``lark``, Lark) grammar over ``MAX_GRAMMAR_BYTES`` bytes, over
    ``MAX_GRAMMAR_SYMBOLS`` symbols or with groups nested deeper than
    ``MAX_GRAMMAR_NESTING``, by one linear scan of its tokens (strings, classes, regexes
    and comments skipped whole); a Lark ``%json`` schema counts its keys and values and has
    its ``$ref``s checked as a ``json_schema``'s are. A ConstraintError naming ``param``."""
    _check_bytes(len(text.encode("utf-8", "surrogatepass")), param)
    symbols = depth = 0
    pos, end = 0, len(text)
    token = _LARK_TOKEN if lark else _GBNF_TOKEN
    while pos < end:
        m = token.match(text, pos)
        kind, pos = m.lastgroup, m.end()
        if kind == "item":
            symbols += 1
        elif kind == "open":
            symbols, depth = symbols + 1, depth + 1
            if depth > MAX_GRAMMAR_NESTING:
                raise _nested_over(param)
        elif kind == "close":
            depth = max(0, depth - 1)
        elif kind == "json":
            n, pos = _embedded_schema(text, pos, param)
            symbols += n
        if symbols > MAX_GRAMMAR_SYMBOLS:
            raise _symbols_over(param)


def _embedded_schema(text: str, pos: int, param: str) -> tuple[int, int]:
    """The symbols of the JSON schema after a Lark ``%json`` at ``pos``, checked as a
    request's schema is (its $refs: a chain of them overflows llguidance's stack), and
    where it ends; (1, pos) where no JSON follows (llguidance then reports it)."""
    start = _SPACE.match(text, pos).end()
    try:
        schema, after = _JSON.raw_decode(text, start)
    except ValueError:
        return 1, pos
    except RecursionError:
        raise _nested_over(param) from None
    check_refs(schema, param)
    return _json_size(schema, param)[0], after


def check_regex_size(text: str, param: str) -> None:
    """Refuse a regular expression over ``MAX_GRAMMAR_BYTES`` bytes or with parentheses
    nested deeper than ``MAX_GRAMMAR_NESTING`` (its alternatives are one lexeme, a DFA
    built lazily: not symbols). A ConstraintError naming ``param``."""
    _check_bytes(len(text.encode("utf-8", "surrogatepass")), param)
    depth = in_class = 0
    for m in _REGEX_TOKEN.finditer(text):
        t = m.group()
        if t == "[":
            in_class += 1
        elif t == "]" and in_class:
            in_class -= 1
        elif t == "(" and not in_class:
            depth += 1
            if depth > MAX_GRAMMAR_NESTING:
                raise _nested_over(param)
        elif t == ")" and not in_class:
            depth = max(0, depth - 1)


def check_schema_size(schema: Any, param: str) -> None:
    """Refuse a JSON schema whose keys and values number more than ``MAX_GRAMMAR_SYMBOLS``
    (an ``enum`` of 200,000 values is 200,000) or whose strings hold more than
    ``MAX_GRAMMAR_BYTES`` bytes. A ConstraintError naming ``param``."""
    _json_size(schema, param)


def _json_size(value: Any, param: str) -> tuple[int, int]:
    """(keys and values, bytes of the strings) of a JSON value, walked without recursion;
    a ConstraintError as soon as either is over its bound."""
    symbols = size = 0
    stack = [value]
    while stack:
        node = stack.pop()
        symbols += 1
        if isinstance(node, Mapping):
            for key, item in node.items():
                symbols += 1
                size += len(str(key).encode("utf-8", "surrogatepass"))
                stack.append(item)
        elif isinstance(node, list | tuple):
            stack.extend(node)
        elif isinstance(node, str):
            size += len(node.encode("utf-8", "surrogatepass"))
        if symbols > MAX_GRAMMAR_SYMBOLS:
            raise _symbols_over(param)
        if size > MAX_GRAMMAR_BYTES:
            raise _too_large(param, f"its strings hold more than {MAX_GRAMMAR_BYTES // 1024} "
                                    "KiB, the limit")
    return symbols, size


# --- a request's constraint ------------------------------------------------------------------

def constraint_from_request(response_format: Any = None, json_schema: Any = None,
                            grammar: Any = None, regex: Any = None, lark: Any = None, *,
                            tokenizer: Tokenizer | None = None) -> Grammar | None:
    """The grammar a request asks for, or None (no constraint).

    ``response_format``: OpenAI's ``{"type": "text"}`` (none), ``{"type": "json_object"}``
    (any JSON object; a ``schema`` beside it is used, as llama-server does) or
    ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`` (``strict`` is
    accepted either way: the schema is always enforced). ``json_schema``: a schema (dict or
    JSON text), llama-server's field. ``grammar``: GBNF text (llama.cpp's grammars work
    unchanged; Lark text is recognised too). ``regex``: the whole output must match.
    ``lark``: llguidance's Lark syntax. At most one may be given. With ``tokenizer`` the
    grammar is also checked against its vocabulary (special token names).
    Raises ``ConstraintError`` (``param`` set) for anything that cannot be enforced exactly.
    """
    given = {name: value for name, value in zip(
        CONSTRAINT_PARAMS, (response_format, json_schema, grammar, regex, lark))
        if value is not None}
    if "response_format" in given and _format_type(given["response_format"]) == "text":
        del given["response_format"]
    if len(given) > 1:
        first, second = list(given)[:2]
        raise ConstraintError(f"{first} and {second} cannot be combined: give one "
                              f"constraint per request", param=second)
    if not given:
        return None
    (param, value), = given.items()
    if param == "response_format":
        return _response_format(value, tokenizer)
    if param == "json_schema":
        return json_schema_grammar(value, "json_schema", tokenizer)
    if param == "grammar":
        return gbnf_grammar(value, "grammar", tokenizer)
    if param == "regex":
        return regex_grammar(value, "regex", tokenizer)
    return lark_grammar(value, "lark", tokenizer)


_FORMAT_TYPES = ("text", "json_object", "json_schema")


def _format_type(rf: Any) -> str:
    if not isinstance(rf, Mapping):
        raise ConstraintError("response_format must be an object such as "
                              '{"type": "json_object"}', param="response_format")
    kind = rf.get("type")
    if kind not in _FORMAT_TYPES:
        raise ConstraintError(f"response_format.type must be one of {', '.join(_FORMAT_TYPES)}"
                              f", got {kind!r}", param="response_format.type")
    return kind


def _response_format(rf: Mapping[str, Any], tokenizer: Tokenizer | None) -> Grammar:
    if _format_type(rf) == "json_object":
        schema = rf.get("schema")
        if schema is None:
            return json_schema_grammar({"type": "object"}, "response_format", tokenizer)
        return json_schema_grammar(schema, "response_format.schema", tokenizer)
    spec = rf.get("json_schema")
    if not isinstance(spec, Mapping):
        raise ConstraintError('response_format.json_schema must be an object with "name" and '
                              '"schema"', param="response_format.json_schema")
    for key, kinds, what in (("name", str, "a string"), ("strict", bool | type(None), "a boolean"),
                             ("description", str, "a string")):
        if key in spec and not isinstance(spec[key], kinds):
            raise ConstraintError(f"response_format.json_schema.{key} must be {what}",
                                  param=f"response_format.json_schema.{key}")
    schema = spec.get("schema")
    if schema is None:  # OpenAI makes it optional: then any JSON object
        schema = {"type": "object"}
    return json_schema_grammar(schema, "response_format.json_schema.schema", tokenizer)


def after_reasoning(g: Grammar, reasoning: str) -> Grammar:
    """``g`` applied to what follows the reasoning: ``reasoning`` is Lark rules defining the
    rule ``reasoning`` (the family's thinking block, its text lazily matched up to the end
    tag; chatformat/thinking.py writes them). The model thinks freely, then the constrained
    answer starts (llama.cpp's lazy grammars, as llguidance nests one grammar in another)."""
    if g.ll_grammar.lstrip().startswith("{"):
        grammars = json.loads(g.ll_grammar)["grammars"]
    else:
        grammars = [{"lark_grammar": g.ll_grammar}]
    inner = dict(grammars[0], name="answer")
    outer = {"lark_grammar": f"start: reasoning @answer\n{reasoning}"}
    ll = json.dumps({"grammars": [outer, inner, *grammars[1:]]}, ensure_ascii=False)
    return Grammar(g.kind, ll, g.param, g.schema, g.check_seconds)
