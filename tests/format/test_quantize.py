"""gguflm.quant.quantize against ggml's own bytes: the quant zoo for every type llama-quantize
makes without an importance matrix; the numba kernels against their numpy twins and against
ggml's float tricks (nearest_int, f16 rounding); edge blocks; bad input."""

from __future__ import annotations

import numpy as np
import pytest

import gguflm.gguf as gguf
from gguflm.gguf.errors import TensorDataError
from gguflm.gguf.types import GGMLType
from gguflm.quant import dequantize_raw, quantize
from gguflm.quant import quantize_kernels as qk
from gguflm.quant.quantize import NEEDS_IMATRIX, NUMPY_TWINS, supported_types

SUPPORTED = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
             "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4", "F16", "BF16"]
NUMBA = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
         "IQ4_NL", "IQ4_XS"]


@pytest.fixture(scope="module")
def zoo(reference):
    with gguf.open(reference / "quant-zoo" / "quant-zoo.gguf") as f:
        yield f


def raw_bytes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(len(a), -1).view(np.uint8)


def test_every_supported_type_is_listed():
    assert {t.ggml_name for t in supported_types()} == {*SUPPORTED, "F32"}


@pytest.mark.parametrize("name", SUPPORTED)
def test_zoo_bytes_exactly(zoo, name):
    """ggml_quantize_chunk's bytes of the zoo's 32 x 1536 source rows, for every type."""
    t = GGMLType.from_name(name)
    src = zoo.tensors["source.f32"].data
    ref = zoo.tensors[f"{name}.q"]
    assert ref.type == t
    q = quantize(src, t)
    assert q.dtype == np.uint8 and q.shape == (32, t.row_bytes(1536))
    differ = int((q != raw_bytes(ref.data)).reshape(-1, t.type_size).any(axis=1).sum())
    assert differ == 0, f"{differ} of {q.size // t.type_size} {name} blocks differ from ggml"


def varied_rows(seed: int = 0) -> np.ndarray:
    """Rows that exercise the corner cases of the scale searches: heavy tails, zeros, tiny
    and constant groups, sign flips, values on a coarse grid (ties), one-spike groups."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((64, 512)).astype(np.float32) * np.float32(0.05)
    x[::7] = rng.standard_t(2, (len(x[::7]), 512))
    x[1::9, ::3] = 0
    x[2::11] *= np.float32(1e-6)
    x[3::13] = np.float32(0.25)
    x[4::17, 5::4] *= -1
    x[5::19] = np.round(x[5::19] * 64) / 64
    x[6] = 0
    x[6, 17] = -3.0
    x[8] = -0.0
    x[9, :256] = np.float32(1e-30)  # scales far below f16's smallest
    x[10] = np.linspace(-1, 1, 512)
    return x


@pytest.mark.parametrize("name", [t.ggml_name for t in NUMPY_TWINS])
def test_kernels_match_their_numpy_twins(name):
    t = GGMLType.from_name(name)
    x = varied_rows()
    fast = quantize(x, t)
    slow = NUMPY_TWINS[t](x.reshape(-1, t.block_size))
    assert np.array_equal(fast.reshape(-1, t.type_size), slow)


@pytest.mark.parametrize("name", NUMBA)
def test_threads_give_the_same_bytes(name):
    t = GGMLType.from_name(name)
    x = np.random.default_rng(1).standard_normal((96, 4096)).astype(np.float32)
    assert np.array_equal(quantize(x, t, threads=1), quantize(x, t, threads=3))


@pytest.mark.parametrize("name", SUPPORTED)
def test_edge_rows_decode_sensibly(name):
    """No reference bytes here: zero rows decode to zeros, everything decodes finite, and
    smooth data comes back close (each type within a bound that catches packing bugs)."""
    t = GGMLType.from_name(name)
    x = varied_rows(2)
    q = quantize(x, t)
    y = dequantize_raw(t, q, x.shape)
    assert np.isfinite(y).all()
    assert not y[8].any()  # a row of -0.0
    smooth = x[10]
    err = np.sqrt(np.mean((y[10] - smooth) ** 2)) / np.sqrt(np.mean(smooth ** 2))
    bound = {"TQ1_0": 0.6, "TQ2_0": 0.6, "Q2_K": 0.2, "Q3_K": 0.1, "IQ4_NL": 0.06,
             "IQ4_XS": 0.06, "MXFP4": 0.15}.get(name, 0.05)
    assert err < bound, f"{name}: relative error {err:.3f} on a linear ramp"


def test_nearest_int_is_ggmls_bit_trick():
    """nearest_int(v) = low 23 bits of float32(v + 12582912) - 2**22, for all magnitudes:
    ties to even in range, ggml's wrap-around beyond it."""
    rng = np.random.default_rng(3)
    v = np.concatenate([
        rng.uniform(-100, 100, 2000), np.arange(-40, 40) + 0.5,   # ties
        rng.standard_normal(500) * 10.0 ** rng.integers(-30, 30, 500),
        [0.0, -0.0, 4194303.0, 4194303.5, 4194304.0, -4194304.0, -4194305.0, 1e10, -1e30,
         np.inf, -np.inf]]).astype(np.float32)
    with np.errstate(over="ignore"):
        s = (v + np.float32(12582912.0)).astype(np.float32)
    want = (s.view(np.int32) & 0x7FFFFF) - 0x400000
    got = np.array([qk.nearest_int(np.float32(a)) for a in v])
    assert np.array_equal(got, want), v[got != want][:5]


