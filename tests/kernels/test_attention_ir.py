"""attention_ir's two vector loops equal their plain float32 definitions bit for bit: a
score is a sum over the head dimension in index order of separately rounded products, an
output element a sum over positions in order (numpy float32 arithmetic is IEEE single, so
the twins below are exact), for float16 and float32 caches and sizes with tails."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from gguflm.model.attention_ir import E_STEP, J_STEP, tile_scores, weighted_sum


@njit(cache=False)
def _scores(qg, kk, out):  # noqa: ANN001, ANN202
    tile_scores(qg, kk, out)


@njit(cache=False)
def _wsum(pg, vals, out):  # noqa: ANN001, ANN202
    weighted_sum(pg, vals, out)


def _twin_scores(qg: np.ndarray, k: np.ndarray) -> np.ndarray:
    out = np.zeros((len(qg), k.shape[1]), np.float32)
    for e in range(k.shape[0]):
        out = out + qg[:, e:e + 1] * k[e][None, :]  # float32 product, then float32 sum
    return out


def _twin_wsum(pg: np.ndarray, v: np.ndarray) -> np.ndarray:
    out = np.zeros((len(pg), v.shape[1]), np.float32)
    for j in range(v.shape[0]):
        out = out + pg[:, j:j + 1] * v[j][None, :]
    return out


def _cache(x: np.ndarray, f16: bool) -> tuple[np.ndarray, np.ndarray]:
    """(array as the cache holds it, its float32 values)."""
    if f16:
        h = x.astype(np.float16)
        return h.view(np.uint16), h.astype(np.float32)
    return x, x


@pytest.mark.parametrize("f16", [True, False])
@pytest.mark.parametrize("heads,d", [(1, 8), (3, 64), (4, 256), (2, E_STEP + 5), (6, 128),
                                     (7, 64), (16, 64)])
def test_tile_scores_equal_the_ordered_sums(f16: bool, heads: int, d: int) -> None:
    rng = np.random.default_rng(d)
    qg = rng.standard_normal((heads, d)).astype(np.float32)
    kk, kf = _cache(rng.standard_normal((d, 64)).astype(np.float32), f16)
    out = np.full((heads, 64), np.nan, np.float32)  # every element written
    _scores(qg, kk, out)
    np.testing.assert_array_equal(out, _twin_scores(qg, kf))
    # rows of the queries and of the output strided (slices of bigger arrays), as the
    # attention kernel passes them
    big_q = np.zeros((heads + 2, d), np.float32)
    big_q[1:-1] = qg
    big_out = np.zeros((heads, 80), np.float32)
    _scores(big_q[1:-1], kk, big_out[:, 8:72])
    np.testing.assert_array_equal(big_out[:, 8:72], out)


@pytest.mark.parametrize("f16", [True, False])
@pytest.mark.parametrize("heads,n,d_v", [(1, 1, 8), (3, 70, 64), (4, 2 * J_STEP + 3, 256),
                                         (2, 9, 100), (2, 5, 3), (6, 40, 128), (7, 65, 100),
                                         (16, 3, 64)])
def test_weighted_sum_equals_the_ordered_sums(f16: bool, heads: int, n: int, d_v: int) -> None:
    rng = np.random.default_rng(n + d_v)
    pg = rng.random((heads, n)).astype(np.float32)
    vals, vf = _cache(rng.standard_normal((n, d_v)).astype(np.float32), f16)
    out = np.full((heads, d_v), np.nan, np.float32)
    _wsum(pg, vals, out)
    np.testing.assert_array_equal(out, _twin_wsum(pg, vf))
    # the probabilities as a column slice of the scores array, as the kernel passes them
    sc = np.zeros((heads, n + 7), np.float32)
    sc[:, 7:] = pg
    again = np.empty_like(out)
    _wsum(sc[:, 7:], vals, again)
    np.testing.assert_array_equal(again, out)
