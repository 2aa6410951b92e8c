"""ggml's reference quantizers (``quantize_row_*_ref``) for Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1.

Byte for byte the same output: the scale is computed in float32 exactly as ggml does
(``d = max / -8``, ``id = 1.0f/d``), rounded to f16 with round-to-nearest-even (ggml's
``GGML_FP32_TO_FP16``), and each value is rounded with ggml's float32 expression
(``(int8_t)(x*id + 8.5f)`` truncates; ``roundf`` rounds halves away from zero).
"""

from __future__ import annotations

import numpy as np

from ..gguf.errors import TensorDataError
from ..gguf.types import GGMLType

f32 = np.float32


def _inverse(d: np.ndarray) -> np.ndarray:
    """ggml's ``id = d ? 1.0f/d : 0.0f`` (float32)."""
    with np.errstate(divide="ignore"):
        return np.where(d != 0, f32(1) / d, f32(0)).astype(f32)


def _first(x: np.ndarray, i: np.ndarray) -> np.ndarray:
    return np.take_along_axis(x, i[:, None], axis=1)


def _signed_absmax(x: np.ndarray) -> np.ndarray:
    """Per block, the value of largest magnitude with its sign (the first one on ties).

    ggml starts from ``max = 0.0f`` and replaces it only on a strictly larger magnitude, so
    an all-zero block keeps +0.0 even if its zeros are negative.
    """
    m = _first(x, np.argmax(np.abs(x), axis=1))  # argmax: the first maximum, like `<`
    return np.where(m == 0, f32(0), m)


def _f16(d: np.ndarray) -> np.ndarray:
    """float32 -> f16 bytes, round-to-nearest-even. (n,) or (n, 1) -> (n, 2) uint8."""
    return d.reshape(-1, 1).astype("<f2").view(np.uint8)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 32) values < 16 -> 16 bytes: value j in the low nibble, j + 16 in the high."""
    return (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)


def _pack_high(q: np.ndarray) -> np.ndarray:
    """Bit 4 of each of the 32 values -> 4 bytes (little-endian uint32, bit j = value j)."""
    return np.packbits((q >> 4) & 1, axis=1, bitorder="little")


def _trunc_u8(v: np.ndarray) -> np.ndarray:
    """C's float -> integer conversion (toward zero) of small non-negative values."""
    return np.trunc(v).astype(np.int32)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    amax = np.abs(x).max(axis=1, keepdims=True)
    d = amax / f32(127)
    v = x * _inverse(d)
    # roundf: half away from zero; exact in float64 since |v| < 2**23
    q = (np.sign(v) * np.floor(np.abs(v).astype(np.float64) + 0.5)).astype(np.int8)
    return np.concatenate([_f16(d), q.view(np.uint8)], axis=1)


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    d = _signed_absmax(x) / f32(-8)
    q = np.minimum(15, _trunc_u8(x * _inverse(d) + f32(8.5)))
    return np.concatenate([_f16(d), _pack_nibbles(q)], axis=1)


def quantize_q5_0(x: np.ndarray) -> np.ndarray:
    d = _signed_absmax(x) / f32(-16)
    q = np.minimum(31, _trunc_u8(x * _inverse(d) + f32(16.5)))
    return np.concatenate([_f16(d), _pack_high(q), _pack_nibbles(q & 0xF)], axis=1)


def _min_max(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # the first minimum/maximum, as ggml's strict comparisons keep it (matters for -0.0)
    lo = _first(x, np.argmin(x, axis=1))
    hi = _first(x, np.argmax(x, axis=1))
    d = (hi - lo) / f32(levels)
    return lo, d, (x - lo) * _inverse(d)


def quantize_q4_1(x: np.ndarray) -> np.ndarray:
    lo, d, v = _min_max(x, 15)
    q = np.minimum(15, _trunc_u8(v + f32(0.5)))
    return np.concatenate([_f16(d), _f16(lo), _pack_nibbles(q)], axis=1)


def quantize_q5_1(x: np.ndarray) -> np.ndarray:
    lo, d, v = _min_max(x, 31)
    q = _trunc_u8(v + f32(0.5)) & 0xFF  # (uint8_t) conversion, no clamp in ggml
    return np.concatenate([_f16(d), _f16(lo), _pack_high(q), _pack_nibbles(q & 0xF)],
                          axis=1)


QUANTIZERS = {
    GGMLType.Q8_0: quantize_q8_0,
    GGMLType.Q4_0: quantize_q4_0,
    GGMLType.Q4_1: quantize_q4_1,
    GGMLType.Q5_0: quantize_q5_0,
    GGMLType.Q5_1: quantize_q5_1,
}


def quantize(x: np.ndarray, gtype: GGMLType, *, name: str | None = None) -> np.ndarray:
    """Quantize float32 ``x`` (any shape; rows along the last axis) to ggml blocks.

    Returns uint8 of shape ``(*x.shape[:-1], row_bytes)``: the bytes ggml's reference
    quantizer writes. Raises ``TensorDataError`` for an unsupported type or a row length
    that is not a multiple of 32.
    """
    gtype = GGMLType(gtype)
    fn = QUANTIZERS.get(gtype)
    if fn is None:
        supported = ", ".join(t.ggml_name for t in QUANTIZERS)
        raise TensorDataError(f"cannot quantize to {gtype.ggml_name} (supported: {supported})",
                              tensor=name)
    x = np.asarray(x)
    if x.ndim == 0 or x.shape[-1] % gtype.block_size:
        raise TensorDataError(f"row length {x.shape[-1] if x.ndim else 0} is not a multiple "
                              f"of the {gtype.ggml_name} block size {gtype.block_size}",
                              tensor=name)
    blocks = np.ascontiguousarray(x, dtype=f32).reshape(-1, gtype.block_size)
    with np.errstate(all="ignore"):  # huge scales overflow f16 to inf, as in ggml
        raw = fn(blocks)
    return raw.reshape(*x.shape[:-1], gtype.row_bytes(x.shape[-1]))
