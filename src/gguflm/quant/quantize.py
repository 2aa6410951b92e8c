"""ggml's quantizers, byte for byte: what ``ggml_quantize_chunk`` writes without an importance
matrix, for every type llama-quantize makes that way.

- Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, IQ4_NL, IQ4_XS: numba kernels
  (``quantize_kernels.py``; the K-quants search trial scales float op for float op as
  ggml does), run over row chunks on ``threads`` threads. The five simple types also have
  numpy twins here (``NUMPY_TWINS``), which the tests hold the kernels to.
- MXFP4, TQ1_0, TQ2_0, F16, BF16, F32: numpy, vectorised over blocks.

The simple types compute the scale in float32 exactly as ggml does (``d = max / -8``,
``id = 1.0f/d``), round it to f16 with round-to-nearest-even (``GGML_FP32_TO_FP16``) and
round each value with ggml's float32 expression (``(int8_t)(x*id + 8.5f)`` truncates;
``roundf``/``lroundf`` round halves away from zero).

The IQ1/IQ2/IQ3 types are not supported: llama-quantize makes them with an importance matrix.
Input must be finite (ggml's output for NaN/inf is undefined, and llama-quantize rejects what
it makes of them); a block whose f16 scale overflows (|x| beyond ~65504 x the type's levels)
is refused as llama-quantize's ``ggml_validate_row_data`` refuses it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..gguf.errors import TensorDataError
from ..gguf.types import GGMLType
from ..gguf.writer import to_bf16_bits
from .formats import FORMATS

f32 = np.float32
T = GGMLType


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


def _round_away(v: np.ndarray) -> np.ndarray:
    """C's ``roundf``/``lroundf``: halves away from zero (exact in float64, |v| < 2**23)."""
    return np.sign(v) * np.floor(np.abs(v).astype(np.float64) + 0.5)


# -- the simple types --------------------------------------------------------------------------

def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    amax = np.abs(x).max(axis=1, keepdims=True)
    d = amax / f32(127)
    q = _round_away(x * _inverse(d)).astype(np.int8)
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


# ggml's kvalues_mxfp4: the E2M1 values, doubled (d below is half the E8M0 scale)
_KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], f32)


def quantize_mxfp4(x: np.ndarray) -> np.ndarray:
    # e = floor(log2(amax)) - 2 + 127 as ggml's (uint8_t) cast of a float keeps it (the low
    # byte of the int); log2f is taken as the float32 rounding of the exact log2
    amax = np.abs(x).max(axis=1)
    with np.errstate(divide="ignore"):
        lg = np.floor(np.log2(amax.astype(np.float64)).astype(f32))
    e = np.where(amax > 0, (np.nan_to_num(lg, neginf=0).astype(np.int64) + 125) & 0xFF, 0)
    d = np.ldexp(f32(1), (e - 128).astype(np.int32)).astype(f32)  # GGML_E8M0_TO_FP32_HALF
    # nearest level, the first on ties: |k*d - x| in float32, as best_index_mxfp4 computes
    err = np.abs(_KVALUES_MXFP4[None, None, :] * d[:, None, None] - x[:, :, None])
    q = np.argmin(err, axis=2).astype(np.uint8)
    return np.concatenate([e.astype(np.uint8)[:, None], _pack_nibbles(q)], axis=1)


