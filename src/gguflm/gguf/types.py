"""GGUF value types and ggml tensor types: ids, names, block sizes and byte sizes.

Facts from ggml's ``ggml.h``/``ggml.c`` type traits (see shared/docs/gguf-format.md).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass


class ValueType(enum.IntEnum):
    """Type tag of a metadata value (u32 in the file)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# struct format character and byte size of each fixed-size value type
SCALAR_FORMATS: dict[ValueType, tuple[str, int]] = {
    ValueType.UINT8: ("B", 1),
    ValueType.INT8: ("b", 1),
    ValueType.UINT16: ("H", 2),
    ValueType.INT16: ("h", 2),
    ValueType.UINT32: ("I", 4),
    ValueType.INT32: ("i", 4),
    ValueType.FLOAT32: ("f", 4),
    ValueType.BOOL: ("B", 1),
    ValueType.UINT64: ("Q", 8),
    ValueType.INT64: ("q", 8),
    ValueType.FLOAT64: ("d", 8),
}

# numpy dtype (without byte order) of each fixed-size value type
SCALAR_DTYPES: dict[ValueType, str] = {
    ValueType.UINT8: "u1",
    ValueType.INT8: "i1",
    ValueType.UINT16: "u2",
    ValueType.INT16: "i2",
    ValueType.UINT32: "u4",
    ValueType.INT32: "i4",
    ValueType.FLOAT32: "f4",
    ValueType.BOOL: "u1",
    ValueType.UINT64: "u8",
    ValueType.INT64: "i8",
    ValueType.FLOAT64: "f8",
}


@dataclass(frozen=True)
class ArrayType:
    """Type of an array value: its element type (which may itself be an array)."""

    elem: ValueType | ArrayType

    def __str__(self) -> str:
        return f"array[{type_name(self.elem)}]"


MetaType = ValueType | ArrayType


def type_name(t: MetaType) -> str:
    """``uint32``, ``string``, ``array[int32]``, ``array[array[string]]``..."""
    return t.name.lower() if isinstance(t, ValueType) else str(t)


