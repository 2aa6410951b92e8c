"""Metadata overrides applied at load (llama.cpp's ``--override-kv KEY=TYPE:VALUE``,
llama-cpp-python's ``kv_overrides``): fix a wrong value in a file without rewriting it, e.g.
a bad ``rope.freq_base``, a context length, or ``tokenizer.ggml.add_bos_token``.

An override replaces the value the rest of gguflm reads (model config, tokenizer, chat
template); the file is not touched. Its type must fit the key's: a bool, an integer, a
number or a string, as in llama.cpp (an integer may set a float key; arrays cannot be
overridden). A key the file lacks is added.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..gguf.errors import MetadataError

__all__ = ["KVOverrideError", "apply_kv_overrides", "parse_kv_override"]

TYPES = ("int", "float", "bool", "str")


class KVOverrideError(ValueError):
    """An override that cannot be parsed or does not fit its key."""


def parse_kv_override(text: str) -> tuple[str, bool | int | float | str]:
    """``KEY=TYPE:VALUE`` (TYPE: int, float, bool or str) -> (key, value), as llama.cpp's
    ``--override-kv`` reads it; anything else raises KVOverrideError saying why."""
    key, sep, rest = text.partition("=")
    if not sep or not key:
        raise KVOverrideError(f"expected KEY=TYPE:VALUE, got {text!r}")
    kind, sep, value = rest.partition(":")
    if not sep or kind not in TYPES:
        raise KVOverrideError(f"{text!r}: TYPE must be one of {', '.join(TYPES)} "
                              f"(KEY=TYPE:VALUE)")
    try:
        if kind == "int":
            return key, int(value)
        if kind == "float":
            number = float(value)
            if not math.isfinite(number):
                raise ValueError
            return key, number
    except ValueError:
        raise KVOverrideError(f"{text!r}: {value!r} is not {'an' if kind == 'int' else 'a'} "
                              f"{kind}") from None
    if kind == "bool":
        if value not in ("true", "false"):
            raise KVOverrideError(f"{text!r}: a bool is true or false, got {value!r}")
        return key, value == "true"
    return key, value


def _kind(value: Any) -> str | None:
    if isinstance(value, bool | np.bool_):
        return "bool"
    if isinstance(value, int | np.integer):
        return "int"
    if isinstance(value, float | np.floating):
        return "float"
    if isinstance(value, str):
        return "str"
    return None


def apply_kv_overrides(metadata: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    """Set each override in ``metadata`` (in place), checking that its type fits the
    value it replaces; a MetadataError names the key otherwise."""
    for key, value in overrides.items():
        if not isinstance(key, str) or not key:
            raise KVOverrideError(f"an override key must be a non-empty string, got {key!r}")
        kind = _kind(value)
        if kind is None:
            raise MetadataError(f"an override must be a bool, int, float or str, got "
                                f"{type(value).__name__}", key=key)
        if key in metadata:
            old = _kind(metadata[key])
            if old is None:
                raise MetadataError("cannot override an array", key=key)
            if old == "float" and kind == "int":
                value = float(value)
            elif old != kind:
                raise MetadataError(f"the file's value is {'an' if old == 'int' else 'a'} "
                                    f"{old}; the override is {'an' if kind == 'int' else 'a'} "
                                    f"{kind}", key=key)
        metadata[key] = value
