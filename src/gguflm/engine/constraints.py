"""Constrained decoding: JSON Schema, GBNF, Lark and regex grammars, enforced with llguidance.

At each step the tokens that cannot continue a valid output are masked (their logits set to
-inf) before sampling, so the output is valid by construction, for every sampler and
temperature. llguidance (the Rust engine llama.cpp can use for grammars) computes the mask
from a byte-level view of our vocabulary:

* ``ll_tokenizer`` builds that view once per ``Tokenizer``: each token's bytes as the model
  writes them (SentencePiece ``▁`` -> space, GPT-2 byte alphabet -> bytes, ``<0xNN>`` byte
  tokens -> the byte); control tokens, which print nothing, are marked special by their text
  (a grammar can name them, ``<|im_end|>``, but no text matches them), as llama.cpp's
  llguidance sampler marks them. All end-of-generation ids are llguidance's EOS set.
* ``constraint_from_request`` turns a request's constraint (OpenAI ``response_format``,
  llama-server's ``json_schema``/``grammar``, ``regex``, ``lark``) into a checked
  ``Grammar``, or raises ``ConstraintError`` naming the parameter and the problem.
* ``Constraint`` is one sequence's matcher: ``mask(logits)`` before sampling, ``accept(id)``
  after. Once the grammar is complete and cannot be extended, only EOS is allowed, so a
  constrained generation ends with EOS (finish_reason "stop") unless max_tokens cuts it.

Strictness: llguidance's ``lenient`` and ``coerce_one_of`` are forced off (an unimplemented
keyword, unknown ``format`` or an unprovable ``oneOf`` is an error, never ignored), and
keywords JSON Schema does not know are refused too (a misspelt ``requried`` would otherwise
be ignored, as the standard says, and silently not enforced), except ``x-`` extensions and a
few harmless annotations (``discriminator``, ``example``). Grammar warnings are errors.

Whitespace in JSON is limited to what llama.cpp's schema grammars allow (one space, or one
or two newlines and up to 20 spaces/tabs of indent, between tokens), so a model cannot loop
on whitespace; a schema's ``x-guidance`` object can change it (llguidance's options).
"""

from __future__ import annotations

import json
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import llguidance
import numpy as np

from ..tokenizer.unicode_data import UNICODE_TO_BYTE
from ..tokenizer.vocab import Attr
from .errors import InvalidRequestError

if TYPE_CHECKING:
    from ..tokenizer import Tokenizer
    from .sampling import Sampler

__all__ = ["CONSTRAINT_PARAMS", "ConstrainedSampler", "Constraint", "ConstraintError",
           "ConstraintFailure", "Grammar", "apply_bitmask", "bounded_schema", "check_schema",
           "constraint_from_request", "embed_schema", "fill_bitmasks", "gbnf_grammar",
           "json_schema_grammar", "lark_grammar", "ll_tokenizer", "regex_grammar",
           "schema_from_arg", "token_bytes"]

# the request fields that carry a constraint, in the order they are looked at
CONSTRAINT_PARAMS = ("response_format", "json_schema", "grammar", "regex", "lark")

# llama.cpp's JSON whitespace (json-schema-to-grammar's SPACE_RULE): a space, or a line
# break or two and an indent of at most 20
JSON_WHITESPACE = r"(?: |\n{1,2}[ \t]{0,20})"
_JSON_DEFAULTS = {"whitespace_pattern": JSON_WHITESPACE}
_JSON_STRICT = {"lenient": False, "coerce_one_of": False}

_MAX_SCHEMA_DEPTH = 64  # nesting deeper than this is refused before it reaches llguidance


class ConstraintError(InvalidRequestError):
    """A schema or grammar that cannot be used: invalid, or using an unsupported feature.
    The message names the problem; ``param`` the request field (``response_format``, ...)."""


class ConstraintFailure(RuntimeError):
    """A constraint that broke down while generating (llguidance hit one of its limits, or a
    token outside the mask was accepted). The sequence cannot go on constrained."""


# --- the tokenizer, as llguidance sees it ----------------------------------------------------