class GGMLType(enum.IntEnum):
    """ggml tensor type ids. Removed ids keep a name so files using them are reported clearly."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q4_2_REMOVED = 4
    Q4_3_REMOVED = 5
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    Q4_0_4_4_REMOVED = 31
    Q4_0_4_8_REMOVED = 32
    Q4_0_8_8_REMOVED = 33
    TQ1_0 = 34
    TQ2_0 = 35
    IQ4_NL_4_4_REMOVED = 36
    IQ4_NL_4_8_REMOVED = 37
    IQ4_NL_8_8_REMOVED = 38
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41
    Q2_0 = 42

    @property
    def removed(self) -> bool:
        return self.name.endswith("_REMOVED")

    @property
    def ggml_name(self) -> str:
        """The name as ggml spells it, upper-case (``Q4_K``, ``BF16``)."""
        return self.name.removesuffix("_REMOVED")

    @property
    def block_size(self) -> int:
        """Elements per block (1 for plain types)."""
        return TYPE_TRAITS[self][0]

    @property
    def type_size(self) -> int:
        """Bytes per block."""
        return TYPE_TRAITS[self][1]

    @property
    def quantized(self) -> bool:
        return self.block_size > 1

    def row_bytes(self, n: int) -> int:
        """Bytes of a row of ``n`` elements (``n`` must be a multiple of the block size)."""
        return n // self.block_size * self.type_size

    def nbytes(self, shape: Sequence[int]) -> int:
        """Bytes of a tensor of ``shape`` (ggml order, ``shape[0]`` the row length)."""
        return self.row_bytes(shape[0] if shape else 1) * math.prod(shape[1:])

    @classmethod
    def from_name(cls, name: str) -> GGMLType:
        """Look a type up by its ggml name, case-insensitively (``q4_k`` -> ``Q4_K``)."""
        key = name.strip().upper()
        for t in cls:
            if t.ggml_name == key and not t.removed:
                return t
        raise ValueError(f"unknown ggml type {name!r}")


# type -> (block size, bytes per block); removed types have no traits (0, 0)
TYPE_TRAITS: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4),
    GGMLType.F16: (1, 2),
    GGMLType.Q4_0: (32, 18),
    GGMLType.Q4_1: (32, 20),
    GGMLType.Q4_2_REMOVED: (0, 0),
    GGMLType.Q4_3_REMOVED: (0, 0),
    GGMLType.Q5_0: (32, 22),
    GGMLType.Q5_1: (32, 24),
    GGMLType.Q8_0: (32, 34),
    GGMLType.Q8_1: (32, 36),
    GGMLType.Q2_K: (256, 84),
    GGMLType.Q3_K: (256, 110),
    GGMLType.Q4_K: (256, 144),
    GGMLType.Q5_K: (256, 176),
    GGMLType.Q6_K: (256, 210),
    GGMLType.Q8_K: (256, 292),
    GGMLType.IQ2_XXS: (256, 66),
    GGMLType.IQ2_XS: (256, 74),
    GGMLType.IQ3_XXS: (256, 98),
    GGMLType.IQ1_S: (256, 50),
    GGMLType.IQ4_NL: (32, 18),
    GGMLType.IQ3_S: (256, 110),
    GGMLType.IQ2_S: (256, 82),
    GGMLType.IQ4_XS: (256, 136),
    GGMLType.I8: (1, 1),
    GGMLType.I16: (1, 2),
    GGMLType.I32: (1, 4),
    GGMLType.I64: (1, 8),
    GGMLType.F64: (1, 8),
    GGMLType.IQ1_M: (256, 56),
    GGMLType.BF16: (1, 2),
    GGMLType.Q4_0_4_4_REMOVED: (0, 0),
    GGMLType.Q4_0_4_8_REMOVED: (0, 0),
    GGMLType.Q4_0_8_8_REMOVED: (0, 0),
    GGMLType.TQ1_0: (256, 54),
    GGMLType.TQ2_0: (256, 66),
    GGMLType.IQ4_NL_4_4_REMOVED: (0, 0),
    GGMLType.IQ4_NL_4_8_REMOVED: (0, 0),
    GGMLType.IQ4_NL_8_8_REMOVED: (0, 0),
    GGMLType.MXFP4: (32, 17),
    GGMLType.NVFP4: (64, 36),
    GGMLType.Q1_0: (128, 18),
    GGMLType.Q2_0: (64, 18),
}

# numpy dtype (native layout, byte order added by the reader) of plain tensor types
PLAIN_DTYPES: dict[GGMLType, str] = {
    GGMLType.F32: "f4",
    GGMLType.F16: "f2",
    GGMLType.BF16: "u2",  # numpy has no bfloat16: raw bits, see quant.dequantize
    GGMLType.F64: "f8",
    GGMLType.I8: "i1",
    GGMLType.I16: "i2",
    GGMLType.I32: "i4",
    GGMLType.I64: "i8",
}

# general.file_type (llama_ftype) labels, as llama.cpp names them
FILE_TYPE_NAMES: dict[int, str] = {
    0: "ALL_F32", 1: "MOSTLY_F16", 2: "MOSTLY_Q4_0", 3: "MOSTLY_Q4_1",
    4: "MOSTLY_Q4_1_SOME_F16", 7: "MOSTLY_Q8_0", 8: "MOSTLY_Q5_0", 9: "MOSTLY_Q5_1",
    10: "MOSTLY_Q2_K", 11: "MOSTLY_Q3_K_S", 12: "MOSTLY_Q3_K_M", 13: "MOSTLY_Q3_K_L",
    14: "MOSTLY_Q4_K_S", 15: "MOSTLY_Q4_K_M", 16: "MOSTLY_Q5_K_S", 17: "MOSTLY_Q5_K_M",
    18: "MOSTLY_Q6_K", 19: "MOSTLY_IQ2_XXS", 20: "MOSTLY_IQ2_XS", 21: "MOSTLY_Q2_K_S",
    22: "MOSTLY_IQ3_XS", 23: "MOSTLY_IQ3_XXS", 24: "MOSTLY_IQ1_S", 25: "MOSTLY_IQ4_NL",
    26: "MOSTLY_IQ3_S", 27: "MOSTLY_IQ3_M", 28: "MOSTLY_IQ2_S", 29: "MOSTLY_IQ2_M",
    30: "MOSTLY_IQ4_XS", 31: "MOSTLY_IQ1_M", 32: "MOSTLY_BF16", 36: "MOSTLY_TQ1_0",
    37: "MOSTLY_TQ2_0", 38: "MOSTLY_MXFP4_MOE",
}

GGUF_MAGIC = b"GGUF"
# pre-GGUF magics (u32 little-endian as the old loaders read them)
LEGACY_MAGICS: dict[bytes, str] = {
    b"lmgg": "ggml (unversioned, pre-GGUF)",
    b"fmgg": "ggmf (pre-GGUF)",
    b"tjgg": "ggjt (pre-GGUF)",
    b"algg": "ggla (pre-GGUF LoRA)",
    b"ggml": "ggml (unversioned, pre-GGUF)",
    b"ggmf": "ggmf (pre-GGUF)",
    b"ggjt": "ggjt (pre-GGUF)",
    b"ggla": "ggla (pre-GGUF LoRA)",
}
DEFAULT_ALIGNMENT = 32
MAX_NAME_BYTES = 63  # GGML_MAX_NAME is 64 including the NUL
MAX_DIMS = 4
MAX_STRING_BYTES = 1 << 30


def align_up(n: int, alignment: int) -> int:
    """``n`` rounded up to a multiple of ``alignment`` (where the next tensor may start)."""
    return -(-n // alignment) * alignment
