"""quant/rowsplit: sharing out activation rows gives exactly the one-thread product."""

from __future__ import annotations

import numpy as np

from gguflm.gguf.types import GGMLType
from gguflm.quant import kernels
from gguflm.quant.float_tiles import NO_BIAS
from gguflm.quant.matrix import QMatrix
from gguflm.quant.rowsplit import f16_matmul_xrows


def test_f16_rows_shared_out_are_bit_identical() -> None:
    rng = np.random.default_rng(3)
    for n, r, k in ((37, 64, 80), (16, 8, 32), (100, 384, 384)):
        w = rng.standard_normal((r, k)).astype(np.float16).view(np.uint16)
        x = rng.standard_normal((n, k)).astype(np.float32)
        one, split = np.empty((n, r), np.float32), np.empty((n, r), np.float32)
        kernels.f16_matmul_rows(w, x, one, 0, r)
        f16_matmul_xrows(w, x, split, NO_BIAS, 0)
        assert np.array_equal(one, split)
        m = QMatrix(GGMLType.F16, w.view(np.float16), (r, k))  # the dispatch, any batch size
        alone = np.concatenate([m.matmul(x[i:i + 1]) for i in range(n)])
        assert np.array_equal(m.matmul(x), alone)


def test_f16_bias_added_in_the_kernel_equals_adding_it_after() -> None:
    """The products' bias added as each output is stored gives the bits of ``y += b`` after
    the product, in every path (tiles of 4x4 and their tails, decoding rows, rows shared
    out, weight rows shared out), and a -0.0 product stays -0.0 without a bias."""
    rng = np.random.default_rng(5)
    for n, r, k in ((37, 66, 80), (1, 9, 33), (5, 4100, 48)):
        w = rng.standard_normal((r, k)).astype(np.float16).view(np.uint16)
        x = rng.standard_normal((n, k)).astype(np.float32)
        b = rng.standard_normal(r).astype(np.float32)
        after = np.empty((n, r), np.float32)
        kernels.f16_matmul_rows(w, x, after, 0, r)
        after += b
        for run in (f16_matmul_xrows, kernels.f16_matmul_par):
            run(w, x, got := np.empty((n, r), np.float32), b, 1)
            assert np.array_equal(got, after)
