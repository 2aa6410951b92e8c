"""gguflm.quant against ggml's own output: the quant zoo (26 types dequantized by ggml, and
ggml's reference quantizers), plus every tensor of the two real models."""

from __future__ import annotations

import numpy as np
import pytest

import gguflm.gguf as gguf
from gguflm.gguf.errors import GGUFError, TensorDataError
from gguflm.gguf.reader import TensorInfo
from gguflm.gguf.types import GGMLType
from gguflm.quant import (
    FORMATS,
    dequantize,
    dequantize_raw,
    dequantize_rows,
    quantize,
    supported_types,
)

ZOO_TYPES = ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K",
             "Q5_K", "Q6_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS",
             "IQ3_S", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4", "Q1_0"]
QUANTIZED = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]


@pytest.fixture(scope="module")
def zoo(reference):
    with gguf.open(reference / "quant-zoo" / "quant-zoo.gguf") as f:
        yield f


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


# -- the zoo: ggml's to_float output, bit for bit -------------------------------------------

def test_zoo_has_every_type(zoo):
    types = {t.type.ggml_name for n, t in zoo.tensors.items() if n.endswith(".q")}
    assert types == set(ZOO_TYPES)


@pytest.mark.parametrize("name", ZOO_TYPES)
def test_dequantize_matches_ggml_bit_for_bit(zoo, name):
    q, ref = zoo.tensors[f"{name}.q"], zoo.tensors[f"{name}.f32"]
    assert q.type.ggml_name == name
    y = dequantize(q)
    assert y.dtype == np.float32 and y.shape == q.np_shape == ref.np_shape
    mismatched = int((bits(y) != bits(ref.data)).sum())
    assert mismatched == 0, f"{mismatched} of {y.size} values differ from ggml"


@pytest.mark.parametrize("name", ZOO_TYPES)
def test_rows_and_raw_agree_with_whole_tensor(zoo, name):
    q = zoo.tensors[f"{name}.q"]
    whole = dequantize(q)
    for start, stop in [(0, 1), (5, 12), (31, 32), (7, 7)]:
        part = dequantize_rows(q, start, stop)
        assert part.shape == (stop - start, q.shape[0])
        assert np.array_equal(bits(part), bits(whole[start:stop]))
    # raw bytes in, as the QMatrix fallback passes them
    raw = np.frombuffer(q.data.tobytes(), dtype=np.uint8)
    assert np.array_equal(bits(dequantize_raw(q.type, raw, q.np_shape)), bits(whole))
    out = np.full(q.np_shape, np.nan, dtype=np.float32)
    assert dequantize_raw(q.type, q.data, q.np_shape, out=out) is out
    assert np.array_equal(bits(out), bits(whole))


def test_every_dequantizable_type_has_a_layout():
    for t in supported_types():
        if t.quantized:
            f = FORMATS[t]
            assert (f.block_size, f.type_size) == (t.block_size, t.type_size)
    assert set(supported_types()) >= {GGMLType.from_name(n) for n in ZOO_TYPES}


# -- the reference quantizers, byte for byte --------------------------------------------------

@pytest.mark.parametrize("name", QUANTIZED)
def test_quantize_reproduces_ggml_bytes(zoo, name):
    src = zoo.tensors["source.f32"].data
    q = quantize(src, GGMLType.from_name(name))
    ref = zoo.tensors[f"{name}.q"].data
    assert q.dtype == np.uint8 and q.shape == ref.shape
    assert int((q != ref).sum()) == 0


@pytest.mark.parametrize("name", QUANTIZED)
def test_quantize_edge_blocks(name):
    """All-zero, constant, single-spike and tie blocks: finite scales, error within d/2."""
    t = GGMLType.from_name(name)
    x = np.zeros((5, 32), dtype=np.float32)
    x[1] = 0.75
    x[2, 7] = -3.0
    x[3] = np.linspace(-1, 1, 32)
    x[4, ::2], x[4, 1::2] = 2.0, -2.0  # equal magnitudes: ggml keeps the first
    raw = quantize(x, t)
    assert raw.shape == (5, t.type_size)
    y = dequantize_raw(t, raw, x.shape)
    assert np.isfinite(y).all()
    assert np.array_equal(y[0], np.zeros(32, dtype=np.float32))
    # the block scale bounds the error: half a step (one step for the 16/32-level
    # symmetric types, whose range is asymmetric around zero)
    d = np.abs(raw[:, :2].copy().view("<f2").astype(np.float32))
    assert (np.abs(y - x) <= d * 1.0001 + 1e-3).all()


@pytest.mark.parametrize("name", QUANTIZED)
def test_quantize_signed_zeros(name):
    """ggml's comparisons are strict, so the sign of zero inputs decides nothing but the
    first minimum (Q4_1/Q5_1's m): all-(+0) and all-(-0) blocks give the same d bytes."""
    t = GGMLType.from_name(name)
    pos = quantize(np.zeros((1, 32), np.float32), t)
    neg = quantize(np.full((1, 32), -0.0, np.float32), t)
    assert np.array_equal(pos[:, :2], neg[:, :2])
    assert np.array_equal(pos[:, 4:], neg[:, 4:])
    mixed = np.zeros((1, 32), np.float32)
    mixed[0, 0] = -0.0
    m = quantize(mixed, t)
    if name in ("Q4_1", "Q5_1"):  # min is the first zero: -0.0
        assert m[0, 2:4].view("<f2")[0] == 0 and np.signbit(m[0, 2:4].view("<f2")[0])


