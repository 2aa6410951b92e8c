"""Block layouts of every ggml tensor type: which bytes of a block hold what.

One small ``BlockFormat`` per type, transcribed from the ``block_*`` structs of ggml's
``ggml-common.h``: the fields in file order (name, byte offset, element kind, count), the
elements per block and the bytes per block. The dequantizers (``simple.py``, ``kquants.py``,
``iquants.py``) read fields through ``BlockFormat.field`` so that every byte offset is written
down once, here. All multi-byte fields are little-endian, as ggml lays them out on disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, cached_property

import numpy as np

from ..gguf.types import TYPE_TRAITS, GGMLType

QK_K = 256  # elements per super-block of the K-, IQ- and TQ-quants

# element kinds of a field and their numpy dtypes (explicitly little-endian)
_KIND_DTYPES = {
    "f16": np.dtype("<f2"),  # ggml_half
    "u8": np.dtype("u1"),
    "i8": np.dtype("i1"),
    "u16": np.dtype("<u2"),
    "u32": np.dtype("<u4"),
}


@dataclass(frozen=True)
class Field:
    """One member of a block struct: ``count`` elements of ``kind`` at byte ``offset``."""

    name: str
    kind: str
    count: int
    offset: int = 0

    @property
    def nbytes(self) -> int:
        return _KIND_DTYPES[self.kind].itemsize * self.count


@dataclass(frozen=True)
class BlockFormat:
    """The layout of one quantized block type (``block_size`` elements in ``type_size`` bytes)."""

    type: GGMLType
    block_size: int
    fields: tuple[Field, ...]

    @cached_property  # on every product's path: computed once
    def type_size(self) -> int:
        return sum(f.nbytes for f in self.fields)

    def __getitem__(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"{self.type.ggml_name} blocks have no field {name!r}")

    def field(self, blocks: np.ndarray, name: str) -> np.ndarray:
        """Field ``name`` of every block: ``(n_blocks, count)`` (``(n_blocks,)`` if count is 1).

        ``blocks`` is ``(n_blocks, type_size)`` uint8 with contiguous rows; the result is a
        strided view into it.
        """
        f = self[name]
        raw = blocks[:, f.offset:f.offset + f.nbytes]
        dt = _KIND_DTYPES[f.kind]
        out = raw if dt == raw.dtype else raw.view(dt)  # may be unaligned: numpy copes
        return out[:, 0] if f.count == 1 else out

    def scale(self, blocks: np.ndarray, name: str = "d") -> np.ndarray:
        """An f16 scale field as float32 ``(n_blocks, 1)``, ready to broadcast over a block.

        The f16 -> f32 conversion is exact, as ggml's ``GGML_FP16_TO_FP32`` is.
        """
        return f16_to_f32(self.field(blocks, name))[:, None]


def f16_to_f32(h: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """IEEE half bits (any 2-byte dtype) -> float32, exactly as ggml's GGML_FP16_TO_FP32.

    numpy's own float16 cast is scalar code; integer and float32 passes are much faster:
    move sign/exponent/mantissa into float32 position, then rescale the exponent by 2**112
    (which also normalizes subnormals exactly). Inf/NaN get exponent 255; NaNs come out
    quiet, as ggml's converter makes them.
    """
    h = np.asarray(h).view(np.int16)
    if h.size <= _SMALL and out is None:
        return _f16_table()[h.view(np.uint16)]  # fewer numpy calls for a handful of scales
    if out is None:
        out = np.empty(h.shape, dtype=np.float32)
    bits = out.view(np.uint32)
    # sign-extending shift puts the sign at bit 31 (plus junk at 28..30, masked off)
    np.left_shift(h, 13, out=out.view(np.int32), dtype=np.int32)
    bits &= np.uint32(0x8FFFE000)
    out *= np.float32(2.0 ** 112)
    special = (h.view(np.uint16) & 0x7C00) == 0x7C00
    if special.any():
        hs = h.view(np.uint16)[special].astype(np.uint32)
        man = (hs & 0x3FF) << 13
        quiet = np.where(man != 0, np.uint32(0x00400000), np.uint32(0))
        bits[special] = ((hs & 0x8000) << 16) | np.uint32(0x7F800000) | man | quiet
    return out


_SMALL = 2048


@cache
def _f16_table() -> np.ndarray:
    """f16_to_f32 of all 65536 bit patterns (256 KiB), for short inputs."""
    return f16_to_f32(np.arange(1 << 16, dtype=np.uint16), np.empty(1 << 16, np.float32))


def _fmt(t: GGMLType, block_size: int, *fields: tuple[str, str, int]) -> BlockFormat:
    placed, offset = [], 0
    for name, kind, count in fields:
        f = Field(name, kind, count, offset)
        placed.append(f)
        offset += f.nbytes
    return BlockFormat(t, block_size, tuple(placed))


T = GGMLType
# Field order and sizes follow the structs in ggml-common.h.
FORMATS: dict[GGMLType, BlockFormat] = {f.type: f for f in [
    _fmt(T.Q4_0, 32, ("d", "f16", 1), ("qs", "u8", 16)),
    _fmt(T.Q4_1, 32, ("d", "f16", 1), ("m", "f16", 1), ("qs", "u8", 16)),
    _fmt(T.Q5_0, 32, ("d", "f16", 1), ("qh", "u8", 4), ("qs", "u8", 16)),
    _fmt(T.Q5_1, 32, ("d", "f16", 1), ("m", "f16", 1), ("qh", "u8", 4), ("qs", "u8", 16)),
    _fmt(T.Q8_0, 32, ("d", "f16", 1), ("qs", "i8", 32)),
    _fmt(T.Q8_1, 32, ("d", "f16", 1), ("s", "f16", 1), ("qs", "i8", 32)),
    _fmt(T.Q1_0, 128, ("d", "f16", 1), ("qs", "u8", 16)),
    _fmt(T.Q2_0, 64, ("d", "f16", 1), ("qs", "u8", 16)),
    _fmt(T.MXFP4, 32, ("e", "u8", 1), ("qs", "u8", 16)),  # e: E8M0 shared exponent
    _fmt(T.NVFP4, 64, ("d", "u8", 4), ("qs", "u8", 32)),  # d: UE4M3 scale per 16 values
    _fmt(T.IQ4_NL, 32, ("d", "f16", 1), ("qs", "u8", 16)),
    _fmt(T.Q2_K, QK_K, ("scales", "u8", 16), ("qs", "u8", 64), ("d", "f16", 1),
         ("dmin", "f16", 1)),
    _fmt(T.Q3_K, QK_K, ("hmask", "u8", 32), ("qs", "u8", 64), ("scales", "u8", 12),
         ("d", "f16", 1)),
    _fmt(T.Q4_K, QK_K, ("d", "f16", 1), ("dmin", "f16", 1), ("scales", "u8", 12),
         ("qs", "u8", 128)),
    _fmt(T.Q5_K, QK_K, ("d", "f16", 1), ("dmin", "f16", 1), ("scales", "u8", 12),
         ("qh", "u8", 32), ("qs", "u8", 128)),
    _fmt(T.Q6_K, QK_K, ("ql", "u8", 128), ("qh", "u8", 64), ("scales", "i8", 16),
         ("d", "f16", 1)),
    _fmt(T.Q8_K, QK_K, ("d", "u8", 4), ("qs", "i8", 256), ("bsums", "u8", 32)),  # d is f32
    _fmt(T.IQ2_XXS, QK_K, ("d", "f16", 1), ("qs", "u8", 64)),
    _fmt(T.IQ2_XS, QK_K, ("d", "f16", 1), ("qs", "u16", 32), ("scales", "u8", 8)),
    _fmt(T.IQ2_S, QK_K, ("d", "f16", 1), ("qs", "u8", 64), ("qh", "u8", 8),
         ("scales", "u8", 8)),
    _fmt(T.IQ3_XXS, QK_K, ("d", "f16", 1), ("qs", "u8", 96)),
    _fmt(T.IQ3_S, QK_K, ("d", "f16", 1), ("qs", "u8", 64), ("qh", "u8", 8),
         ("signs", "u8", 32), ("scales", "u8", 4)),
    _fmt(T.IQ1_S, QK_K, ("d", "f16", 1), ("qs", "u8", 32), ("qh", "u16", 8)),
    _fmt(T.IQ1_M, QK_K, ("qs", "u8", 32), ("qh", "u8", 16), ("scales", "u16", 4)),
    _fmt(T.IQ4_XS, QK_K, ("d", "f16", 1), ("scales_h", "u16", 1), ("scales_l", "u8", 4),
         ("qs", "u8", 128)),
    _fmt(T.TQ1_0, QK_K, ("qs", "u8", 48), ("qh", "u8", 4), ("d", "f16", 1)),
    _fmt(T.TQ2_0, QK_K, ("qs", "u8", 64), ("d", "f16", 1)),
]}
del T

# The layouts must agree with the type table the reader uses (a typo here would misread
# every tensor of that type), so check once at import.
for _t, _f in FORMATS.items():
    assert (_f.block_size, _f.type_size) == TYPE_TRAITS[_t], _t