_HIDDEN = int(Attr.CONTROL | Attr.UNKNOWN | Attr.USER_DEFINED)
# GPT-2's byte alphabet -> the byte as a latin-1 character; any other character below 256
# maps to U+FFFF, which latin-1 cannot encode, so that such tokens take the exact slow path
_BYTE_TABLE = {c: 0xFFFF for c in range(256)}
_BYTE_TABLE.update({ord(ch): b for ch, b in UNICODE_TO_BYTE.items()})


def token_bytes(tokenizer: Tokenizer) -> tuple[list[bytes], list[int]]:
    """Every token's bytes as generated text shows them (``token_to_piece``), and the ids of
    the special tokens: those that print nothing but have a text (control tokens), given
    their text. Normal tokens take a vectorised path (Gemma's 262k tokens in ~0.3 s)."""
    v = tokenizer.vocab
    attrs = v.attrs
    normal = (attrs & int(Attr.NORMAL) != 0) & (attrs & _HIDDEN == 0)
    out: list[bytes] = [b""] * v.n_vocab
    if v.kind == "spm" or v.escape_whitespaces:
        for i in np.flatnonzero(normal).tolist():
            out[i] = v.tokens[i].replace("\u2581", " ").encode("utf-8", "surrogateescape")
    else:  # byte-level BPE
        for i in np.flatnonzero(normal).tolist():
            try:
                out[i] = v.tokens[i].translate(_BYTE_TABLE).encode("latin-1")
            except UnicodeEncodeError:  # outside the byte alphabet: llama.cpp's marker text
                out[i] = tokenizer.token_to_piece(i)
    special: list[int] = []
    for i in np.flatnonzero(~normal).tolist():
        piece = tokenizer.token_to_piece(i)
        if not piece:
            piece = tokenizer.token_to_piece(i, special=True)
            if piece:
                special.append(i)
        out[i] = piece
    return out, special


class _Vocab:
    """What ``llguidance.TokenizerWrapper`` reads (token bytes, EOS/BOS, special ids) and the
    encoder it calls: llguidance allows only our (canonical) tokenization of text that the
    grammar forces, so this must tokenize exactly as the model's tokenizer does."""

    def __init__(self, tokenizer: Tokenizer, eos: int) -> None:
        self.tokens, self.special_token_ids = token_bytes(tokenizer)
        self.eos_token_id = eos
        self.bos_token_id = tokenizer.bos_id
        self._encode = tokenizer.encode

    def __call__(self, text: bytes | str) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        try:
            # llguidance tokenizes pieces of output (text it forces): no space prefix
            return self._encode(text, add_special=False, space_prefix=False)
        except Exception:  # noqa: BLE001 - an exception here would abort inside Rust
            return []


@dataclass
class _TokEntry:
    ll: llguidance.LLTokenizer
    eos_ids: tuple[int, ...]
    build_seconds: float
    lock: threading.Lock
    matchers: OrderedDict[str, llguidance.LLMatcher]  # compiled grammars, unstarted


_TOKENIZERS: weakref.WeakKeyDictionary[Any, _TokEntry] = weakref.WeakKeyDictionary()
_TOKENIZERS_LOCK = threading.Lock()
_MATCHER_CACHE_SIZE = 32


def _entry(tokenizer: Tokenizer) -> _TokEntry:
    with _TOKENIZERS_LOCK:  # built once even when requests race (it takes seconds)
        entry = _TOKENIZERS.get(tokenizer)
        if entry is None:
            t0 = time.perf_counter()
            eos_ids = tuple(sorted(tokenizer.eog_ids))
            if not eos_ids:
                raise ConstraintError("the model's vocabulary has no end-of-generation token, "
                                      "which constrained decoding needs")
            wrapper = llguidance.TokenizerWrapper(_Vocab(tokenizer, eos_ids[0]))
            ll = llguidance.LLTokenizer(wrapper, n_vocab=tokenizer.n_vocab,
                                        eos_token=list(eos_ids))
            entry = _TokEntry(ll, eos_ids, time.perf_counter() - t0, threading.Lock(),
                              OrderedDict())
            _TOKENIZERS[tokenizer] = entry
        return entry


