"""Activation quantization: ``x`` to 8 bits per block as ggml's x86 code rounds it
(``quantize_row_q8_0``/``q8_1`` for the 32-element legacy types, with the Q8_1 block sums
for Q4_1/Q5_1; ``quantize_row_q8_K`` for the K-quants), so that our logits track
llama.cpp's; and the sets of arrays the integer tiles read (``ActivationSet``).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit, prange

from ..gguf.types import GGMLType
from . import jitcache  # noqa: F401 - stamps the cached kernels below (before any njit)
from .floatbits import round_f16
from .int_gemm import PLUS_128_KINDS as GEMM_PLUS_128
from .int_tiles import BATCH_MIN_ROWS
from .int_weights import vnni_offset, wide_plus_128
from .kerneltypes import KERNEL_TYPES, pack_activation_blocks

# the type ids by activation type, as constant tuples (numba freezes them into the code)
Q8_0_KINDS = tuple(int(t) for t, k in KERNEL_TYPES.items() if k.act != GGMLType.Q8_K)
Q8_K_KINDS = tuple(int(t) for t, k in KERNEL_TYPES.items() if k.act == GGMLType.Q8_K)
# the types whose mins multiply the activations' 16-value sums (Q2_K; ggml's ``bsums``)
SUMS16_KINDS = tuple(int(t) for t, k in KERNEL_TYPES.items()
                     if k.offset == "dmin" and k.groups == 16) or (-1,)

# x quantized for one activation type: qa (n, K) i8, da (n, K/QK) f32 block scales, aux
# (n, K/32) f32 (Q8_1 block sums or Q8_K 32-sums), cor (n, K/4) i32 lane corrections (the
# Q8_0 set; the Q8_K set's: (n, K/16) i32 16-value sums, for Q2_K) or no rows, qu (n, K)
# i8 the values plus 128 or no rows
ActivationSet = namedtuple("ActivationSet", ("qa", "da", "aux", "cor", "qu"))


@njit(cache=True, nogil=True)
def _round_f16(v: np.ndarray) -> None:
    """Round float32 values in place to the nearest float16 value (ties to even).

    ggml stores Q8_0/Q8_1 scales as fp16 and multiplies with the rounded value.
    """
    for i in range(v.shape[0]):
        v[i] = round_f16(v[i])


_MAGNITUDE = np.int32(0x7FFFFFFF)  # a float32's bits less its sign
_INF_BITS = np.int32(0x7F800000)  # above it: NaN


@njit(cache=True, nogil=True)
def _magnitude(bits):  # noqa: ANN001, ANN202
    """A float32's magnitude as int32 bits, which order as the magnitudes do; NaN's 0 (no
    ``>`` comparison takes a NaN)."""
    v = np.int32(bits & _MAGNITUDE)  # (int32 throughout: 16 lanes a vector, not 8)
    return v if v <= _INF_BITS else np.int32(0)


@njit(cache=True, nogil=True)
def _first_largest(seg):  # noqa: ANN001, ANN202
    """(magnitude bits, index) of the first value of the float32 bits ``seg`` whose
    magnitude is the largest, what ggml's ``if (ax > amax)`` scan finds; 0 for no nonzero
    (non-NaN) value. Integer max and min over the whole block: the compiler runs both in
    vector lanes, which a float comparison chain's order forbids."""
    m = np.int32(0)
    for j in range(seg.shape[0]):
        m = max(m, _magnitude(seg[j]))
    n = np.int32(seg.shape[0])
    first = n
    for j in range(seg.shape[0]):
        first = min(first, np.int32(j) if _magnitude(seg[j]) == m else n)
    return m, first


