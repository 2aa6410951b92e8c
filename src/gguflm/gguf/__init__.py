"""The GGUF format: reading, validating and writing files (stdlib + numpy only)."""

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
from .reader import GGUFFile, StringArray, TensorInfo, open
from .types import ArrayType, GGMLType, MetaType, ValueType
from .writer import GGUFWriter, infer_type

__all__ = [
    "ArrayType", "GGMLType", "GGUFError", "GGUFFile", "GGUFWarning", "GGUFWriter", "MagicError",
    "MetaType",
    "MetadataError", "StringArray", "TensorDataError", "TensorInfo", "TensorInfoError",
    "TruncatedError", "ValueType", "VersionError", "WriteError", "infer_type", "open",
]