def ll_tokenizer(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    """The llguidance tokenizer for ``tokenizer``, built on first use and cached for as long
    as ``tokenizer`` lives (building takes ~0.3 s for a 49k vocabulary, ~3 s for 262k; call
    this when loading a model to have it ready)."""
    return _entry(tokenizer).ll


def ll_tokenizer_build_seconds(tokenizer: Tokenizer) -> float:
    """How long building ``ll_tokenizer(tokenizer)`` took."""
    return _entry(tokenizer).build_seconds


# --- grammars --------------------------------------------------------------------------------

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


def _one_line(message: str) -> str:
    """llguidance's multi-line messages (regex errors draw a caret line) on one line."""
    lines = [ln.strip() for ln in str(message).splitlines()]
    return "; ".join(ln for ln in lines if ln and set(ln) - set("^ |~0123456789"))


def _validate(ll_grammar: str, param: str, what: str,
              tokenizer: Tokenizer | None = None) -> None:
    ll = ll_tokenizer(tokenizer) if tokenizer is not None else None
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(ll_grammar, ll)
    if ll is None:  # special token names are checked once compiled for a vocabulary
        messages = [m for m in messages if "no tokenizer" not in m]
    if messages:  # a warning is something llguidance ignored or changed: refused as well
        msg = _one_line(messages[0])
        if what == "JSON schema" and _unsupported(msg):
            raise ConstraintError(f"unsupported JSON schema feature: {msg}", param=param,
                                  code="unsupported_schema")
        raise ConstraintError(f"invalid {what}: {msg}", param=param)


def _unsupported(msg: str) -> bool:
    return any(s in msg for s in ("Unimplemented", "not supported", "Unknown format",
                                  "is not present in a registry"))


def _timed(kind: str, ll_grammar: str, param: str, t0: float, schema: Any = None) -> Grammar:
    return Grammar(kind, ll_grammar, param, schema, time.perf_counter() - t0)


def json_schema_grammar(schema: Any, param: str = "json_schema",
                        tokenizer: Tokenizer | None = None) -> Grammar:
    """A grammar for JSON values that match ``schema`` (a dict, ``True``, or its JSON text)."""
    t0 = time.perf_counter()
    schema = _load_schema(schema, param)
    check_schema(schema, param)
    try:
        ll = llguidance.LLMatcher.grammar_from_json_schema(
            bounded_schema(schema), defaults=_JSON_DEFAULTS, overrides=_JSON_STRICT)
    except (ValueError, TypeError) as e:
        raise ConstraintError(f"invalid JSON schema: {_one_line(str(e))}", param=param) from None
    _validate(ll, param, "JSON schema", tokenizer)
    return _timed("json_schema", ll, param, t0, schema)


def gbnf_grammar(text: Any, param: str = "grammar",
                 tokenizer: Tokenizer | None = None) -> Grammar:
    """A grammar from llama.cpp GBNF text (Lark text is recognised and taken as it is)."""
    t0 = time.perf_counter()
    text = _text(text, param, "a GBNF grammar")
    try:
        ll = llguidance.grammar_from("gbnf", text)
    except ValueError as e:
        msg = _one_line(str(e)).removeprefix("Failed to convert the grammar from GBNF to Lark: ")
        raise ConstraintError(f"invalid GBNF grammar: {msg}", param=param) from None
    _validate(ll, param, "grammar", tokenizer)
    return _timed("gbnf", ll, param, t0)


def lark_grammar(text: Any, param: str = "lark", tokenizer: Tokenizer | None = None) -> Grammar:
    """A grammar from llguidance's Lark syntax (``%json {...}`` embeds a JSON schema)."""
    t0 = time.perf_counter()
    ll = llguidance.LLMatcher.grammar_from_lark(_text(text, param, "a Lark grammar"))
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
    _validate(llguidance.LLMatcher.grammar_from_regex(text), param, "regular expression")
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
    return value


def _load_schema(schema: Any, param: str) -> Any:
    if isinstance(schema, str | bytes):
        try:
            schema = json.loads(schema)
        except (ValueError, RecursionError) as e:
            raise ConstraintError(f"{param} is not valid JSON: {e}", param=param) from None
    if schema is True:
        return {}
    if schema is False:
        raise ConstraintError(f"{param} is the schema false, which no value matches",
                              param=param)
    if not isinstance(schema, Mapping):
        raise ConstraintError(f"{param} must be a JSON schema object, got "
                              f"{type(schema).__name__}", param=param)
    return schema


def schema_from_arg(value: str) -> dict[str, Any]:
    """A JSON schema from a command-line argument: JSON text if it starts with ``{``, else
    the path of a file holding it. Errors name the file."""
    text = value.strip()
    if not text.startswith("{"):
        try:
            with open(os.path.expanduser(value), encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ConstraintError(f"cannot read the JSON schema file {value}: {e}",
                                  param="json_schema") from None
    schema = _load_schema(text, "json_schema")
    return dict(schema)


# --- schema keywords -------------------------------------------------------------------------

_SUBSCHEMA = {"items", "additionalItems", "additionalProperties", "not", "if", "then", "else",
              "contains", "propertyNames", "unevaluatedItems", "unevaluatedProperties",
              "contentSchema"}
_SUBSCHEMA_MAP = {"properties", "patternProperties", "$defs", "definitions",
                  "dependentSchemas", "dependencies"}
_SUBSCHEMA_LIST = {"allOf", "anyOf", "oneOf", "prefixItems", "items"}
_OTHER_KEYWORDS = {
    # core, drafts 4 to 2020-12
    "$schema", "$id", "id", "$ref", "$anchor", "$dynamicRef", "$dynamicAnchor", "$vocabulary",
    "$comment", "$recursiveRef", "$recursiveAnchor",
    # validation
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
    "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems",
    "uniqueItems", "maxContains", "minContains", "maxProperties", "minProperties", "required",
    "dependentRequired", "format", "contentEncoding", "contentMediaType",
    # annotations
    "title", "description", "default", "deprecated", "readOnly", "writeOnly", "examples",
    # not JSON Schema, but common annotations that change nothing (OpenAPI, pydantic)
    "discriminator", "example",
}
KNOWN_KEYWORDS = frozenset(_SUBSCHEMA | _SUBSCHEMA_MAP | _SUBSCHEMA_LIST | _OTHER_KEYWORDS)


def check_schema(schema: Any, param: str) -> None:
    """Refuse keywords JSON Schema does not define (``x-`` extensions excepted), anywhere in
    ``schema``, naming the keyword and where it is (a JSON pointer); and nesting deeper than
    64 levels. llguidance checks the rest (types, unimplemented keywords, ranges)."""
    stack: list[tuple[Any, str, int]] = [(schema, "", 0)]
    while stack:
        node, where, depth = stack.pop()
        if isinstance(node, bool):
            continue
        if not isinstance(node, Mapping):
            raise ConstraintError(f"invalid JSON schema: {where or '/'} must be a schema "
                                  f"(an object or a boolean), got {type(node).__name__}",
                                  param=param)
        if depth > _MAX_SCHEMA_DEPTH:
            raise ConstraintError(f"the JSON schema nests deeper than {_MAX_SCHEMA_DEPTH} "
                                  f"levels (at {where})", param=param)
        for key, value in node.items():
            if not isinstance(key, str):
                raise ConstraintError(f"invalid JSON schema: key {key!r} at {where or '/'}",
                                      param=param)
            here = f"{where}/{_pointer(key)}"
            if key.startswith("x-"):
                continue
            if key not in KNOWN_KEYWORDS:
                raise ConstraintError(
                    f"unsupported JSON schema feature: unknown keyword {key!r} at "
                    f"{where or '/'} (JSON Schema would ignore it; remove it or write "
                    f"it as 'x-{key}')", param=param, code="unsupported_schema")
            if key in _SUBSCHEMA_LIST and isinstance(value, list):
                stack.extend((s, f"{here}/{i}", depth + 1) for i, s in enumerate(value))
            elif key in _SUBSCHEMA_MAP and isinstance(value, Mapping):
                for name, s in value.items():
                    if key == "dependencies" and isinstance(s, list):
                        continue  # draft 4's property dependencies: a list of names
                    stack.append((s, f"{here}/{_pointer(str(name))}", depth + 1))
            elif key in _SUBSCHEMA or key in _SUBSCHEMA_LIST:
                stack.append((value, here, depth + 1))


# Limits on values a schema leaves unbounded, so that a model cannot write digits forever:
# llama.cpp's schema grammars allow 16 integer digits (and 16 decimals: llguidance takes at
# most 10 as a multipleOf); formats get lengths beyond any real value.
MAX_INTEGER = 10**16 - 1
MAX_DECIMALS = 10
FORMAT_MAX_LENGTH = {"time": 32, "date-time": 48, "duration": 64, "email": 254,
                     "hostname": 253, "uri": 2083, "ipv6": 45}


def bounded_schema(schema: Any) -> Any:
    """A copy of ``schema`` whose integers and numbers have at most 16 integer digits and
    numbers at most 10 decimals (where the schema sets no bound or multipleOf of its own),
    and whose formatted strings (``time``, ``email``, ...) a length limit. Everything it
    allows the original allows too, so outputs still validate against the original."""
    if isinstance(schema, list):
        return [bounded_schema(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SUBSCHEMA_MAP and isinstance(value, Mapping):
            out[key] = {name: bounded_schema(s) for name, s in value.items()}
        elif key in _SUBSCHEMA or key in _SUBSCHEMA_LIST:
            out[key] = bounded_schema(value)
        else:
            out[key] = value
    types = out.get("type")
    types = [types] if isinstance(types, str) else types if isinstance(types, list) else []
    if ("integer" in types or "number" in types) and "enum" not in out and "const" not in out:
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -MAX_INTEGER
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = MAX_INTEGER
        if "integer" not in types and "multipleOf" not in out:
            out["multipleOf"] = 10.0 ** -MAX_DECIMALS
    limit = FORMAT_MAX_LENGTH.get(out.get("format"))  # type: ignore[arg-type]
    if limit is not None and "maxLength" not in out and out.get("minLength", 0) <= limit:
        out["maxLength"] = limit
    return out


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def embed_schema(schema: Any, pointer: str) -> Any:
    """A copy of ``schema`` for placing at JSON pointer ``pointer`` (``/properties/x``) inside
    another schema: its local references (``#``, ``#/$defs/T``) are rewritten to still point
    into it. Only schema positions are rewritten (not ``enum``/``const`` data or a property
    that happens to be called ``$ref``)."""
    if isinstance(schema, list):
        return [embed_schema(s, pointer) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            rest = value[1:]
            out[key] = "#" + pointer + rest if rest.startswith("/") or not rest else value
        elif key in _SUBSCHEMA_MAP and isinstance(value, Mapping):
            out[key] = {name: embed_schema(s, pointer) for name, s in value.items()}
        elif key in _SUBSCHEMA or key in _SUBSCHEMA_LIST:
            out[key] = embed_schema(value, pointer)
        else:
            out[key] = value
    return out


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


# --- one sequence's constraint ---------------------------------------------------------------

def _matcher(entry: _TokEntry, grammar: Grammar) -> llguidance.LLMatcher:
    """A fresh matcher: a copy of the cached compiled one (~0.03 ms instead of ~1-10 ms)."""
    with entry.lock:
        template = entry.matchers.get(grammar.ll_grammar)
        if template is None:
            template = llguidance.LLMatcher(entry.ll, grammar.ll_grammar, log_level=0)
            if template.is_error():
                raise ConstraintError(f"invalid {grammar.kind} grammar: "
                                      f"{_one_line(template.get_error())}", param=grammar.param)
            entry.matchers[grammar.ll_grammar] = template
            if len(entry.matchers) > _MATCHER_CACHE_SIZE:
                entry.matchers.popitem(last=False)
        else:
            entry.matchers.move_to_end(grammar.ll_grammar)
        return template.deep_copy()


class Constraint:
    """One sequence's grammar state: ``mask`` the logits before each sampling step,
    ``accept`` each generated token. Not thread-safe (one sequence, one thread at a time).

    Timing: ``compile_seconds`` (making the matcher); ``masks``, the number of ``mask`` calls,
    and their time: ``mask_seconds`` in all, of which ``compute_seconds`` computing the
    allowed set (llguidance) and the rest applying it to the logits."""

    def __init__(self, grammar: Grammar, tokenizer: Tokenizer) -> None:
        t0 = time.perf_counter()
        entry = _entry(tokenizer)
        self.grammar = grammar
        self.n_vocab = tokenizer.n_vocab
        self.eos_ids = entry.eos_ids
        self._matcher = _matcher(entry, grammar)
        self._bits = np.zeros((self.n_vocab + 31) // 32, dtype=np.int32)
        self._fresh = False  # _bits holds the mask of the current state
        self.compile_seconds = time.perf_counter() - t0
        self.mask_seconds = 0.0
        self.compute_seconds = 0.0
        self.masks = 0

    # the allowed set, as a bitmask (bit t of word t // 32 set: token t may come next)
    def fill_bitmask(self, out: np.ndarray | None = None) -> np.ndarray:
        """Compute the current state's allowed tokens into ``out`` (int32 words, one bit per
        token; default: this constraint's own buffer) and return it. Raises
        ``ConstraintFailure`` if llguidance has failed."""
        out = self._bits if out is None else out
        if out.dtype != np.int32 or out.ndim != 1 or not out.flags["C_CONTIGUOUS"] \
                or out.size != self._bits.size:
            raise ValueError(f"the bitmask must be {self._bits.size} contiguous int32 words")
        self._matcher.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)  # GIL released
        self._check()
        if out is self._bits:
            self._fresh = True
        return out

    def mask(self, logits: np.ndarray) -> None:
        """Set the logits of tokens that cannot come next to -inf, in place (``logits`` is the
        float vector of one position; entries past the vocabulary are masked too)."""
        t0 = time.perf_counter()
        if not self._fresh:
            self.fill_bitmask()
        self.compute_seconds += time.perf_counter() - t0
        if not self._bits.any():
            raise ConstraintFailure("the grammar allows no token here (llguidance: "
                                    f"{self._matcher.stop_reason()})")
        apply_bitmask(logits, self._bits)
        self.mask_seconds += time.perf_counter() - t0
        self.masks += 1

    def allows(self, token: int) -> bool:
        """Whether ``token`` may come next (the state's mask is computed if it is not yet)."""
        if not self._fresh:
            self.fill_bitmask()
        return 0 <= token < self.n_vocab and bool((self._bits[token >> 5] >> (token & 31)) & 1)

    def accept(self, token: int) -> None:
        """Advance past ``token`` (a generated one). Raises ``ConstraintFailure`` if the
        grammar does not allow it."""
        self._fresh = False
        if not self._matcher.consume_token(int(token)):
            raise ConstraintFailure(f"token {token} does not fit the grammar: "
                                    f"{_one_line(self._matcher.get_error())}")

    def is_done(self) -> bool:
        """The output is complete and cannot be extended: only EOS may come next (or came)."""
        return self._matcher.is_stopped() and not self._matcher.is_error()

    def is_accepting(self) -> bool:
        """The output so far is a complete match (it may still be extended)."""
        return self._matcher.is_accepting()

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces next (may be empty): an engine may evaluate them in one
        batch instead of sampling them one by one."""
        return list(self._matcher.compute_ff_tokens())

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` accepted tokens."""
        self._fresh = False
        if n and not self._matcher.rollback(n):
            raise ConstraintFailure(f"cannot roll back {n} tokens: "
                                    f"{_one_line(self._matcher.get_error())}")

    def reset(self) -> None:
        """Back to the start of the grammar (and the timing counters to zero)."""
        self._fresh = False
        self._matcher.reset()
        self.mask_seconds, self.compute_seconds, self.masks = 0.0, 0.0, 0

    def _check(self) -> None:
        if self._matcher.is_error():
            raise ConstraintFailure(f"constrained decoding failed: "
                                    f"{_one_line(self._matcher.get_error())}")

    @property
    def matcher(self) -> llguidance.LLMatcher:
        """The llguidance matcher (for ``fill_bitmasks`` over a batch)."""
        return self._matcher


def apply_bitmask(logits: np.ndarray, bitmask: np.ndarray) -> None:
    """Logits of tokens whose bit is clear -> -inf, in place. ``logits`` (n,) with ``bitmask``
    (words,), or (batch, n) with (batch, words); columns past 32 * words are masked too."""
    if logits.ndim == 1:
        logits, bitmask = logits[None, :], bitmask[None, :]
    n = logits.shape[1]
    n_bits = 32 * bitmask.shape[1]
    if n > n_bits:
        logits[:, n_bits:] = -np.inf
        n = n_bits
    # unpack the words' bits (little-endian within each word, as llguidance writes them)
    bits = np.unpackbits(bitmask.view(np.uint8), axis=1, count=n, bitorder="little")
    np.putmask(logits[:, :n], bits == 0, -np.inf)


_EXECUTOR: llguidance.LLExecutor | None = None


def fill_bitmasks(constraints: Sequence[Constraint], bitmask: np.ndarray) -> None:
    """The masks of a batch of sequences, computed in parallel by llguidance's thread pool
    (without the GIL) into ``bitmask`` (len(constraints), words) int32, row i for
    ``constraints[i]``. For a scheduler: compute, then ``apply_bitmask`` to the batch's
    logits."""
    global _EXECUTOR
    if _EXECUTOR is None:
        _EXECUTOR = llguidance.LLExecutor()
    if bitmask.dtype != np.int32 or bitmask.ndim != 2 or not bitmask.flags["C_CONTIGUOUS"] \
            or bitmask.shape[0] < len(constraints):
        raise ValueError("bitmask must be a C-contiguous (batch, words) int32 array")
    if not constraints:
        return
    _EXECUTOR.unsafe_compute_mask_ptr([(c.matcher, i) for i, c in enumerate(constraints)],
                                      bitmask.ctypes.data, bitmask.shape[1] * 4,
                                      bitmask.shape[0])
    for c in constraints:
        c._fresh = False  # their own buffers were not filled
        c._check()


# --- the hook into today's generation loop ---------------------------------------------------

class ConstrainedSampler:
    """A ``Sampler`` whose draws obey a ``Constraint``: logits are masked before the sampler
    chain runs (so every filter and temperature sees only allowed tokens), and each sampled
    token advances the constraint.

    It relies on how ``engine.generate`` calls a sampler: ``accept_all`` once with the prompt
    (those tokens go to the sampler's penalties only), then ``sample`` and ``accept`` per
    generated token. A scheduler should instead call ``Constraint.mask`` on a sequence's
    logits before sampling and ``Constraint.accept`` after (the hook this class stands in for).
    """

    def __init__(self, sampler: Sampler, constraint: Constraint) -> None:
        self.sampler = sampler
        self.constraint = constraint

    @property
    def params(self) -> Any:
        return self.sampler.params

    @property
    def seed(self) -> int:
        return self.sampler.seed

    def accept_all(self, tokens: Iterable[int]) -> None:
        self.sampler.accept_all(tokens)  # the prompt: not part of the constrained output

    def accept(self, token: int) -> None:
        self.sampler.accept(token)
        self.constraint.accept(token)

    def sample(self, logits: np.ndarray) -> int:
        masked = np.array(logits, dtype=np.float32).reshape(-1)  # a copy: the caller's stays
        self.constraint.mask(masked)
        token = self.sampler.sample(masked)
        if not self.constraint.allows(token):
            # the draw can land on a zero-probability candidate only when its uniform number
            # is exactly 0; take the best allowed token then
            token = int(np.argmax(masked))
        return token

    def reset(self) -> None:
        self.sampler.reset()
        self.constraint.reset()
