"""The interleaved GEMM (``quant/int_gemm.py``, AVX512-VNNI) on random weight bytes: every
type it runs gives bit for bit the per-row kernels' numbers (decoding's stream, one
activation row at a time), for any bytes of the values and scales, at the extremes of the
integer ranges, and for whole products whose last 1-7 weight rows the tiles take; and the
numbers are the declaration's (the numpy twin) to float rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from gguflm.gguf.types import GGMLType
from gguflm.quant import act_quant, int_gemm, kernels, kerneltypes
from gguflm.quant.formats import FORMATS
from gguflm.quant.vector_ir import F16_TABLE

GEMM_TYPES = ["Q4_K", "Q6_K", "Q3_K", "Q2_K", "Q8_0", "Q5_0", "IQ4_NL", "IQ4_XS"]
ROWS = 27  # three groups of 8 weight rows and 3 rows left over
K = 768  # three 256-value blocks (24 of 32 values)

pytestmark = pytest.mark.skipif(not int_gemm.USABLE,
                                reason="no AVX512-VNNI: the per-row tiles run every product")


def _weights(name: str, seed: int, fill: int | None = None) -> np.ndarray:
    """``ROWS`` rows of type ``name``: random bytes (or every byte ``fill``), with finite
    float scales (random fp16 of about 0.01) where the format has them."""
    fmt = FORMATS[GGMLType[name]]
    rng = np.random.default_rng(seed)
    nb = ROWS * K // fmt.block_size
    if fill is None:
        blk = rng.integers(0, 256, (nb, fmt.type_size), dtype=np.uint8)
    else:
        blk = np.full((nb, fmt.type_size), fill, np.uint8)
    for f in fmt.fields:
        if f.name in ("d", "dmin") and f.kind == "f16":
            v = (rng.standard_normal(nb) * 0.01).astype("<f2")
            blk[:, f.offset:f.offset + 2] = v.view(np.uint8).reshape(nb, 2)
    return blk.reshape(ROWS, -1)


def _x(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, K)).astype(np.float32)
    x[:, :7] *= 20  # outliers, as real hidden states have
    return x


def _rows_alone(kind: int, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    out = np.empty((len(x), w.shape[0]), np.float32)
    for i in range(len(x)):
        kernels.qmatmul(kind, w, x[i:i + 1], out[i:i + 1], parallel=False)
    return out


def _gemm(kind: int, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``gemm_rows`` over all ``ROWS``: the first 24 columns its, the rest NaN."""
    a32, ak = act_quant.activation_sets(np.array([kind]), 1, x)
    a = ak if kind in act_quant.Q8_K_KINDS else a32
    out = np.full((len(x), ROWS), np.nan, np.float32)
    assert int_gemm.gemm_rows(kind, w, 0, ROWS, a.qa, a.da, a.aux, a.cor, a.qu, F16_TABLE,
                              out) == 24
    return out


@pytest.mark.parametrize("name", GEMM_TYPES)
def test_gemm_on_random_bytes_equals_rows_alone(name: str) -> None:
    kind = int(GGMLType[name])
    assert kind in int_gemm.GEMM_KINDS
    w = _weights(name, seed=1)
    for n in (8, 11, 16):  # 4-row passes, then single rows
        x = _x(n, seed=n)
        got = _gemm(kind, w, x)
        assert np.isnan(got[:, 24:]).all()
        alone = _rows_alone(kind, w, x)
        np.testing.assert_array_equal(got[:, :24], alone[:, :24])
        whole = np.empty_like(alone)  # the GEMM's groups and the tiles' last 3 rows
        kernels.qmatmul(kind, w, x, whole)
        np.testing.assert_array_equal(whole, alone)
        twin = kerneltypes.twin_qmatmul(kind, w, x)
        assert np.abs(whole - twin).max() <= 2e-6 * np.abs(twin).max()


@pytest.mark.parametrize("name", GEMM_TYPES)
@pytest.mark.parametrize("fill", [0x00, 0xFF])
def test_gemm_at_the_integer_extremes_equals_rows_alone(name: str, fill: int) -> None:
    """Every value and scale byte 0 or 255 (IQ4_XS: -127 or 113 at scale -32 or 31; Q3_K:
    -4 at scale -32 or 3 at 31; ...) times activations of +-127: the sums that must fit
    the kernels' 16-bit and 32-bit steps, at their largest."""
    kind = int(GGMLType[name])
    w = _weights(name, seed=2, fill=fill)
    x = np.ones((9, K), np.float32)
    x[1::2] = -1.0  # rows quantized to all +127 or all -127
    x[2] = np.where(np.arange(K) % 2, 1.0, -1.0)
    got = _gemm(kind, w, x)
    np.testing.assert_array_equal(got[:, :24], _rows_alone(kind, w, x)[:, :24])
    twin = kerneltypes.twin_qmatmul(kind, w, x)
    assert np.abs(got[:, :24] - twin[:, :24]).max() <= 2e-6 * np.abs(twin).max()