@njit(cache=True, nogil=True)
def quantize_q8_0(x: np.ndarray, qa: np.ndarray, da: np.ndarray, sa: np.ndarray) -> None:
    """The hot loop (Q8_0/Q8_1). x (n, K) f32 -> qa (n, K) i8, da (n, K/32) f32 (fp16
    values), sa (n, K/32) f32.

    ggml's x86 quantize_row_q8_0/q8_1: d = amax/127 stored as fp16, q = rint(x * 127/amax);
    sa = fp16(d * sum(q)) is Q8_1's block sum (used by Q4_1/Q5_1), with d the float32 scale
    before its own fp16 rounding (ggml's AVX code; fp16(fp16(d) * sum) is one fp16 step off
    in about a fifth of the blocks).
    """
    n, k = x.shape
    nb = k // 32
    for i in range(n):
        for b in range(nb):
            amax = np.float32(0.0)
            for j in range(32):
                amax = max(amax, abs(x[i, b * 32 + j]))
            d = amax / np.float32(127.0)
            inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
            s = 0
            for j in range(32):
                q = np.int32(np.rint(x[i, b * 32 + j] * inv))
                qa[i, b * 32 + j] = q
                s += q
            da[i, b] = d
            sa[i, b] = d * np.float32(s)  # d still float32 here, as in ggml's x86 code
        _round_f16(da[i])
        _round_f16(sa[i])


@njit(cache=True, nogil=True, error_model="numpy")  # 1 / -0.0 is -inf, not an exception
def quantize_q8_k(x: np.ndarray, qa: np.ndarray, da: np.ndarray, bsum: np.ndarray) -> None:
    """The hot loop (Q8_K). x (n, K) f32 -> qa (n, K) i8, da (n, K/256) f32, bsum (n, K/32)
    f32 (integer sums of each 32 values: Q8_K's 16-value bsums in pairs, as the Q4_K/Q5_K
    minimums use them).

    ggml's quantize_row_q8_K: scale from the signed value of largest magnitude (the first
    one, ``_first_largest``), iscale = -127/max, q = min(127, nearest_int(iscale * x)),
    d = 1/iscale.
    """
    n, k = x.shape
    nb = k // 256
    for i in range(n):
        r, qr = x[i], qa[i]
        bits = r.view(np.int32)
        for b in range(nb):
            mag, first = _first_largest(bits[b * 256:(b + 1) * 256])
            if mag == 0:
                qr[b * 256:(b + 1) * 256] = 0
                bsum[i, b * 8:(b + 1) * 8] = 0
                da[i, b] = 0
                continue
            iscale = np.float32(-127.0) / r[b * 256 + first]
            for g in range(8):
                s = np.int32(0)
                o = b * 256 + g * 32
                for j in range(32):
                    q = min(np.int32(127), np.int32(np.rint(iscale * r[o + j])))
                    qr[o + j] = np.int8(q)
                    s += q
                bsum[i, b * 8 + g] = s
            da[i, b] = np.float32(1.0) / iscale


