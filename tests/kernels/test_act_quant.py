"""Activation quantization and dot products against ggml's own CPU backend
(shared/reference/act-quant: ggml-cpu's ``from_float`` and ``vec_dot`` on the quant zoo).

- Q8_0/Q8_1/Q8_K activation blocks: byte for byte, from the kernels' quantizers and twins.
- Integer-kernel types: ggml's arithmetic (same 8-bit activations, same integer block dots,
  same float32 scale products), so only the float summation order may differ: within 1e-6
  of the sum of the magnitudes of the block terms (ggml itself is up to ~3e-7 from the
  exact sum of its own terms on this data).
- Every other type multiplies float activations with the dequantized weights, where ggml
  multiplies its 8-bit activations: the difference is bounded by ``|W| @ |x - x8|`` with
  ``x8`` ggml's own dequantized activation bytes, plus summation noise.
"""

from __future__ import annotations

import numpy as np
import pytest

import gguflm.gguf as gguf
from gguflm.gguf.types import GGMLType
from gguflm.quant import kernels, kerneltypes
from gguflm.quant.formats import FORMATS, f16_to_f32
from gguflm.quant.matrix import QMatrix

KERNEL_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                "IQ4_NL", "IQ4_XS", "MXFP4"]
FALLBACK_TYPES = ["IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ3_S", "IQ2_S", "IQ1_M", "TQ1_0",
                  "TQ2_0", "NVFP4", "Q1_0"]
SUM_ORDER_TOL = 1e-6


@pytest.fixture(scope="module")
def act(reference):  # noqa: ANN001, ANN201
    path = reference / "act-quant" / "act-quant.gguf"
    if not path.is_file():
        pytest.skip(f"{path} not found (older reference data)")
    f = gguf.open(path)
    yield f
    f.close()


@pytest.fixture(scope="module")
def zoo(reference):  # noqa: ANN001, ANN201
    f = gguf.open(reference / "quant-zoo" / "quant-zoo.gguf")
    yield f
    f.close()


def _x(act) -> np.ndarray:  # noqa: ANN001
    return np.ascontiguousarray(act.tensors["act.f32"].data)


def _dot_table(act, name: str) -> np.ndarray:  # noqa: ANN001
    """ggml's vec_dot of zoo row r with activation row a, as (activations, rows)."""
    return np.ascontiguousarray(act.tensors[f"dot.{name}.f32"].data.T)


def _weights(zoo, name: str, rows: int) -> QMatrix:  # noqa: ANN001
    t = zoo.tensors[f"{name}.q"]
    return QMatrix(t.type, t.data[:rows], (rows, t.shape[0]), name=name)


@pytest.mark.parametrize("name", ["Q8_0", "Q8_1", "Q8_K"])
def test_activation_blocks_are_ggmls_bytes(act, name: str) -> None:  # noqa: ANN001
    x = _x(act)
    ref = act.tensors[f"act.{name}.bytes"].data.view(np.uint8)
    t = GGMLType[name]
    np.testing.assert_array_equal(kernels.activation_blocks(x, t), ref)
    twin = kerneltypes.twin_quantize_q8_k if t == GGMLType.Q8_K else kerneltypes.twin_quantize_q8_0
    np.testing.assert_array_equal(kerneltypes.pack_activation_blocks(t, *twin(x)), ref)


@pytest.mark.parametrize("name", KERNEL_TYPES)
def test_kernel_dot_products_are_ggmls(act, zoo, name: str) -> None:  # noqa: ANN001
    x = _x(act)
    ref = _dot_table(act, name).astype(np.float64)
    m = _weights(zoo, name, ref.shape[1])
    assert act.metadata[f"dot.{name}.act"] == kerneltypes.kernel_type(m.type).act.ggml_name
    terms = kerneltypes.twin_block_terms(int(m.type), m.raw, x)
    scale = np.abs(terms).sum((-1, -2))  # what a summation order can move the result by
    twin = terms.sum((-1, -2))
    for ours in (m.matmul(x), kernels.qmatmul(int(m.type), m.raw, x,
                                              np.empty_like(ref, np.float32), parallel=False)):
        err = np.abs(ours - ref)
        assert (err <= SUM_ORDER_TOL * scale).all(), float((err / scale).max())
    assert (np.abs(twin - ref) <= SUM_ORDER_TOL * scale).all()


def _ggml_activations(act, name: str) -> np.ndarray:  # noqa: ANN001
    """ggml's 8-bit activations (the bytes it recorded) back as float64 values."""
    fmt = FORMATS[GGMLType[name]]
    blk = act.tensors[f"act.{name}.bytes"].data.view(np.uint8).reshape(-1, fmt.type_size)
    if name == "Q8_K":
        d = fmt.field(blk, "d").copy().view("<f4")[:, 0]
    else:
        d = f16_to_f32(fmt.field(blk, "d"))
    q = fmt.field(blk, "qs").astype(np.float64)
    return (q * d[:, None].astype(np.float64)).reshape(_x(act).shape)


@pytest.mark.parametrize("name", FALLBACK_TYPES)
def test_fallback_dot_products_within_activation_rounding(act, zoo, name: str) -> None:  # noqa: ANN001
    """Dequantized weights times float activations vs ggml's integer arithmetic: apart from
    summation noise, they differ by exactly ``W @ (x - x8)``, so ``|W| @ |x - x8|`` bounds
    it; and the bound is tight enough to matter (a wrong weight breaks it)."""
    x = _x(act)
    ref = _dot_table(act, name).astype(np.float64)
    m = _weights(zoo, name, ref.shape[1])
    w = np.abs(zoo.tensors[f"{name}.f32"].data[:ref.shape[1]].astype(np.float64))
    x8 = _ggml_activations(act, act.metadata[f"dot.{name}.act"])
    bound = np.abs(x - x8) @ w.T + SUM_ORDER_TOL * ((np.abs(x) + np.abs(x8)) @ w.T)
    err = np.abs(m.matmul(x) - ref)
    assert (err <= bound).all(), float((err / bound).max())
    assert (err > 0.05 * bound).any()  # the activation rounding is what is measured


@pytest.mark.parametrize("name", ["BF16", "F16"])
def test_float_dot_products_are_ggmls(act, zoo, name: str) -> None:  # noqa: ANN001
    """F16/BF16: activations rounded to the weight's type, float products: ggml's arithmetic
    up to summation order."""
    x = _x(act)
    ref = _dot_table(act, name).astype(np.float64)
    if not np.isfinite(ref).all():
        pytest.skip(f"act-quant.gguf's dot.{name}.f32 holds NaN: not a usable recording")
    m = _weights(zoo, name, ref.shape[1])
    w = np.abs(zoo.tensors[f"{name}.f32"].data[:ref.shape[1]].astype(np.float64))
    scale = np.abs(x) @ w.T
    assert (np.abs(m.matmul(x) - ref) <= SUM_ORDER_TOL * scale).all()