def test_f16_round_is_ggmls_conversion():
    """f16_round(v) = the float32 value of (half)v: ties to even, subnormals, overflow."""
    rng = np.random.default_rng(4)
    h = rng.integers(0, 0x7C00, 3000).astype(np.uint16).view(np.float16).astype(np.float32)
    nxt = (h.astype(np.float16).view(np.uint16) + 1).view(np.float16).astype(np.float32)
    mid = ((h.astype(np.float64) + nxt) / 2).astype(np.float32)  # exact halfway points
    v = np.concatenate([h, -mid, mid, np.nextafter(mid, np.float32(np.inf)),
                        rng.standard_normal(1000).astype(np.float32) * 1e-6,
                        [0.0, -0.0, 65504.0, 65519.99, 65520.0, 1e9, -1e9, 5.9e-8, 3e-8]
                        ]).astype(np.float32)
    v = v[np.isfinite(v)]
    with np.errstate(over="ignore"):
        want = v.astype(np.float16).astype(np.float32)
    got = np.array([qk.f16_round(np.float32(a)) for a in v], dtype=np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_leading_shape_and_bytes():
    x = np.random.default_rng(5).standard_normal((2, 3, 512)).astype(np.float32)
    q = quantize(x, GGMLType.Q4_K)
    assert q.shape == (2, 3, 2 * 144) and len(q.tobytes()) == 6 * 2 * 144
    assert np.array_equal(q.reshape(6, -1), quantize(x.reshape(6, 512), GGMLType.Q4_K))


# -- bad input: one error naming the tensor -----------------------------------------------------

@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_input_is_refused(value):
    x = np.zeros((2, 256), np.float32)
    x[1, 7] = value
    with pytest.raises(TensorDataError, match="'w'.*1 values are NaN or infinite"):
        quantize(x, GGMLType.Q4_K, name="w")


@pytest.mark.parametrize("name, value", [("Q8_0", 1e7), ("Q4_K", 1e9), ("F16", 1e5),
                                         ("Q6_K", 1e9)])
def test_scales_beyond_f16_are_refused(name, value):
    """llama-quantize's ggml_validate_row_data refuses inf scales; so do we."""
    x = np.zeros((1, 256), np.float32)
    x[0, 3] = value
    with pytest.raises(TensorDataError, match="'big'.*overflow"):
        quantize(x, GGMLType.from_name(name), name="big")


def test_unsupported_types_and_shapes():
    for t in NEEDS_IMATRIX:
        with pytest.raises(TensorDataError, match=f"{t.ggml_name}.*importance matrix"):
            quantize(np.zeros((1, 256), np.float32), t)
    with pytest.raises(TensorDataError, match="cannot quantize to Q8_K"):
        quantize(np.zeros((1, 256), np.float32), GGMLType.Q8_K)
    with pytest.raises(TensorDataError, match="'x'.*row length 320.*Q4_K block size 256"):
        quantize(np.zeros((2, 320), np.float32), GGMLType.Q4_K, name="x")


def test_ternary_with_a_subnormal_scale():
    """max |x| subnormal: 1/d is inf, x/d inf or NaN; x86 ggml (lroundf -> LONG_MIN, + 1 kept
    as int 1) then stores every value as the middle trit, which is what we write."""
    x = np.full((1, 256), 3e-40, np.float32)
    x[0, ::3] = 0
    q2 = quantize(x, GGMLType.TQ2_0)
    assert (q2[0, :64] == 0b01010101).all()
    q1 = quantize(x, GGMLType.TQ1_0)
    assert (q1[0, :48] == (121 * 256 + 242) // 243).all()  # 11111 in base 3, rounded up
    assert (q1[0, 48:52] == (40 * 3 * 256 + 242) // 243).all()
