"""What ``gguflm inspect`` shows: a model summary and display forms of metadata values.

Everything here is computed from the header alone (no tensor bytes are read), so it is
instant even for large files. ``summarize`` returns plain JSON-able data; ``format_value``
is the one-line display form (arrays: type, length, first elements, "+N more").
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from .reader import GGUFFile, StringArray
from .types import FILE_TYPE_NAMES, ArrayType, MetaType, ValueType, type_name

__all__ = ["format_value", "printable", "summarize", "to_json", "type_name"]

# special-token keys, in the order they are shown (tokenizer.ggml.<name>_token_id)
SPECIAL_TOKENS = ("bos", "eos", "eot", "eom", "unknown", "padding", "separator", "mask",
                  "cls", "prefix", "suffix", "middle", "fim_pre", "fim_suf", "fim_mid",
                  "fim_pad", "fim_rep", "fim_sep")


_INTS = frozenset({ValueType.UINT8, ValueType.INT8, ValueType.UINT16, ValueType.INT16,
                   ValueType.UINT32, ValueType.INT32, ValueType.UINT64, ValueType.INT64})
_NUMBERS = _INTS | {ValueType.FLOAT32, ValueType.FLOAT64}

# what each summarized key must be: (test on its GGUF type, how to say it)
_KINDS: dict[str, tuple[Any, str]] = {
    "string": (lambda t: t == ValueType.STRING, "a string"),
    "int": (lambda t: t in _INTS, "an integer"),
    "number": (lambda t: t in _NUMBERS, "a number"),
    "bool": (lambda t: t == ValueType.BOOL, "a bool"),
    "strings": (lambda t: t == ArrayType(ValueType.STRING), "an array of strings"),
    # per-layer values (head counts, feed-forward sizes) may be arrays of integers
    "ints": (lambda t: t in _INTS or isinstance(t, ArrayType) and t.elem in _INTS,
             "an integer or an array of integers"),
    "pattern": (lambda t: t in _INTS or isinstance(t, ArrayType) and t.elem in
                _INTS | {ValueType.BOOL}, "an integer or an array of bools"),
}


def summarize(f: GGUFFile) -> dict[str, Any]:
    """The model at a glance, as plain JSON-able values (None where the file does not say).

    Every key read here is checked against the type it must have; a value of another type
    (an architecture that is an array, numeric tokens) is left out of the summary and named
    in ``problems`` instead, so that no file makes the summary fail.
    """
    md = f.metadata
    problems: list[str] = []

    def get(key: str, kind: str) -> Any:
        if key not in md:
            return None
        ok, expected = _KINDS[kind]
        mtype = f.types.get(key)
        if mtype is not None and ok(mtype):
            return md[key]
        problems.append(f"{printable(key)} is {type_name(mtype) if mtype else '?'}, "
                        f"expected {expected}")
        return None

    arch = get("general.architecture", "string")

    def arch_key(name: str, kind: str = "int") -> Any:
        return to_json(get(f"{arch}.{name}", kind)) if arch else None

    n_params = sum(t.n_elements for t in f.tensors.values())
    n_bytes = sum(t.nbytes for t in f.tensors.values())
    mix: dict[str, dict[str, int]] = {}
    for t in f.tensors.values():
        m = mix.setdefault(t.type.ggml_name, {"count": 0, "nbytes": 0, "n_elements": 0})
        m["count"] += 1
        m["nbytes"] += t.nbytes
        m["n_elements"] += t.n_elements
    mix = dict(sorted(mix.items(), key=lambda kv: -kv[1]["nbytes"]))

    ftype = _plain(get("general.file_type", "int"))
    tokens = get("tokenizer.ggml.tokens", "strings")
    vocab = len(tokens) if tokens is not None else arch_key("vocab_size")
    special: dict[str, dict[str, Any]] = {}
    for name in SPECIAL_TOKENS:
        tid = _plain(get(f"tokenizer.ggml.{name}_token_id", "int"))
        if tid is None:
            continue
        piece = tokens[tid] if tokens is not None and 0 <= tid < len(tokens) else None
        special[name] = {"id": tid, "token": piece}
    template = get("tokenizer.chat_template", "string")

    head_count = arch_key("attention.head_count", "ints")
    head_count_kv = arch_key("attention.head_count_kv", "ints")
    n_embd, n_layer = arch_key("embedding_length"), arch_key("block_count")
    head_dim = arch_key("attention.key_length")
    if head_dim is None and isinstance(n_embd, int) and isinstance(head_count, int) \
            and head_count:
        head_dim = n_embd // head_count
    kv_heads = head_count_kv if head_count_kv is not None else head_count
    kv_per_token = None  # f16 K and V for every layer: what each token of context costs
    if isinstance(n_layer, int) and isinstance(kv_heads, int) and isinstance(head_dim, int):
        v_dim = arch_key("attention.value_length") or head_dim
        kv_per_token = n_layer * kv_heads * (head_dim + v_dim) * 2
    return {
        "architecture": arch,
        "name": get("general.name", "string"),
        "n_params": n_params,
        "n_bytes": n_bytes,
        "bits_per_weight": round(n_bytes * 8 / n_params, 4) if n_params else None,
        "file_type": ftype,
        "file_type_name": FILE_TYPE_NAMES.get(ftype) if ftype is not None else None,
        "tensor_types": mix,
        "context_length": arch_key("context_length"),
        "embedding_length": n_embd,
        "block_count": n_layer,
        "feed_forward_length": arch_key("feed_forward_length", "ints"),
        "head_count": head_count,
        "head_count_kv": head_count_kv,
        "head_dim": head_dim,
        "attention": _attention_kind(head_count, head_count_kv),
        # sliding-window and soft-capping keys as the file declares them; whether and how an
        # architecture honours them (which layers slide, defaults) is the model's business
        "sliding_window": arch_key("attention.sliding_window"),
        "sliding_window_pattern": arch_key("attention.sliding_window_pattern", "pattern"),
        "attn_logit_softcapping": arch_key("attn_logit_softcapping", "number"),
        "final_logit_softcapping": arch_key("final_logit_softcapping", "number"),
        "vocab_size": vocab,
        "tokenizer_model": get("tokenizer.ggml.model", "string"),
        "tokenizer_pre": get("tokenizer.ggml.pre", "string"),
        "special_tokens": special,
        "add_bos_token": _plain(get("tokenizer.ggml.add_bos_token", "bool")),
        "add_eos_token": _plain(get("tokenizer.ggml.add_eos_token", "bool")),
        "chat_template": template is not None,
        "chat_template_chars": len(template) if template is not None else 0,
        "kv_cache_bytes_per_token": kv_per_token,
        "output_tied": "output.weight" not in f.tensors if f.tensors else None,
        **_experts(f, arch_key("expert_count"), arch_key("expert_used_count"), n_params),
        "problems": problems,
    }


def _experts(f: GGUFFile, count: Any, used: Any, n_params: int) -> dict[str, Any]:
    """A mixture of experts' ``expert_count``, ``expert_used_count`` and the parameters a
    token reads (``active_params``: the expert tensors, ``*_exps``, counted at used/count;
    everything else in full), or Nones for a dense model."""
    if not (isinstance(count, int) and isinstance(used, int) and 0 < used <= count):
        return {"expert_count": None, "expert_used_count": None, "active_params": None}
    experts = sum(t.n_elements for t in f.tensors.values() if "_exps." in t.name)
    return {"expert_count": count, "expert_used_count": used,
            "active_params": n_params - experts + experts * used // count}


def _attention_kind(n_head: Any, n_head_kv: Any) -> str | None:
    """"multi-head", "multi-query" or "grouped-query (G query heads per KV head)" from the
    head counts (per-layer arrays: the first layer's)."""
    if isinstance(n_head, list):
        n_head = n_head[0] if n_head else None
    if isinstance(n_head_kv, list):
        n_head_kv = n_head_kv[0] if n_head_kv else None
    if not isinstance(n_head, int) or n_head <= 0:
        return None
    if n_head_kv is None or n_head_kv == n_head:
        return "multi-head"
    if not isinstance(n_head_kv, int) or n_head_kv <= 0:
        return None
    if n_head_kv == 1:
        return "multi-query"
    return f"grouped-query ({n_head / n_head_kv:g} query heads per KV head)"


def to_json(value: Any) -> Any:
    """A metadata value as JSON data: full arrays as lists, non-finite floats as strings
    ("nan", "inf", "-inf") so that the output stays strict JSON."""
    if isinstance(value, StringArray):
        return value.tolist()
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            return [_json_float(x) for x in value.tolist()]
        return value.tolist()
    if isinstance(value, list):
        return [to_json(v) for v in value]
    if isinstance(value, float):
        return _json_float(value)
    return _plain(value)


def format_value(value: Any, mtype: MetaType, *, n_items: int = 5,
                 max_chars: int | None = 80) -> str:
    """One-line display form: scalars as they are (float32 in its shortest form), strings
    quoted and cut at ``max_chars``, arrays as ``[first n_items] +N more``."""
    if isinstance(mtype, ArrayType):
        n = len(value)
        head = [_format_item(v, mtype.elem, max_chars) for v in value[:n_items]]
        more = f" +{n - n_items} more" if n > n_items else ""
        return f"[{', '.join(head)}]{more}"
    return _format_item(value, mtype, max_chars)


def _format_item(v: Any, t: Any, max_chars: int | None) -> str:
    if isinstance(t, ArrayType):
        return f"{t}({len(v)})"
    if isinstance(v, str):
        if max_chars is not None and len(v) > max_chars:
            return repr(v[:max_chars]) + f"... ({len(v)} chars)"
        return repr(v)
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if t == ValueType.FLOAT32:
        return str(np.float32(v))
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    return str(int(v)) if isinstance(v, (int, np.integer)) else repr(v)


# C0 and C1 controls (ESC starts the sequences that retitle or clear a terminal), the line
# separators and bidi overrides that make text display differently from what it is, and the
# lone surrogates that stand for invalid UTF-8 in metadata strings (unprintable as such)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
                      "\ud800-\udfff]")


def printable(text: str) -> str:
    """``text`` for a terminal: control characters written as ``\\xNN``/``\\uNNNN`` escapes
    (for human-readable output; JSON output keeps the exact text)."""
    return _CONTROL.sub(lambda m: _escape(m.group()), text)


def _escape(c: str) -> str:
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}"


def _json_float(x: float) -> float | str:
    return x if math.isfinite(x) else ("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"))


def _plain(v: Any) -> Any:
    """numpy scalars -> Python scalars; everything else unchanged."""
    return v.item() if isinstance(v, np.generic) else v