@njit(cache=True, nogil=True)
def _activation_arrays(n, k, kind, plus_128):  # noqa: ANN001, ANN202
    """Empty (qa (n, K) i8, da (n, K/QK) f32, aux (n, K/32) f32, qu (n or 0, K) i8) for
    weights of ggml type ``kind`` (qu's rows only if ``plus_128``)."""
    if kind in Q8_K_KINDS:
        qk = 256
    elif kind in Q8_0_KINDS:
        qk = 32
    else:
        raise ValueError("no integer kernel for this ggml type id")
    return (np.empty((n, k), np.int8), np.empty((n, k // qk), np.float32),
            np.empty((n, k // 32), np.float32), np.empty((n if plus_128 else 0, k), np.int8))


@njit(cache=True, nogil=True)
def _quantize_into(x, kind, qa, da, aux, qu):  # noqa: ANN001, ANN202
    """x's rows into ``_activation_arrays``' arrays (and qu's, if it has rows: the bytes
    ``qa + 128``, the top bit flipped, what the lanes tiles multiply the signed weights
    by)."""
    if kind in Q8_K_KINDS:
        quantize_q8_k(x, qa, da, aux)
    else:
        quantize_q8_0(x, qa, da, aux)
    if qu.shape[0]:
        for i in range(qa.shape[0]):
            for j in range(qa.shape[1]):
                qu[i, j] = qa[i, j] ^ np.int8(-128)


@njit(cache=True, nogil=True)
def quantize_activations(x, kind):  # noqa: ANN001, ANN201
    """The 8-bit form of ``x (n, K)`` that weights of ggml type ``kind`` multiply with:
    ``(qa (n, K) i8, da (n, K/QK) f32, aux (n, K/32) f32)`` with aux the Q8_1 sums or
    Q8_K 32-sums."""
    qa, da, aux, qu = _quantize_rows(x, kind, False)
    return qa, da, aux


def activation_blocks(x: np.ndarray, act: GGMLType) -> np.ndarray:
    """ggml's ``from_float`` of ``x (n, K)`` f32 for ``act`` = Q8_0, Q8_1 or Q8_K, computed
    by the kernels' own quantizers: ``(n, K / QK * type_size)`` uint8 in ggml's layout."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    act = GGMLType(act)
    kind = Q8_K_KINDS[0] if act == GGMLType.Q8_K else Q8_0_KINDS[0]
    qa, da, aux = quantize_activations(x, kind)
    return pack_activation_blocks(act, qa, da, aux)


# -- the arrays that let VNNI skip the sign step (int_tiles._emit_block's ``shift``) --------

# the types whose 512-bit lanes tiles or interleaved GEMM multiply the Q8_K activations
# plus 128
_PLUS_128_KINDS = tuple(int(t) for t, k in KERNEL_TYPES.items() if wide_plus_128(k)
                        or (k.act == GGMLType.Q8_K and int(t) in GEMM_PLUS_128)) or (-1,)
_OFFSETS = [(int(t), vnni_offset(k)) for t, k in KERNEL_TYPES.items() if vnni_offset(k)]
_OFFSET_KINDS = tuple(t for t, _ in _OFFSETS) or (-1,)  # constant tuples for numba
_OFFSET_VALUES = tuple(o for _, o in _OFFSETS) or (0,)


@njit(cache=True, nogil=True)
def _shared_offset(kinds, count):  # noqa: ANN001, ANN201
    """The ``vnni_offset`` the products' types share (0: none has one, or they differ)."""
    off = 0
    for m in range(count):
        for j in range(len(_OFFSET_KINDS)):
            if _OFFSET_KINDS[j] == kinds[m]:
                if off and off != _OFFSET_VALUES[j]:
                    return 0
                off = _OFFSET_VALUES[j]
    return off


@njit(cache=True, nogil=True)
def _any_of(kinds, count, table):  # noqa: ANN001, ANN201
    """Whether some of the products' types is in ``table`` (a constant tuple of ids)."""
    for m in range(count):
        if kinds[m] in table:
            return True
    return False


@njit(cache=True, nogil=True)
def _lane_corrections(qa, off):  # noqa: ANN001, ANN201
    """qa (n, K) i8 -> (n, K/4) i32: ``-off`` times the sum of each 4 activations (one
    ``vpdpbusd`` lane), the start of the shifted weights' integer dots."""
    n, k = qa.shape
    cor = np.empty((n, k // 4), np.int32)
    for i in range(n):
        for j in range(k // 4):
            t = (np.int32(qa[i, 4 * j]) + np.int32(qa[i, 4 * j + 1])
                 + np.int32(qa[i, 4 * j + 2]) + np.int32(qa[i, 4 * j + 3]))
            cor[i, j] = -off * t
    return cor


@njit(cache=True, nogil=True)
def _sums16(qa):  # noqa: ANN001, ANN201
    """qa (n, K) i8 -> (n, K/16) i32: the sum of each 16 values (ggml's Q8_K ``bsums``)."""
    n, k = qa.shape
    out = np.empty((n, k // 16), np.int32)
    for i in range(n):
        for j in range(k // 16):
            s = np.int32(0)
            for e in range(16):
                s += np.int32(qa[i, 16 * j + e])
            out[i, j] = s
    return out


@njit(cache=True, nogil=True)
def _no_activations(k):  # noqa: ANN001, ANN201
    """An ``ActivationSet`` of no rows (an activation type no product needs)."""
    return ActivationSet(np.empty((0, k), np.int8), np.empty((0, 1), np.float32),
                         np.empty((0, 1), np.float32), np.empty((0, 8), np.int32),
                         np.empty((0, k), np.int8))


@njit(cache=True, nogil=True)
def _quantize_rows(x, kind, plus_128):  # noqa: ANN001, ANN202
    """x (n, K) quantized for weights of type ``kind``: (qa, da, aux, qu), qu the bytes
    plus 128 if ``plus_128`` (else no rows)."""
    arrays = _activation_arrays(x.shape[0], x.shape[1], kind, plus_128)
    _quantize_into(x, kind, *arrays)
    return arrays


_PAR_CHUNKS = 8  # row ranges a parallel quantization is cut into


@njit(cache=True, nogil=True, parallel=True)
def _quantize_rows_par(x, kind, plus_128):  # noqa: ANN001, ANN202
    """``_quantize_rows`` with ranges of rows in parallel (each row's numbers its own)."""
    n = x.shape[0]
    qa, da, aux, qu = _activation_arrays(n, x.shape[1], kind, plus_128)
    step = (n + _PAR_CHUNKS - 1) // _PAR_CHUNKS
    for c in prange(_PAR_CHUNKS):
        a, b = min(n, c * step), min(n, (c + 1) * step)
        _quantize_into(x[a:b], kind, qa[a:b], da[a:b], aux[a:b], qu[a:b])
    return qa, da, aux, qu


@njit(cache=True, nogil=True)
def _activation_sets(kinds, count, x, par):  # noqa: ANN001, ANN202
    # ``activation_sets``, its rows quantized in parallel if ``par``
    k32 = kk = -1
    for m in range(count):
        if kinds[m] in Q8_K_KINDS:
            kk = kinds[m]
        elif kinds[m] in Q8_0_KINDS:
            k32 = kinds[m]
        else:
            raise ValueError("no integer kernel for this ggml type id")
    no_cor = np.empty((0, 8), np.int32)
    n = x.shape[0]
    if k32 >= 0:
        off = _shared_offset(kinds, count) if n < BATCH_MIN_ROWS or n % 4 else 0
        tiles = n >= BATCH_MIN_ROWS and _any_of(kinds, count, _OFFSET_KINDS)
        qa, da, aux, qu = _quantize_rows_par(x, k32, tiles) if par else \
            _quantize_rows(x, k32, tiles)
        a32 = ActivationSet(qa, da, aux, _lane_corrections(qa, off) if off else no_cor, qu)
    else:
        a32 = _no_activations(x.shape[1])
    if kk >= 0:
        wide = n >= BATCH_MIN_ROWS and _any_of(kinds, count, _PLUS_128_KINDS)
        qa, da, aux, qu = _quantize_rows_par(x, kk, wide) if par else \
            _quantize_rows(x, kk, wide)
        sums = _sums16(qa) if _any_of(kinds, count, SUMS16_KINDS) else no_cor
        ak = ActivationSet(qa, da, aux, sums, qu)
    else:
        ak = _no_activations(x.shape[1])
    return a32, ak


@njit(cache=True, nogil=True)
def activation_sets(kinds, count, x):  # noqa: ANN001, ANN201
    """``x`` quantized once per activation type the ``count`` weight types need: the
    Q8_0/Q8_1 ``ActivationSet`` and the Q8_K one (no rows where none needs it; its
    ``cor`` the 16-value sums where a type is Q2_K, else no rows). The Q8_0 set's ``cor``
    holds the lane corrections when the products' types share one ``vnni_offset`` and some
    rows run outside the lanes tiles (fewer than BATCH_MIN_ROWS, or not a multiple of 4),
    else no rows; ``qu`` the activations plus 128 when some type has a ``vnni_offset`` and
    the rows are enough for the lanes tiles, else no rows (the Q8_K set's: where a type's
    512-bit tiles take them, ``int_weights.wide_plus_128``). Without them the products take
    the sign step: the same numbers."""
    return _activation_sets(kinds, count, x, False)


@njit(cache=True, nogil=True)
def activation_sets_par(kinds, count, x):  # noqa: ANN001, ANN201
    """``activation_sets`` with the rows quantized in parallel: the same arrays, for a
    batch's products outside the layer team (whose threads are already busy)."""
    return _activation_sets(kinds, count, x, True)
