"""ggml's quantizers as numba kernels: the K-quants (Q2_K..Q6_K), IQ4_NL/IQ4_XS, and the
hot simple types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, whose numpy twins in ``quantize.py`` the
tests hold them to).

What ``ggml_quantize_chunk`` runs without an importance matrix: ``quantize_row_*_ref``, and
``quantize_iq4_nl``/``quantize_iq4_xs`` (which search 7 scale tries either side). The
K-quants fit scales by search loops (``make_qkx2_quants``, ``make_qx_quants``,
``make_q3_quants``) whose decisions turn on float comparisons, so each step here is the
same float32 operation on the same operands, in the same order, as in ggml-quants.c
(compiled by ggml without fast-math or FMA contraction; numba does not contract or reorder
either):

- every value is float32; integers enter products as float32 (``w*l*l`` is ``(w*l)*l``);
- sums run left to right in one float32 accumulator (never numpy's pairwise ``sum``);
- ``nearest_int`` is ggml's ``fval + 12582912.f`` bit trick (round half to even), with its
  wrap-around for huge values reproduced;
- a scale stored as f16 is rounded to the nearest f16 (ties to even) and used as such.

Each ``<type>_blocks(x, out, d)`` quantizes ``x`` ``(n, block)`` float32 into ``out``
``(n, type_size)`` uint8, except for the f16 fields: their values go to ``d`` ``(n, k)``
float32 (f16-exact where ggml reuses the rounded value) and the caller stores them
(``quantize.py``), so no kernel needs float bit casts. The kernels hold no GIL, so callers
split rows across threads.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
from numba import njit

from .jitcache import cached

F32 = np.float32
_MAGIC = F32(12582912.0)     # 1.5 * 2**23: adding it rounds a float32 to an integer
_EPS = F32(1e-15)            # ggml's GROUP_MAX_EPS: a group this small is all zeros
_KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10,
                           1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)

_jit = njit(cache=True, nogil=True)


# -- helpers -----------------------------------------------------------------------------------

@_jit
def nearest_int(v: float) -> int:
    """ggml's ``nearest_int``: the low 23 bits of ``v + 12582912.f``, minus 2**22.

    That is round-half-to-even for |v| < 2**22; beyond, ggml's result wraps (it asserts only
    in debug builds), which the slow branch reproduces from the sum's mantissa bits.
    """
    if abs(v) <= F32(4194303.0):
        return np.int64(F32(v + _MAGIC) - _MAGIC)
    a = abs(np.float64(F32(v + _MAGIC)))
    if a != a:
        mant = 0x400000  # the default quiet NaN's mantissa
    elif a == np.inf or a == 0.0:
        mant = 0
    elif a < 2.0 ** -126:
        mant = np.int64(a * 2.0 ** 149)
    else:
        m, _ = math.frexp(a)
        mant = np.int64((2.0 * m - 1.0) * 8388608.0)
    return mant - 0x400000


@_jit
def f16_round(v: float) -> float:
    """The float32 value of ggml's ``GGML_FP32_TO_FP16(v)``: nearest f16, ties to even,
    +-inf past 65504; the sign of zero kept. Exact: the scaling is by powers of two."""
    a = abs(np.float64(v))
    if a >= 65520.0:
        r = np.inf
    elif a >= 2.0 ** -14:
        _, e = math.frexp(a)               # a in [2**(e-1), 2**e): 10 bits below the top one
        q = math.ldexp(1.0, e - 11)
        r = np.rint(a / q) * q
    else:
        r = np.rint(a * 2.0 ** 24) * 2.0 ** -24  # subnormal f16: multiples of 2**-24
    return F32(math.copysign(r, np.float64(v)))


@_jit
def _best_index(values: np.ndarray, x: float) -> int:
    """ggml's ``best_index_int8``: the nearest of 16 sorted values by bisection (the upper
    one when ``x`` is exactly halfway)."""
    if x <= values[0]:
        return 0
    n = values.size
    if x >= values[n - 1]:
        return n - 1
    lo, hi = 0, n - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if x < values[mid]:
            hi = mid
        else:
            lo = mid
    return hi - 1 if x - values[hi - 1] < values[hi] - x else hi


@_jit
def _signed_absmax(x: np.ndarray) -> tuple[float, float]:
    """(largest |x|, that value with its sign), the first one on ties, from 0."""
    amax = F32(0)
    mx = F32(0)
    for i in range(x.size):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            mx = x[i]
    return amax, mx


# -- the scale searches ------------------------------------------------------------------------

@_jit
def make_qkx2(x: np.ndarray, w: np.ndarray, L: np.ndarray, Laux: np.ndarray, nmax: int,
              rmin: float, rdelta: float, nstep: int, use_mad: bool) -> tuple[float, float]:
    """``make_qkx2_quants``: levels 0..nmax with a scale and a (non-positive) offset, the
    weighted least-squares fit of ``nstep + 1`` trial scales kept when its error is lower.
    Fills ``L``; returns (scale, -offset)."""
    n = x.size
    lo = x[0]
    hi = x[0]
    sum_w = w[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < lo:
            lo = x[i]
        if x[i] > hi:
            hi = x[i]
        sum_w += w[i]
        sum_x += w[i] * x[i]
    if lo > 0:
        lo = F32(0)
    if hi == lo:
        L[:n] = 0
        return F32(0), -lo
    fmax = F32(nmax)
    iscale = fmax / (hi - lo)
    scale = F32(1) / iscale
    best_error = F32(0)
    for i in range(n):
        q = max(0, min(nmax, nearest_int(iscale * (x[i] - lo))))
        L[i] = q
        diff = scale * F32(q) + lo - x[i]
        diff = abs(diff) if use_mad else diff * diff
        best_error += w[i] * diff
    if nstep < 1:
        return scale, -lo
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * F32(step) + fmax) / (hi - lo)
        sum_l = F32(0)
        sum_l2 = F32(0)
        sum_xl = F32(0)
        for i in range(n):
            q = max(0, min(nmax, nearest_int(iscale * (x[i] - lo))))
            Laux[i] = q
            wl = w[i] * F32(q)
            sum_l += wl
            sum_l2 += wl * F32(q)
            sum_xl += wl * x[i]
        det = sum_w * sum_l2 - sum_l * sum_l
        if det > 0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
            if this_min > 0:
                this_min = F32(0)
                this_scale = sum_xl / sum_l2
            cur_error = F32(0)
            for i in range(n):
                diff = this_scale * F32(Laux[i]) + this_min - x[i]
                diff = abs(diff) if use_mad else diff * diff
                cur_error += w[i] * diff
            if cur_error < best_error:
                L[:n] = Laux[:n]
                best_error = cur_error
                scale = this_scale
                lo = this_min
    return scale, -lo


@_jit
def make_qx(x: np.ndarray, L: np.ndarray, nmax: int) -> float:
    """``make_qx_quants`` with ``rmse_type`` 1 and no importance: symmetric levels
    -nmax..nmax-1 stored as 0..2*nmax-1, weights x**2, 18 trial scales. Returns the scale."""
    n = x.size
    amax, mx = _signed_absmax(x)
    if amax < _EPS:
        L[:n] = 0
        return F32(0)
    fmax = F32(nmax)
    iscale = -fmax / mx
    sumlx = F32(0)
    suml2 = F32(0)
    for i in range(n):
        q = max(-nmax, min(nmax - 1, nearest_int(iscale * x[i])))
        L[i] = q + nmax
        w = x[i] * x[i]
        sumlx += w * x[i] * F32(q)
        suml2 += w * F32(q) * F32(q)
    scale = sumlx / suml2 if suml2 != 0 else F32(0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(fmax + F32(0.1) * F32(step)) / mx
        sumlx = F32(0)
        suml2 = F32(0)
        for i in range(n):
            q = max(-nmax, min(nmax - 1, nearest_int(iscale * x[i])))
            w = x[i] * x[i]
            sumlx += w * x[i] * F32(q)
            suml2 += w * F32(q) * F32(q)
        if suml2 > 0 and sumlx * sumlx > best * suml2:
            for i in range(n):
                L[i] = nmax + max(-nmax, min(nmax - 1, nearest_int(iscale * x[i])))
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@_jit
def make_q3(x: np.ndarray, L: np.ndarray, nmax: int) -> float:
    """``make_q3_quants`` with ``do_rmse``: symmetric levels, then up to 5 passes moving
    one value at a time to the level that improves the weighted fit. Returns the scale."""
    n = x.size
    amax, mx = _signed_absmax(x)
    if amax < _EPS:
        L[:n] = 0
        return F32(0)
    iscale = -F32(nmax) / mx
    sumlx = F32(0)
    suml2 = F32(0)
    for i in range(n):
        q = max(-nmax, min(nmax - 1, nearest_int(iscale * x[i])))
        L[i] = q
        w = x[i] * x[i]
        sumlx += w * x[i] * F32(q)
        suml2 += w * F32(q) * F32(q)
    for _ in range(5):
        changed = 0
        for i in range(n):
            w = x[i] * x[i]
            slx = sumlx - w * x[i] * F32(L[i])
            if slx > 0:
                sl2 = suml2 - w * F32(L[i]) * F32(L[i])
                q = max(-nmax, min(nmax - 1, nearest_int(x[i] * sl2 / slx)))
                if q != L[i]:
                    slx += w * x[i] * F32(q)
                    sl2 += w * F32(q) * F32(q)
                    if sl2 > 0 and slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = q
                        sumlx = slx
                        suml2 = sl2
                        changed += 1
        if changed == 0:
            break
    for i in range(n):
        L[i] += nmax
    return sumlx / suml2 if suml2 > 0 else F32(0)


# -- packing -----------------------------------------------------------------------------------

@_jit
def _pack_2bit(L: np.ndarray, qs: np.ndarray) -> None:
    """Four 2-bit levels per byte: byte l of each 32-byte group holds values l, l+32, l+64,
    l+96 of its 128 (Q2_K, Q3_K)."""
    for j in range(0, 256, 128):
        for k in range(32):
            qs[j // 4 + k] = (L[j + k] | (L[j + k + 32] << 2) | (L[j + k + 64] << 4)
                              | (L[j + k + 96] << 6))


@_jit
def _scale_min_k4(j: int, s: np.ndarray) -> tuple[int, int]:
    """``get_scale_min_k4``: the 6-bit scale and min of sub-block j from 12 bytes."""
    a = np.int64(s[j])
    b = np.int64(s[j + 4])
    if j < 4:
        return a & 63, b & 63
    c = np.int64(s[j - 4])
    return (b & 0xF) | ((c >> 6) << 4), (b >> 4) | ((a >> 6) << 4)


@_jit
def _put_scale_min_k4(j: int, ls: int, lm: int, s: np.ndarray) -> None:
    # the inverse of _scale_min_k4, as ggml fills the bytes (in order of j)
    if j < 4:
        s[j] = ls
        s[j + 4] = lm
    else:
        s[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
        s[j - 4] |= (ls >> 4) << 6
        s[j] |= (lm >> 4) << 6


# -- one super-block per call ------------------------------------------------------------------

@_jit
def _q2_k(x, out, d, L, Laux, w, scales, mins) -> None:  # noqa: ANN001
    # block_q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin
    max_scale = F32(0)
    max_min = F32(0)
    for j in range(16):
        xs = x[16 * j:16 * j + 16]
        for k in range(16):
            w[k] = abs(xs[k])
        s, m = make_qkx2(xs, w[:16], L[16 * j:16 * j + 16], Laux, 3, F32(-0.5), F32(0.1),
                         15, True)
        scales[j] = s
        mins[j] = m
        if s > max_scale:
            max_scale = s
        if m > max_min:
            max_min = m
    sc = out[0:16]
    if max_scale > 0:
        iscale = F32(15) / max_scale
        for j in range(16):
            sc[j] = nearest_int(iscale * scales[j]) & 0xFF
        dd = f16_round(max_scale / F32(15))
    else:
        sc[:] = 0
        dd = F32(0)
    if max_min > 0:
        iscale = F32(15) / max_min
        for j in range(16):
            sc[j] = (sc[j] | (nearest_int(iscale * mins[j]) << 4)) & 0xFF
        dm = f16_round(max_min / F32(15))
    else:
        dm = F32(0)
    d[0] = dd
    d[1] = dm
    for j in range(16):
        dl = dd * F32(sc[j] & 0xF)
        if dl == 0:
            continue
        ml = dm * F32(sc[j] >> 4)
        for k in range(16):
            L[16 * j + k] = max(0, min(3, nearest_int((x[16 * j + k] + ml) / dl)))
    _pack_2bit(L, out[16:80])


@_jit
def _q3_k(x, out, d, L, scales) -> None:  # noqa: ANN001
    # block_q3_K: hmask[32] (bit 2 of each level), qs[64] (bits 0-1), scales[12] (16 six-bit
    # signed scales: low nibbles in bytes 0-7, top 2 bits in bytes 8-11), d
    max_scale = F32(0)
    amax = F32(0)
    for j in range(16):
        s = make_q3(x[16 * j:16 * j + 16], L[16 * j:16 * j + 16], 4)
        scales[j] = s
        if abs(s) > amax:
            amax = abs(s)
            max_scale = s
    sc = out[96:108]
    sc[:] = 0
    if max_scale != 0:
        iscale = F32(-32) / max_scale
        for j in range(16):
            q = np.int8(nearest_int(iscale * scales[j]))  # ggml stores it in an int8_t first
            q = max(-32, min(31, np.int64(q))) + 32
            if j < 8:
                sc[j] = q & 0xF
            else:
                sc[j - 8] |= (q & 0xF) << 4
            sc[j % 4 + 8] |= (q >> 4) << (2 * (j // 4))
        dd = f16_round(F32(1) / iscale)
    else:
        dd = F32(0)
    d[0] = dd
    for j in range(16):
        lo = np.int64(sc[j]) & 0xF if j < 8 else np.int64(sc[j - 8]) >> 4
        s6 = (lo | (((np.int64(sc[8 + j % 4]) >> (2 * (j // 4))) & 3) << 4)) - 32
        dl = dd * F32(s6)
        if dl == 0:
            continue
        for k in range(16):
            L[16 * j + k] = max(-4, min(3, nearest_int(x[16 * j + k] / dl))) + 4
    hmask = out[0:32]
    hmask[:] = 0
    for j in range(256):
        if L[j] > 3:
            hmask[j % 32] |= 1 << (j // 32)
            L[j] -= 4
    _pack_2bit(L, out[32:96])


@_jit
def _qk_fit(x, L, Laux, w, scales, mins, nmax, rmin, nstep) -> tuple[float, float]:  # noqa: ANN001
    """Q4_K/Q5_K: eight 32-value sub-blocks fitted with weights sqrt(mean x**2) + |x|;
    returns the largest scale and min."""
    max_scale = F32(0)
    max_min = F32(0)
    for j in range(8):
        xs = x[32 * j:32 * j + 32]
        sum_x2 = F32(0)
        for k in range(32):
            sum_x2 += xs[k] * xs[k]
        av_x = F32(np.sqrt(sum_x2 / F32(32)))
        for k in range(32):
            w[k] = av_x + abs(xs[k])
        s, m = make_qkx2(xs, w, L[32 * j:32 * j + 32], Laux, nmax, rmin, F32(0.1), nstep, False)
        scales[j] = s
        mins[j] = m
        if s > max_scale:
            max_scale = s
        if m > max_min:
            max_min = m
    return max_scale, max_min


@_jit
def _qk_requantize(x, L, sc, d, max_scale, max_min, scales, mins, nmax) -> None:  # noqa: ANN001
    """Q4_K/Q5_K: 6-bit sub-scales and mins against the f16 super-scales, then every value
    again against the scales as stored."""
    inv_scale = F32(63) / max_scale if max_scale > 0 else F32(0)
    inv_min = F32(63) / max_min if max_min > 0 else F32(0)
    for j in range(8):
        ls = min(63, nearest_int(inv_scale * scales[j]) & 0xFF)  # uint8_t, then MIN
        lm = min(63, nearest_int(inv_min * mins[j]) & 0xFF)
        _put_scale_min_k4(j, ls, lm, sc)
    dd = f16_round(max_scale / F32(63))
    dm = f16_round(max_min / F32(63))
    d[0] = dd
    d[1] = dm
    for j in range(8):
        s, m = _scale_min_k4(j, sc)
        dl = dd * F32(s)
        if dl == 0:
            continue
        ml = dm * F32(m)
        for k in range(32):
            L[32 * j + k] = max(0, min(nmax, nearest_int((x[32 * j + k] + ml) / dl)))


@_jit
def _q4_k(x, out, d, L, Laux, w, scales, mins) -> None:  # noqa: ANN001
    # block_q4_K: d, dmin, scales[12], qs[128] (byte k of 32: value k low, k+32 high)
    max_scale, max_min = _qk_fit(x, L, Laux, w, scales, mins, 15, F32(-1), 20)
    sc = out[4:16]
    _qk_requantize(x, L, sc, d, max_scale, max_min, scales, mins, 15)
    for j in range(4):
        for k in range(32):
            out[16 + 32 * j + k] = L[64 * j + k] | (L[64 * j + k + 32] << 4)


@_jit
def _q5_k(x, out, d, L, Laux, w, scales, mins) -> None:  # noqa: ANN001
    # block_q5_K: d, dmin, scales[12], qh[32] (bit 2j / 2j+1: 5th bit of value k + 64j /
    # k + 64j + 32), qs[128] as Q4_K
    max_scale, max_min = _qk_fit(x, L, Laux, w, scales, mins, 31, F32(-0.5), 15)
    sc = out[4:16]
    _qk_requantize(x, L, sc, d, max_scale, max_min, scales, mins, 31)
    qh = out[16:48]
    qh[:] = 0
    for j in range(4):
        for k in range(32):
            l1 = L[64 * j + k]
            if l1 > 15:
                l1 -= 16
                qh[k] |= 1 << (2 * j)
            l2 = L[64 * j + k + 32]
            if l2 > 15:
                l2 -= 16
                qh[k] |= 2 << (2 * j)
            out[48 + 32 * j + k] = l1 | (l2 << 4)


@_jit
def _q6_k(x, out, d, L, scales) -> None:  # noqa: ANN001
    # block_q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] int8, d
    max_scale = F32(0)
    max_abs = F32(0)
    for j in range(16):
        s = make_qx(x[16 * j:16 * j + 16], L[16 * j:16 * j + 16], 32)
        scales[j] = s
        if abs(s) > max_abs:
            max_abs = abs(s)
            max_scale = s
    if max_abs < _EPS:
        out[:] = 0
        d[0] = F32(0)
        return
    iscale = F32(-128) / max_scale
    dd = f16_round(F32(1) / iscale)
    d[0] = dd
    sc = out[192:208]
    for j in range(16):
        sc[j] = min(127, nearest_int(iscale * scales[j])) & 0xFF  # int8 bits
    for j in range(16):
        dl = dd * F32(np.int8(sc[j]))
        if dl == 0:
            continue
        for k in range(16):
            L[16 * j + k] = max(-32, min(31, nearest_int(x[16 * j + k] / dl))) + 32
    for h in range(2):
        ql = out[64 * h:64 * h + 64]
        qh = out[128 + 32 * h:128 + 32 * h + 32]
        base = 128 * h
        for k in range(32):
            a = L[base + k]
            b = L[base + k + 32]
            c = L[base + k + 64]
            e = L[base + k + 96]
            ql[k] = (a & 0xF) | ((c & 0xF) << 4)
            ql[k + 32] = (b & 0xF) | ((e & 0xF) << 4)
            qh[k] = (a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6)


@_jit
def _iq4_fit(xb, L, w, values) -> float:  # noqa: ANN001
    """One 32-value block of ``quantize_row_iq4_nl_impl`` (no importance, ntry 7): the best
    of 15 trial scales for the non-linear levels, weights x**2. Fills ``L``; returns the
    scale (0 for an all-zero block, ``L`` then untouched)."""
    amax, mx = _signed_absmax(xb)
    if amax < _EPS:
        return F32(0)
    for j in range(32):
        w[j] = xb[j] * xb[j]
    d = -mx / values[0]
    inv = F32(1) / d
    sumqx = F32(0)
    sumq2 = F32(0)
    for j in range(32):
        k = _best_index(values, inv * xb[j])
        L[j] = k
        q = values[k]
        sumqx += w[j] * q * xb[j]
        sumq2 += w[j] * q * q
    d = sumqx / sumq2 if sumq2 > 0 else F32(0)
    best = d * sumqx
    for itry in range(-7, 8):
        inv = (F32(itry) + values[0]) / mx
        sumqx = F32(0)
        sumq2 = F32(0)
        for j in range(32):
            q = values[_best_index(values, inv * xb[j])]
            sumqx += w[j] * q * xb[j]
            sumq2 += w[j] * q * q
        if sumq2 > 0 and sumqx * sumqx > best * sumq2:
            d = sumqx / sumq2
            best = d * sumqx
    return d


@_jit
def _pack_nibbles(L, qs) -> None:  # noqa: ANN001
    # 32 values -> 16 bytes: value k in the low nibble of byte k, value k + 16 in the high
    for k in range(16):
        qs[k] = L[k] | (L[k + 16] << 4)


@_jit
def _iq4_nl(x, out, d, L, w, values) -> None:  # noqa: ANN001
    # block_iq4_nl: d, qs[16]
    s = _iq4_fit(x, L, w, values)
    d[0] = f16_round(s)
    inv = F32(1) / s if s != 0 else F32(0)
    for j in range(32):
        L[j] = _best_index(values, inv * x[j])
    _pack_nibbles(L, out[2:18])


@_jit
def _iq4_xs(x, out, d, L, w, scales, values) -> None:  # noqa: ANN001
    # block_iq4_xs: d, scales_h (u16: 2 high bits per sub-block), scales_l[4] (low nibbles),
    # qs[128]
    max_scale = F32(0)
    amax = F32(0)
    for ib in range(8):
        s = _iq4_fit(x[32 * ib:32 * ib + 32], L[32 * ib:32 * ib + 32], w, values)
        scales[ib] = s
        if abs(s) > amax:
            amax = abs(s)
            max_scale = s
    dd = -max_scale / F32(32)
    d[0] = f16_round(dd)
    inv = F32(1) / dd if dd != 0 else F32(0)
    scales_h = 0
    for ib in range(8):
        q = max(-32, min(31, nearest_int(inv * scales[ib])))
        dl = dd * F32(q)
        idl = F32(1) / dl if dl != 0 else F32(0)
        for j in range(32):
            L[32 * ib + j] = _best_index(values, idl * x[32 * ib + j])
        q += 32
        if ib % 2 == 0:
            out[4 + ib // 2] = q & 0xF
        else:
            out[4 + ib // 2] |= (q & 0xF) << 4
        scales_h |= (q >> 4) << (2 * ib)
    out[2] = scales_h & 0xFF
    out[3] = scales_h >> 8
    for i in range(8):
        _pack_nibbles(L[32 * i:32 * i + 32], out[8 + 16 * i:24 + 16 * i])


# -- drivers: a range of blocks, scratch made once ---------------------------------------------

@_jit
def q2_k_blocks(x: np.ndarray, out: np.ndarray, d: np.ndarray) -> None:
    L = np.zeros(256, np.int64)
    Laux = np.zeros(32, np.int64)
    w = np.zeros(32, np.float32)
    scales = np.zeros(16, np.float32)
    mins = np.zeros(16, np.float32)
    for b in range(x.shape[0]):
        _q2_k(x[b], out[b], d[b], L, Laux, w, scales, mins)


@_jit
def q3_k_blocks(x: np.ndarray, out: np.ndarray, d: np.ndarray) -> None:
    L = np.zeros(256, np.int64)
    scales = np.zeros(16, np.float32)
    for b in range(x.shape[0]):
        _q3_k(x[b], out[b], d[b], L, scales)


@_jit
def q4_k_blocks(x: np.ndarray, out: np.ndarray, d: np.ndarray) -> None:
    L = np.zeros(256, np.int64)
    Laux = np.zeros(32, np.int64)
    w = np.zeros(32, np.float32)
    scales = np.zeros(8, np.float32)
    mins = np.zeros(8, np.float32)
    for b in range(x.shape[0]):
        _q4_k(x[b], out[b], d[b], L, Laux, w, scales, mins)


@_jit
def q5_k_blocks(x: np.ndarray, out: np.ndarray, d: np.ndarray) -> None:
    L = np.zeros(256, np.int64)
    Laux = np.zeros(32, np.int64)
    w = np.zeros(32, np.float32)
    scales = np.zeros(8, np.float32)
    mins = np.zeros(8, np.float32)
    for b in range(x.shape[0]):
        _q5_k(x[b], out[b], d[b], L, Laux, w, scales, mins)


@_jit
def q6_k_blocks(x: np.ndarray, out: np.ndarray, d: np.ndarray) -> None:
    L = np.zeros(256, np.int64)
    scales = np.zeros(16, np.float32)
    for b in range(x.shape[0]):
        _q6_k(x[b], out[b], d[b], L, scales)


@_jit
def _iq4_nl_blocks(x: np.ndarray, out: np.ndarray, d: np.ndarray, values: np.ndarray) -> None:
    L = np.zeros(32, np.int64)
    w = np.zeros(32, np.float32)
    for b in range(x.shape[0]):
        _iq4_nl(x[b], out[b], d[b], L, w, values)


@_jit
def _iq4_xs_blocks(x: np.ndarray, out: np.ndarray, d: np.ndarray, values: np.ndarray) -> None:
    L = np.zeros(256, np.int64)
    w = np.zeros(32, np.float32)
    scales = np.zeros(8, np.float32)
    for b in range(x.shape[0]):
        _iq4_xs(x[b], out[b], d[b], L, w, scales, values)


def iq4_nl_blocks(x: np.ndarray, out: np.ndarray, d: np.ndarray) -> None:
    _iq4_nl_blocks(x, out, d, _KVALUES_IQ4NL)


def iq4_xs_blocks(x: np.ndarray, out: np.ndarray, d: np.ndarray) -> None:
    _iq4_xs_blocks(x, out, d, _KVALUES_IQ4NL)


# -- the simple types: one scale (and min) per 32 values, no search ---------------------------

@_jit
def q4_0_blocks(x: np.ndarray, out: np.ndarray, d: np.ndarray) -> None:
    # block_q4_0: d, qs[16]; d = (the value of largest magnitude) / -8
    for b in range(x.shape[0]):
        xb = x[b]
        _, mx = _signed_absmax(xb)
        db = mx / F32(-8)
        inv = F32(1) / db if db != 0 else F32(0)
        d[b, 0] = db
        for j in range(16):
            a = min(15, np.int64(np.int8(np.int64(xb[j] * inv + F32(8.5)))))
            c = min(15, np.int64(np.int8(np.int64(xb[j + 16] * inv + F32(8.5)))))
            out[b, 2 + j] = a | (c << 4)


@_jit
def _min_max(xb) -> tuple[float, float]:  # noqa: ANN001
    lo = np.finfo(np.float32).max
    hi = -np.finfo(np.float32).max
    for j in range(xb.size):
        if xb[j] < lo:
            lo = xb[j]
        if xb[j] > hi:
            hi = xb[j]
    return F32(lo), F32(hi)


@_jit
def q4_1_blocks(x: np.ndarray, out: np.ndarray, d: np.ndarray) -> None:
    # block_q4_1: d, m, qs[16]; 16 levels from the block's min to its max
    for b in range(x.shape[0]):
        xb = x[b]
        lo, hi = _min_max(xb)
        db = (hi - lo) / F32(15)
        inv = F32(1) / db if db != 0 else F32(0)
        d[b, 0] = db
        d[b, 1] = lo
        for j in range(16):
            a = min(15, np.int64(np.int8(np.int64((xb[j] - lo) * inv + F32(0.5)))))
            c = min(15, np.int64(np.int8(np.int64((xb[j + 16] - lo) * inv + F32(0.5)))))
            out[b, 4 + j] = a | (c << 4)


@_jit
def _put_q5(out_row, q0: int, levels) -> None:  # noqa: ANN001
    # Q5_0/Q5_1: qh (u32: bit j is bit 4 of value j), then low nibbles as Q4_0
    qh = 0
    for j in range(16):
        a = levels[j]
        c = levels[j + 16]
        out_row[q0 + 4 + j] = (a & 0xF) | ((c & 0xF) << 4)
        qh |= ((a >> 4) & 1) << j
        qh |= ((c >> 4) & 1) << (j + 16)
    for k in range(4):
        out_row[q0 + k] = (qh >> (8 * k)) & 0xFF


@_jit
def q5_0_blocks(x: np.ndarray, out: np.ndarray, d: np.ndarray) -> None:
    # block_q5_0: d, qh[4], qs[16]; d = (the value of largest magnitude) / -16
    levels = np.zeros(32, np.int64)
    for b in range(x.shape[0]):
        xb = x[b]
        _, mx = _signed_absmax(xb)
        db = mx / F32(-16)
        inv = F32(1) / db if db != 0 else F32(0)
        d[b, 0] = db
        for j in range(32):
            levels[j] = min(31, np.int64(np.int8(np.int64(xb[j] * inv + F32(16.5)))))
        _put_q5(out[b], 2, levels)


@_jit
def q5_1_blocks(x: np.ndarray, out: np.ndarray, d: np.ndarray) -> None:
    # block_q5_1: d, m, qh[4], qs[16]; 32 levels from min to max, (uint8_t) without a clamp
    levels = np.zeros(32, np.int64)
    for b in range(x.shape[0]):
        xb = x[b]
        lo, hi = _min_max(xb)
        db = (hi - lo) / F32(31)
        inv = F32(1) / db if db != 0 else F32(0)
        d[b, 0] = db
        d[b, 1] = lo
        for j in range(32):
            levels[j] = np.int64((xb[j] - lo) * inv + F32(0.5)) & 0xFF
        _put_q5(out[b], 4, levels)


@_jit
def q8_0_blocks(x: np.ndarray, out: np.ndarray, d: np.ndarray) -> None:
    # block_q8_0: d, qs[32] int8; d = max |x| / 127, values roundf(x / d)
    for b in range(x.shape[0]):
        xb = x[b]
        amax = F32(0)
        for j in range(32):
            amax = max(amax, abs(xb[j]))
        db = amax / F32(127)
        inv = F32(1) / db if db != 0 else F32(0)
        d[b, 0] = db
        for j in range(32):
            v = np.float64(xb[j] * inv)  # roundf: halves away from zero, exact in float64
            r = math.floor(abs(v) + 0.5)
            out[b, 2 + j] = np.int64(-r if v < 0 else r) & 0xFF


_KERNELS = {"Q4_0": q4_0_blocks, "Q4_1": q4_1_blocks, "Q5_0": q5_0_blocks,
            "Q5_1": q5_1_blocks, "Q8_0": q8_0_blocks, "Q2_K": q2_k_blocks,
            "Q3_K": q3_k_blocks, "Q4_K": q4_k_blocks, "Q5_K": q5_k_blocks,
            "Q6_K": q6_k_blocks, "IQ4_NL": _iq4_nl_blocks, "IQ4_XS": _iq4_xs_blocks}


def is_compiled(types: Iterable[Any] = ()) -> bool:
    """True when the kernels for ``types`` (ggml types or names) are cached on disk; the
    first use of one otherwise compiles it (seconds to a minute, once)."""
    names = {getattr(t, "ggml_name", t) for t in types} & set(_KERNELS)
    return cached(_KERNELS[n] for n in names)

