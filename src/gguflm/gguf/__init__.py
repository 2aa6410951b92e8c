"""The GGUF format: reading, validating and writing files (stdlib + numpy only).

The errors are imported eagerly (stdlib only); the reader, writer and types on first use
(PEP 562), so that ``gguflm --help`` and ``hub``, which only need ``GGUFError``, do not
import numpy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    GGUFError,
    GGUFWarning,
    MagicError,
    MetadataError,
    TensorDataError,
    TensorInfoError,
    TruncatedError,
    VersionError,
    WriteError,
)

if TYPE_CHECKING:
    from .reader import GGUFFile, StringArray, TensorInfo, open
    from .types import ArrayType, GGMLType, MetaType, ValueType
    from .writer import GGUFWriter, infer_type

# public name -> the submodule that defines it
_LAZY = {
    "GGUFFile": "reader", "StringArray": "reader", "TensorInfo": "reader", "open": "reader",
    "ArrayType": "types", "GGMLType": "types", "MetaType": "types", "ValueType": "types",
    "GGUFWriter": "writer", "infer_type": "writer",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "ArrayType", "GGMLType", "GGUFError", "GGUFFile", "GGUFWarning", "GGUFWriter", "MagicError",
    "MetaType",
    "MetadataError", "StringArray", "TensorDataError", "TensorInfo", "TensorInfoError",
    "TruncatedError", "ValueType", "VersionError", "WriteError", "infer_type", "open",
]