def test_quantize_keeps_leading_shape():
    x = np.random.default_rng(0).standard_normal((2, 3, 64)).astype(np.float32)
    raw = quantize(x, GGMLType.Q8_0)
    assert raw.shape == (2, 3, 2 * 34)
    y = dequantize_raw(GGMLType.Q8_0, raw, x.shape)
    assert np.abs(y - x).max() < np.abs(x).max() / 127


# -- bad input: one clear error naming the tensor ---------------------------------------------

def test_wrong_byte_count_names_the_tensor():
    raw = np.zeros(18 * 3, dtype=np.uint8)
    with pytest.raises(TensorDataError, match="'w'.*54 bytes.*wants 72"):
        dequantize_raw(GGMLType.Q4_0, raw, (2, 64), name="w")


def test_row_not_multiple_of_block_names_the_tensor():
    with pytest.raises(TensorDataError, match="'w'.*row length 48.*block size 32"):
        dequantize_raw(GGMLType.Q4_0, np.zeros(27, dtype=np.uint8), (1, 48), name="w")
    t = TensorInfo("blk.0.bad", GGMLType.Q4_K, (100, 2), offset=0, nbytes=0, file_offset=0)
    with pytest.raises(TensorDataError, match="blk.0.bad.*block size 256"):
        dequantize(t)
    with pytest.raises(TensorDataError, match="blk.0.bad"):
        dequantize_rows(t, 0, 1)


def test_removed_and_unconvertible_types():
    with pytest.raises(TensorDataError, match="removed"):
        dequantize_raw(GGMLType.Q4_2_REMOVED, np.zeros(0, np.uint8), (0, 32))
    with pytest.raises(TensorDataError, match="Q8_K"):
        dequantize_raw(GGMLType.Q8_K, np.zeros(292, np.uint8), (1, 256))
    with pytest.raises(TensorDataError, match="cannot quantize to IQ2_XXS"):
        quantize(np.zeros((1, 256), np.float32), GGMLType.IQ2_XXS)
    with pytest.raises(GGUFError, match="multiple"):
        quantize(np.zeros((1, 40), np.float32), GGMLType.Q8_0)


def test_rows_out_of_range(zoo):
    q = zoo.tensors["Q4_0.q"]
    for start, stop in [(-1, 2), (3, 2), (0, 33)]:
        with pytest.raises(TensorDataError, match="Q4_0.q.*out of range"):
            dequantize_rows(q, start, stop)


# -- plain types ------------------------------------------------------------------------------

def test_plain_types_are_casts():
    x = np.array([[1.5, -2.0, 3.25, 65280.0]], dtype=np.float32)  # exact in f16 and bf16
    assert np.array_equal(dequantize_raw(GGMLType.F16, x.astype("<f2").view(np.uint8),
                                         x.shape), x)
    bf = (x.view(np.uint32) >> 16).astype("<u2")
    assert np.array_equal(dequantize_raw(GGMLType.BF16, bf, x.shape), x)
    for t, dt in [(GGMLType.I8, "i1"), (GGMLType.I16, "<i2"), (GGMLType.I32, "<i4"),
                  (GGMLType.I64, "<i8"), (GGMLType.F64, "<f8"), (GGMLType.F32, "<f4")]:
        v = np.array([[-3, 0, 7, 100]], dtype=dt)
        y = dequantize_raw(t, v.view(np.uint8), v.shape)
        assert y.dtype == np.float32 and np.array_equal(y, v.astype(np.float32))


def test_q2_0_values():
    """Q2_0 (not in the zoo): four 2-bit codes per byte, low bits first, value (q-1)*d."""
    blk = np.zeros((1, 18), dtype=np.uint8)
    blk[0, :2] = np.array([0.5], dtype="<f2").view(np.uint8)
    blk[0, 2] = 0b11_10_01_00
    y = dequantize_raw(GGMLType.Q2_0, blk, (1, 64))
    assert list(y[0, :4]) == [-0.5, 0.0, 0.5, 1.0] and (y[0, 4:] == -0.5).all()


# -- the real models: every tensor decodes; rows agree with the whole -----------------------

@pytest.mark.parametrize("model", ["smollm2_path", "gemma3_path"])
def test_every_model_tensor_dequantizes(model, request):
    path = request.getfixturevalue(model)
    with gguf.open(path) as f:
        for t in f.tensors.values():
            y = dequantize(t)
            assert y.shape == t.np_shape and y.dtype == np.float32, t.name
            assert np.isfinite(y).all(), t.name
            rows = y.reshape(t.n_rows, -1)
            k = min(2, t.n_rows)
            for start in (0, t.n_rows - k):
                part = dequantize_rows(t, start, start + k)
                assert np.array_equal(bits(part), bits(rows[start:start + k])), t.name


def test_embedding_rows_touch_only_those_rows(gemma3_path):
    with gguf.open(gemma3_path) as f:
        t = f.tensors["token_embd.weight"]
        assert t.np_shape == (262144, 640)
        ids = [0, 2, 1000, 262143]
        got = np.stack([dequantize_rows(t, i, i + 1)[0] for i in ids])
        for i, row in zip(ids, got):
            raw = t.data[i]  # one row of blocks
            assert np.array_equal(bits(dequantize_raw(t.type, raw, (1, 640))[0]), bits(row))
