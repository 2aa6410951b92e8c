"""The fixed-order float products (quant/floatdot.py) behind F32 weights and the fallback
types: each output element bit-identical whatever the batch around its row, serial or
parallel, and equal to the numpy twin; and QMatrix products of F32, F16 and a fallback
type (Q2_K) batch-invariant on real encodings."""

from __future__ import annotations

import numpy as np

from gguflm.gguf.types import GGMLType
from gguflm.quant import quantize
from gguflm.quant.floatdot import f32_matmul, twin_f32_matmul
from gguflm.quant.matrix import QMatrix


def test_kernel_equals_its_twin_and_ignores_the_batch() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((37, 203)).astype(np.float32)   # K not a multiple of 8
    x = rng.standard_normal((9, 203)).astype(np.float32)
    out = np.empty((9, 37), np.float32)
    f32_matmul(x, w, out, parallel=True)
    assert np.array_equal(out, twin_f32_matmul(x, w))
    for i in range(9):
        one = np.empty((1, 37), np.float32)
        f32_matmul(x[i:i + 1], w, one, parallel=False)
        assert np.array_equal(one[0], out[i])


def test_qmatrix_products_are_batch_invariant() -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((48, 256)).astype(np.float32)
    mats = [QMatrix(GGMLType.F32, w, w.shape),
            QMatrix(GGMLType.F16, w.astype(np.float16).view(np.uint16), w.shape),
            QMatrix(GGMLType.Q2_K, quantize(w, GGMLType.Q2_K), w.shape)]
    x = rng.standard_normal((13, 256)).astype(np.float32)
    for m in mats:
        full = m.matmul(x)
        for n in (1, 3, 4, 5, 8):
            part = m.matmul(x[2:2 + n])
            assert np.array_equal(part, full[2:2 + n]), (m, n)
