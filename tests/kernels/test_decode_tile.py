"""Decoding's tiles (``int_tiles``: four weight rows, taken from the four quarters of a
row range or in another walk of ``int_tiles.WALKS``, times one activation row, or two for
a few sequences decoded together; the types with parity lanes, Q4_K and Q6_K, keep the
four rows' lanes side by side in shared vectors) on random weight bytes and at the integer
extremes: every number is bit for bit the one the same weight row gets alone against the
same activation row alone (one-row tile), for every integer-kernel type, and the
declaration's (the numpy twin) to float rounding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gguflm.gguf.types import GGMLType
from gguflm.quant import int_tiles, kernels, kerneltypes
from gguflm.quant.kerneltypes import KERNEL_TYPES
from refcheck import random_weights, run_built_for

NAMES = [t.name for t in KERNEL_TYPES]
ROWS = 4 * 5 + 3  # five four-row passes, then three rows one at a time
K = 512


def _weights(name: str, seed: int, fill: int | None = None) -> np.ndarray:
    return random_weights(name, ROWS, K, seed, fill)


def _check(name: str, w: np.ndarray, x: np.ndarray, walk: int = 0) -> None:
    kind = int(GGMLType[name])
    whole = np.empty((x.shape[0], ROWS), np.float32)
    settings = int_tiles.kernel_settings()
    slots = int_tiles.WALK_SETTINGS  # both classes: some types' rows here are long
    before = [settings[s] for s in slots]
    for s in slots:
        settings[s] = walk
    try:
        kernels.qmatmul(kind, w, x, whole, parallel=False)
    finally:
        for s, b in zip(slots, before, strict=True):
            settings[s] = b
    alone = np.empty_like(whole)
    for r in range(ROWS):
        for i in range(x.shape[0]):
            kernels.qmatmul(kind, w[r:r + 1], x[i:i + 1], alone[i:i + 1, r:r + 1],
                            parallel=False)
    np.testing.assert_array_equal(whole, alone)
    twin = kerneltypes.twin_qmatmul(kind, w, x)
    assert np.abs(whole - twin).max() <= 2e-6 * np.abs(twin).max()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("walk", range(len(int_tiles.WALKS)))
@pytest.mark.parametrize("acts", [1, 2, 3])
def test_decoding_tile_on_random_bytes_equals_rows_alone(name: str, walk: int,
                                                         acts: int) -> None:
    """Whichever walk over the rows decoding takes (``int_tiles.WALKS``, chosen by
    measuring the machine), with one activation row or a few (two a tile, then one),
    every number is the one its rows get alone."""
    x = np.random.default_rng(3).standard_normal((acts, K)).astype(np.float32)
    x[:, :7] *= 20  # outliers, as real hidden states have
    _check(name, _weights(name, seed=1), x, walk)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("fill", [0x00, 0xFF])
def test_decoding_tile_at_the_integer_extremes_equals_rows_alone(name: str, fill: int) -> None:
    """Every value and scale byte 0 or 255 times activations of all +127 or alternating
    signs: the sums that must fit the kernels' 16-bit and 32-bit steps, at their largest."""
    w = _weights(name, seed=2, fill=fill)
    ones = np.ones((1, K), np.float32)
    signs = np.where(np.arange(K) % 2, 1.0, -1.0).astype(np.float32)[None]
    for x in (ones, signs, np.concatenate([ones, signs, -ones])):
        _check(name, w, x)


@pytest.mark.parametrize("simd", ["avx2", "generic"])
def test_decoding_tile_same_bits_on_every_build(simd: str, tmp_path) -> None:  # noqa: ANN001
    """The four-row tiles of the types with parity lanes (on AVX-512 Q4_K's and Q6_K's
    512-bit steps, elsewhere 256-bit or portable IR, the four rows' scales unpacked together
    everywhere; one activation row or two) give the native build's bits under the AVX2 and
    the portable builds, on random bytes and at the integer extremes."""
    if simd == "avx2" and kernels.SIMD == "generic":
        pytest.skip("not an x86 CPU with AVX2")
    names = [t.name for t, k in KERNEL_TYPES.items() if k.parity_lanes]
    cases = [(name, seed, fill) for name in names
             for seed, fill in ((1, None), (2, 0x00), (2, 0xFF))]
    x = np.random.default_rng(4).standard_normal((3, K)).astype(np.float32)
    x[:, :5] *= 30  # three activation rows: the two-row tile and the one-row tile
    np.save(tmp_path / "x.npy", x)
    code = (
        "import sys, numpy as np\n"
        f"sys.path.insert(0, {str(Path(__file__).parents[1])!r})\n"
        "from refcheck import random_weights\n"
        "from gguflm.gguf.types import GGMLType\n"
        "from gguflm.quant import kernels as K\n"
        f"assert K.SIMD == {simd!r}\n"
        f"x = np.load({str(tmp_path / 'x.npy')!r})\n"
        "res = {}\n"
        f"for name, seed, fill in {cases!r}:\n"
        f"    w = random_weights(name, {ROWS}, {K}, seed, fill)\n"
        f"    out = np.empty((3, {ROWS}), np.float32)\n"
        "    K.qmatmul(int(GGMLType[name]), w, x, out, parallel=False)\n"
        "    res[f'{name}_{seed}_{fill}'] = out\n"
        f"np.savez({str(tmp_path / 'out.npz')!r}, **res)\n"
    )
    run_built_for(simd, code, tmp_path)
    theirs = np.load(tmp_path / "out.npz")
    for name, seed, fill in cases:
        mine = np.empty((3, ROWS), np.float32)
        kernels.qmatmul(int(GGMLType[name]), _weights(name, seed, fill), x, mine, parallel=False)
        np.testing.assert_array_equal(mine, theirs[f"{name}_{seed}_{fill}"], err_msg=name)
