"""The interleaved GEMM (``quant/int_gemm.py``, AVX512-VNNI) on random weight bytes: every
type it runs gives bit for bit the per-row kernels' numbers (decoding's stream, one
activation row at a time), for any bytes of the values and scales, at the extremes of the
integer ranges, and for whole products whose last 1-7 weight rows the tiles take; and the
numbers are the declaration's (the numpy twin) to float rounding. Its 256-bit variant
(``quant/gemm_ymm.py``; AVX2 and AVX-VNNI, forced with ``GGUFLM_SIMD``) gives the same
bits on the same cases.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gguflm.gguf.types import GGMLType
from gguflm.quant import act_quant, gemm_ymm, int_gemm, kernels, kerneltypes
from gguflm.quant.vector_ir import F16_TABLE, VNNI
from refcheck import random_weights, run_built_for

GEMM_TYPES = ["Q4_K", "Q6_K", "Q5_K", "Q3_K", "Q2_K", "Q8_0", "Q4_0", "Q5_0", "IQ4_NL", "IQ4_XS"]
ROWS = 27  # three groups of 8 weight rows and 3 rows left over
K = 768  # three 256-value blocks (24 of 32 values)

needs_512 = pytest.mark.skipif(not int_gemm.WIDE_GEMM,
                               reason="no AVX512-VNNI: the 256-bit GEMM runs fewer types")


def _weights(name: str, seed: int, fill: int | None = None) -> np.ndarray:
    return random_weights(name, ROWS, K, seed, fill)


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


@needs_512
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


def _extreme_x() -> np.ndarray:
    x = np.ones((9, K), np.float32)
    x[1::2] = -1.0  # rows quantized to all -127 (Q8_K: the largest magnitude gives -127)
    x[2] = np.where(np.arange(K) % 2, 1.0, -1.0)
    x[4, ::32] = -1.0  # all +127 but the first of each 32 (Q8_0: all +127 or -127)
    return x


@needs_512
@pytest.mark.parametrize("name", GEMM_TYPES)
@pytest.mark.parametrize("fill", [0x00, 0xFF])
def test_gemm_at_the_integer_extremes_equals_rows_alone(name: str, fill: int) -> None:
    """Every value and scale byte 0 or 255 (IQ4_XS: -127 or 113 at scale -32 or 31; Q3_K:
    -4 at scale -32 or 3 at 31; ...) times activations of +-127 (plus 128: 1 or 255): the
    sums that must fit the kernels' 16-bit and 32-bit steps, at their largest."""
    kind = int(GGMLType[name])
    w = _weights(name, seed=2, fill=fill)
    x = _extreme_x()
    got = _gemm(kind, w, x)
    np.testing.assert_array_equal(got[:, :24], _rows_alone(kind, w, x)[:, :24])
    twin = kerneltypes.twin_qmatmul(kind, w, x)
    assert np.abs(got[:, :24] - twin[:, :24]).max() <= 2e-6 * np.abs(twin).max()


# -- the 256-bit variant ----------------------------------------------------------------------

Y_TYPES = [n for n in GEMM_TYPES if int(GGMLType[n]) in gemm_ymm.TYPES]


def _cases(name: str) -> dict:
    """The tests above's weights and activations: random bytes times 8, 11 and 16 rows (the
    passes of several rows, then single rows), and the integer extremes."""
    w = _weights(name, seed=1)
    cases = {f"{name}_random_{n}": (w, _x(n, seed=n)) for n in (8, 11, 16)}
    for fill in (0x00, 0xFF):
        cases[f"{name}_fill_{fill}"] = (_weights(name, seed=2, fill=fill), _extreme_x())
    return cases


def variant_results(names: list) -> dict:
    """Each case's GEMM results on this process's variant, checked bit for bit against the
    per-row tiles of the same process."""
    res = {}
    for name in names:
        kind = int(GGMLType[name])
        assert kind in int_gemm.GEMM_KINDS, name
        for key, (w, x) in _cases(name).items():
            got = _gemm(kind, w, x)
            alone = _rows_alone(kind, w, x)
            np.testing.assert_array_equal(got[:, :24], alone[:, :24], err_msg=key)
            whole = np.empty_like(alone)  # the product's dispatch: the GEMM, then the tiles
            kernels.qmatmul(kind, w, x, whole, parallel=False)
            np.testing.assert_array_equal(whole, alone, err_msg=key)
            res[key] = got
    return res


@pytest.mark.skipif(not int_gemm.USABLE, reason="not an x86 CPU with AVX2")
@pytest.mark.parametrize("simd", ["avx2", "avxvnni"])
def test_256_bit_gemm_same_numbers(simd: str, tmp_path: Path) -> None:
    """The 256-bit GEMM (AVX2: ``pmaddubsw``; AVX-VNNI: 256-bit ``vpdpbusd``) runs Q4_K,
    Q6_K and the 32-value types Q8_0, Q4_0, Q5_0 and IQ4_NL and gives its own process's per-row
    tiles' bits, on random bytes and at the integer extremes, and this process's GEMM's
    (the 512-bit one here where the CPU has AVX512-VNNI)."""
    if simd == "avxvnni" and not VNNI:
        pytest.skip("this CPU has no VNNI")
    assert Y_TYPES == ["Q4_K", "Q6_K", "Q8_0", "Q4_0", "Q5_0", "IQ4_NL"]
    code = (
        "import sys, numpy as np\n"
        f"sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]\n"
        "import test_int_gemm as T\n"
        "from gguflm.quant import int_gemm, vector_ir as V\n"
        f"assert V.SIMD == 'avx2' and V.VNNI == {simd == 'avxvnni'} and not V.WIDE\n"
        "assert not int_gemm.WIDE_GEMM and not V.GFNI\n"
        f"np.savez({str(tmp_path / 'y.npz')!r}, **T.variant_results(T.Y_TYPES))\n"
    )
    run_built_for(simd, code, tmp_path)
    ref = np.load(tmp_path / "y.npz")
    assert len(ref.files) == 5 * len(Y_TYPES)
    for name in Y_TYPES:
        for key, (w, x) in _cases(name).items():
            np.testing.assert_array_equal(ref[key], _gemm(int(GGMLType[name]), w, x),
                                          err_msg=key)