def _trits(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TQ1_0/TQ2_0: d = max |x| per block, each value as lroundf(x/d) + 1 in {0, 1, 2}."""
    d = np.abs(x).max(axis=1, keepdims=True)
    v = x * _inverse(d)
    # a subnormal d has no finite inverse: x/d is then +-inf or NaN, for which x86's lroundf
    # returns LONG_MIN, and ggml's int conversion of LONG_MIN + 1 keeps 1
    t = np.where(np.isfinite(v), _round_away(v) + 1, 1).astype(np.int32)
    return d, t


def _base3(t: np.ndarray, count: int, stride: int) -> np.ndarray:
    """``count`` trits per byte, the first one most significant: byte m packs values
    m, m + stride, ... of ``t`` (n, count * stride) -> (n, stride)."""
    q = np.zeros((t.shape[0], stride), np.int32)
    for k in range(count):
        q = q * 3 + t[:, k * stride:(k + 1) * stride]
    return q


def _ceil_243(q: np.ndarray) -> np.ndarray:
    """A base-3 number of 5 trits < 243 -> a byte, rounding up (``q * 256 / 243``)."""
    return ((q * 256 + 242) // 243).astype(np.uint8)


def quantize_tq1_0(x: np.ndarray) -> np.ndarray:
    # block_tq1_0: qs[48] (5 trits a byte: 32 bytes over 160 values, 16 over the next 80),
    # qh[4] (4 trits a byte, over the last 16 values, shifted to the top trit), d
    d, t = _trits(x)
    qs32 = _ceil_243(_base3(t[:, :160], 5, 32))
    qs16 = _ceil_243(_base3(t[:, 160:240], 5, 16))
    qh = _ceil_243(_base3(t[:, 240:], 4, 4) * 3)
    return np.concatenate([qs32, qs16, qh, _f16(d)], axis=1)


def quantize_tq2_0(x: np.ndarray) -> np.ndarray:
    # block_tq2_0: qs[64] (byte m of each 32 holds values m + 32k, k = 0..3, at bits 2k), d
    d, t = _trits(x)
    t = t.reshape(-1, 2, 4, 32)
    qs = t[:, :, 0] | (t[:, :, 1] << 2) | (t[:, :, 2] << 4) | (t[:, :, 3] << 6)
    return np.concatenate([qs.reshape(-1, 64).astype(np.uint8), _f16(d)], axis=1)


# -- the numba kernels -----------------------------------------------------------------------

def _kernel(kernel: str, gtype: GGMLType,
            f16_fields: tuple[str, ...]) -> Callable[[np.ndarray], np.ndarray]:
    """A quantize_kernels kernel as a blocks -> bytes function; we store its f16 fields.
    numba is imported on first use, so that importing gguflm.quant stays light."""
    fmt = FORMATS[gtype]

    def run(x: np.ndarray) -> np.ndarray:
        from . import quantize_kernels

        out = np.zeros((len(x), fmt.type_size), np.uint8)
        d = np.zeros((len(x), len(f16_fields)), f32)
        getattr(quantize_kernels, kernel)(x, out, d)
        for i, name in enumerate(f16_fields):
            off = fmt[name].offset
            out[:, off:off + 2] = _f16(d[:, i])
        return out

    run.__name__ = f"quantize_{gtype.ggml_name.lower()}"
    return run


_NUMBA = {
    T.Q4_0: ("q4_0_blocks", ("d",)), T.Q4_1: ("q4_1_blocks", ("d", "m")),
    T.Q5_0: ("q5_0_blocks", ("d",)), T.Q5_1: ("q5_1_blocks", ("d", "m")),
    T.Q8_0: ("q8_0_blocks", ("d",)),
    T.Q2_K: ("q2_k_blocks", ("d", "dmin")), T.Q3_K: ("q3_k_blocks", ("d",)),
    T.Q4_K: ("q4_k_blocks", ("d", "dmin")), T.Q5_K: ("q5_k_blocks", ("d", "dmin")),
    T.Q6_K: ("q6_k_blocks", ("d",)), T.IQ4_NL: ("iq4_nl_blocks", ("d",)),
    T.IQ4_XS: ("iq4_xs_blocks", ("d",)),
}

# block type -> (n_blocks, block_size) float32 -> (n_blocks, type_size) uint8
QUANTIZERS: dict[GGMLType, Callable[[np.ndarray], np.ndarray]] = {
    **{t: _kernel(k, t, fields) for t, (k, fields) in _NUMBA.items()},
    T.MXFP4: quantize_mxfp4,
    T.TQ1_0: quantize_tq1_0,
    T.TQ2_0: quantize_tq2_0,
}
# the numpy originals of the simple kernels (slow; the tests compare the two)
NUMPY_TWINS: dict[GGMLType, Callable[[np.ndarray], np.ndarray]] = {
    T.Q8_0: quantize_q8_0, T.Q4_0: quantize_q4_0, T.Q4_1: quantize_q4_1,
    T.Q5_0: quantize_q5_0, T.Q5_1: quantize_q5_1,
}

# float32 rows -> the plain types' bytes
_PLAIN: dict[GGMLType, Callable[[np.ndarray], np.ndarray]] = {
    T.F32: lambda x: x.astype("<f4"),
    T.F16: lambda x: x.astype("<f2"),
    T.BF16: lambda x: to_bf16_bits(x).astype("<u2"),
}

# made by llama-quantize only with an importance matrix
NEEDS_IMATRIX = frozenset({T.IQ1_S, T.IQ1_M, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS,
                           T.IQ3_S})


def supported_types() -> list[GGMLType]:
    """The types ``quantize`` can make."""
    return [*_PLAIN, *QUANTIZERS]


def quantize(x: np.ndarray, gtype: GGMLType, *, name: str | None = None,
             threads: int = 1) -> np.ndarray:
    """Quantize float32 ``x`` (any shape; rows along the last axis) to ``gtype``.

    Returns uint8 of shape ``(*x.shape[:-1], row_bytes)``: the bytes ggml's
    ``ggml_quantize_chunk`` writes without an importance matrix (``.tobytes()`` for a
    ``bytes`` object). ``threads``: how many threads share the rows. Raises
    ``TensorDataError`` (naming ``name``) for an unsupported type, a row length that is
    not a multiple of the block size, non-finite input, or a scale beyond f16's range.
    """
    gtype = GGMLType(gtype)
    fn = QUANTIZERS.get(gtype) or _PLAIN.get(gtype)
    if fn is None:
        supported = ", ".join(t.ggml_name for t in supported_types())
        why = " (it needs an importance matrix; not supported yet)" \
            if gtype in NEEDS_IMATRIX else ""
        raise TensorDataError(f"cannot quantize to {gtype.ggml_name}{why}; supported: "
                              f"{supported}", tensor=name)
    x = np.asarray(x)
    if x.ndim == 0 or x.shape[-1] % gtype.block_size:
        raise TensorDataError(f"row length {x.shape[-1] if x.ndim else 0} is not a multiple "
                              f"of the {gtype.ggml_name} block size {gtype.block_size}",
                              tensor=name)
    out_shape = (*x.shape[:-1], gtype.row_bytes(x.shape[-1]))
    flat = np.ascontiguousarray(x, dtype=f32).reshape(-1, gtype.block_size)
    bad = flat.size - int(np.isfinite(flat).sum())
    if bad:
        raise TensorDataError(f"{bad} values are NaN or infinite; cannot quantize to "
                              f"{gtype.ggml_name}", tensor=name)
    with np.errstate(all="ignore"):  # huge scales overflow f16 to inf: refused below
        raw = _run(fn, flat, gtype in _NUMBA, threads)
    _check_finite_scales(gtype, raw, name)
    return raw.view(np.uint8).reshape(out_shape)


def _run(fn: Callable[[np.ndarray], np.ndarray], blocks: np.ndarray, numba: bool,
         threads: int) -> np.ndarray:
    """``fn`` over ``blocks`` in pieces: threads share the numba kernels (which release the
    GIL); the numpy ones run in slices of 256k values, which keep their temporaries small
    (MXFP4 compares each value with 16 levels)."""
    step = max(1, (1 << 19 if numba else 1 << 18) // blocks.shape[1])
    pieces = [slice(i, i + step) for i in range(0, len(blocks), step)]
    if len(pieces) <= 1:
        return fn(blocks)
    if numba and threads > 1:
        with ThreadPoolExecutor(min(threads, len(pieces))) as pool:
            parts = list(pool.map(lambda s: fn(blocks[s]), pieces))
    else:
        parts = [fn(blocks[s]) for s in pieces]
    return np.concatenate(parts)


def _check_finite_scales(gtype: GGMLType, raw: np.ndarray, name: str | None) -> None:
    """ggml_validate_row_data's check of the output: no f16 scale (or F16/BF16 value) is
    inf or NaN."""
    if gtype in (T.F16, T.BF16):
        bits = raw.view(np.uint16)
        top = 0x7C00 if gtype == T.F16 else 0x7F80
        bad = int(((bits & top) == top).sum())
    elif gtype == T.F32 or gtype not in FORMATS:
        return
    else:
        fmt = FORMATS[gtype]
        bad = 0
        for f in fmt.fields:
            if f.kind == "f16":
                h = raw[:, f.offset:f.offset + 2].copy().view("<u2")
                bad += int(((h & 0x7C00) == 0x7C00).sum())
    if bad:
        raise TensorDataError(f"{bad} {gtype.ggml_name} values or scales overflow (too large "
                              "for f16); llama-quantize refuses such data too", tensor=name)
