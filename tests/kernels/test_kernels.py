"""Quantized kernels and QMatrix: kernel vs numpy twin (tight), both vs float products
(within 8-bit activation error), activation quantizers vs their twins, the fallback path.

Weights are ggml's own quantizations from shared/reference/quant-zoo (every type), and the
real models' tensors where present.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import gguflm.gguf as gguf
from gguflm.gguf.types import GGMLType
from gguflm.quant import dequantize, kernels, kerneltypes
from gguflm.quant.float_tiles import NO_BIAS
from gguflm.quant.matrix import QMatrix
from refcheck import run_built_for

KERNEL_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                "IQ4_NL", "IQ4_XS", "MXFP4"]
# 8-bit activations cost ~0.7% of the largest output for 32-blocks, ~1.5% for 256-blocks
# (one scale per 256 values); a wrong unpacking is off by tens of percent.
ACT_TOL = {name: 0.03 for name in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")}


@pytest.fixture(scope="module")
def zoo(reference):  # noqa: ANN001, ANN201
    f = gguf.open(reference / "quant-zoo" / "quant-zoo.gguf")
    yield f
    f.close()


def _x(n: int, k: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, k)).astype(np.float32)
    x[:, :7] *= 20  # an outlier channel or two, as real hidden states have
    return x


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b).max() / np.abs(b).max())


@pytest.mark.parametrize("name", KERNEL_TYPES)
def test_kernel_matches_twin_and_float(zoo, name: str) -> None:  # noqa: ANN001
    t = zoo.tensors[f"{name}.q"]
    w = t.data[:19]  # an odd row count: a partial row chunk
    wf = zoo.tensors[f"{name}.f32"].data[:19].astype(np.float64)
    x = _x(3, t.shape[0])
    out = np.full((3, 19), np.nan, np.float32)
    kernels.qmatmul(int(t.type), w, x, out)
    twin = kerneltypes.twin_qmatmul(int(t.type), w, x)
    assert _rel(out, twin) < 2e-6
    ref = x.astype(np.float64) @ wf.T
    assert _rel(twin, ref) < ACT_TOL.get(name, 0.015)
    serial = np.empty_like(out)
    kernels.qmatmul(int(t.type), w, x, serial, parallel=False)
    np.testing.assert_array_equal(out, serial)


@pytest.mark.parametrize("k", [1536, 37])
def test_f16_kernel_matches_twin(k: int) -> None:
    """F16 rows (any length: 16 values per vector step, then a scalar tail), serial and
    parallel, against the numpy twin."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((45, k)).astype(np.float16).view(np.uint16)
    x = rng.standard_normal((2, k)).astype(np.float16).astype(np.float32)
    twin = kernels.twin_f16_matmul(w, x)
    out = np.full((2, 45), np.nan, np.float32)
    kernels.f16_matmul_rows(w, x, out, 0, 45)
    assert _rel(out, twin) < 1e-6
    kernels.f16_matmul_par(w, x, out, NO_BIAS, 0)
    assert _rel(out, twin) < 1e-6


@pytest.mark.parametrize("rows", [3, 300])  # one thread, and rows shared out
def test_f16_rounding_is_numpys(rows: int) -> None:
    """An F16 weight's activations are rounded as numpy's astype(float16) rounds them (ties
    to even, subnormals, infinite past 65504, NaN kept), by the compiled F16C loops."""
    from gguflm.quant.float_tiles import rounded_f16, rounded_f16_par

    rng = np.random.default_rng(3)
    x = (rng.standard_normal((rows, 256)) * 10.0 ** rng.integers(-9, 6, (rows, 256)))
    x = x.astype(np.float32)
    x[0, :8] = [65504.0, 65520.0, -1e9, np.nan, 6e-8, 2.9e-8, 1.0 + 2.0 ** -11, -0.0]
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).astype(np.float32)
    for fn in (rounded_f16, rounded_f16_par):
        assert np.array_equal(fn(x).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("rows", [3, 300])  # one thread, and rows shared out
def test_bf16_rounding_is_ggmls(rows: int) -> None:
    """A BF16 weight's activations are rounded as ggml's fp32_to_bf16 rounds them (nearest,
    ties to even on the 16 dropped bits, a NaN kept quiet), by the compiled loops."""
    from gguflm.quant.float_tiles import rounded_bf16, rounded_bf16_par

    rng = np.random.default_rng(6)
    x = (rng.standard_normal((rows, 256)) * 10.0 ** rng.integers(-30, 30, (rows, 256)))
    x = x.astype(np.float32)
    x[0, :6] = [np.nan, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, -0.0, 3.4e38, 1e-40]
    u = x.view(np.uint32).astype(np.uint64)
    want = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    nan = np.isnan(x)
    want[nan] = (x.view(np.uint32)[nan] & 0xFFFF0000) | 0x00400000
    for fn in (rounded_bf16, rounded_bf16_par):
        assert np.array_equal(fn(x).view(np.uint32), want)


@pytest.mark.parametrize("k", [1536, 37])
def test_bf16_tiles_match_twin_and_give_each_row_its_own_numbers(k: int) -> None:
    """BF16 rows (int16 bits: the tiles' BF16) through F16's tiles: the numpy twin, and
    each activation row of a batch bit for bit its product alone."""
    from gguflm.quant.float_tiles import bf16_bits, rounded_bf16, twin_bf16_matmul

    rng = np.random.default_rng(7)
    w = bf16_bits((rng.standard_normal((45, k)).astype(np.float32).view(np.uint32) >> 16)
                  .astype(np.uint16))
    x = rounded_bf16(rng.standard_normal((9, k)).astype(np.float32))
    alone = np.empty((9, 45), np.float32)
    for i in range(9):
        kernels.f16_matmul_rows(w, x[i:i + 1], alone[i:i + 1], 0, 45)
    assert _rel(alone, twin_bf16_matmul(w, x)) < 1e-6
    for n in (1, 4, 5, 9):
        out = np.full((n, 45), np.nan, np.float32)
        kernels.f16_matmul_rows(w, x[:n], out, 0, 45)
        assert np.array_equal(out, alone[:n]), n
    kernels.f16_matmul_par(w, x, out := np.empty((9, 45), np.float32), NO_BIAS, 0)
    assert np.array_equal(out, alone)


@pytest.mark.parametrize("k", [384, 37])
def test_f16_tiles_give_each_row_its_own_numbers(k: int) -> None:
    """The 4x4 tiles of a batch (any row count, weight rows past a multiple of 4, a scalar
    tail) give exactly the numbers of each activation row alone."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((71, k)).astype(np.float16).view(np.uint16)
    x = rng.standard_normal((9, k)).astype(np.float16).astype(np.float32)
    alone = np.empty((9, 71), np.float32)
    for i in range(9):
        kernels.f16_matmul_rows(w, x[i:i + 1], alone[i:i + 1], 0, 71)
    assert _rel(alone, kernels.twin_f16_matmul(w, x)) < 1e-6
    for n in range(1, 10):
        out = np.full((n, 71), np.nan, np.float32)
        kernels.f16_matmul_rows(w, x[:n], out, 0, 71)
        assert np.array_equal(out, alone[:n]), n
        kernels.f16_matmul_rows(w, x[:n], out, 5, 38)  # a row range, as a work item
        assert np.array_equal(out[:, 5:38], alone[:n, 5:38]), n


@pytest.mark.parametrize("quant,twin,qk", [
    (kernels.quantize_q8_0, kerneltypes.twin_quantize_q8_0, 32),
    (kernels.quantize_q8_k, kerneltypes.twin_quantize_q8_k, 256),
])
def test_activation_quantizers_match_twins(quant, twin, qk: int) -> None:  # noqa: ANN001
    x = _x(3, 512, seed=5)
    x[1, :256] = 0  # an all-zero block
    x[2, 3] = 1e-7  # tiny values: fp16 subnormal scales
    x[2, 4:32] = 0
    x[0, 40], x[0, 300] = -9.0, 9.0  # magnitudes tied in a block: the first one's sign
    x[0, 260], x[0, 290] = 9.0, -9.0
    qa = np.empty(x.shape, np.int8)
    da = np.empty((3, 512 // qk), np.float32)
    aux = np.empty((3, 512 // 32), np.float32)
    quant(x, qa, da, aux)
    tq, td, taux = twin(x)
    np.testing.assert_array_equal(qa, tq)
    np.testing.assert_array_equal(da, td)
    np.testing.assert_array_equal(aux, taux)
    assert np.abs(qa.astype(np.int32)).max() == 127


def _ggml_block_max(block: np.ndarray) -> tuple[float, float]:
    """ggml's scan: (amax, the first value with it), ``ax > amax`` skipping NaNs."""
    amax = vmax = np.float32(0)
    for v in block:
        if abs(v) > amax:
            amax, vmax = abs(v), v
    return amax, vmax


def test_activation_quantizers_scan_as_ggml_with_nan_and_inf() -> None:
    """The quantizers' block maximum (Q8_K's by integer lanes over the floats' bits) is
    ggml's float scan's, NaNs and infinities included."""
    x = _x(4, 512, seed=9)
    x[0, 3], x[0, 7] = np.nan, np.inf  # a NaN before an infinity, both in one block
    x[1, 300], x[1, 301] = -np.inf, np.nan
    x[2, 10:40] = np.nan  # a Q8_0 block of NaNs and zeros
    x[2, 32:40] = 0
    x[3, :256] = -0.0
    with np.errstate(invalid="ignore", divide="ignore"):
        qa = np.empty(x.shape, np.int8)
        dk, auxk = np.empty((4, 2), np.float32), np.empty((4, 16), np.float32)
        kernels.quantize_q8_k(x, qa, dk, auxk)
        d0, aux0 = np.empty((4, 16), np.float32), np.empty((4, 16), np.float32)
        kernels.quantize_q8_0(x, np.empty(x.shape, np.int8), d0, aux0)
    for i in range(4):
        for b in range(2):
            amax, vmax = _ggml_block_max(x[i, 256 * b:256 * (b + 1)])
            with np.errstate(divide="ignore"):  # an infinity's scale: 1 / -0.0
                want = np.float32(0) if amax == 0 else np.float32(1) / (np.float32(-127) / vmax)
            assert np.array_equal(dk[i, b], want, equal_nan=True), (i, b)
        for b in range(16):
            amax, _ = _ggml_block_max(x[i, 32 * b:32 * (b + 1)])
            want = np.float16(amax / np.float32(127)).astype(np.float32)
            assert np.array_equal(d0[i, b], want, equal_nan=True), (i, b)


def test_q8_0_scales_are_fp16_values() -> None:
    x = _x(2, 256, seed=3)
    _, da, _ = kernels.quantize_activations(x, int(GGMLType.Q8_0))
    np.testing.assert_array_equal(da, da.astype(np.float16).astype(np.float32))


def test_geglu_matches_twin() -> None:
    rng = np.random.default_rng(5)
    gate = (rng.standard_normal((3, 4096)) * 4).astype(np.float32)
    gate[0, :8] = [0.0, -0.0, 1e-6, -3e-5, -60.0, 60.0, -9.999, 1e-30]
    gate[1] *= np.exp2(rng.integers(-30, 6, 4096)).astype(np.float32)  # tiny to huge
    up = rng.standard_normal((3, 4096)).astype(np.float32)
    out = np.empty_like(gate)
    kernels.geglu(gate, up, out)
    np.testing.assert_allclose(out, kernels.twin_geglu(gate, up), rtol=1e-5, atol=1e-30)
    kernels.geglu(gate, up, up)  # in place
    np.testing.assert_array_equal(up, out)


@pytest.mark.parametrize("name", ["Q4_1", "Q6_K", "F16", "BF16", "IQ4_NL", "Q2_K", "IQ2_XXS",
                                  "TQ2_0"])
def test_qmatrix_products_and_rows(zoo, name: str) -> None:  # noqa: ANN001
    """Kernel types and fallback types (dequantized tiles into BLAS) through QMatrix."""
    t = zoo.tensors[f"{name}.q"]
    m = QMatrix.from_tensor(t)
    wf = zoo.tensors[f"{name}.f32"].data.astype(np.float64)
    assert m.shape == wf.shape and m.type == t.type
    x = _x(5, m.shape[1], seed=2)
    xr = x
    if name == "F16":  # ggml rounds activations to the weight's type first
        xr = x.astype(np.float16).astype(np.float32)
    elif name == "BF16":
        xr = (x.view(np.uint32) + 0x7FFF + ((x.view(np.uint32) >> 16) & 1)) & 0xFFFF0000
        xr = xr.astype(np.uint32).view(np.float32)
    ref = xr.astype(np.float64) @ wf.T
    tol = 0.03 if name in KERNEL_TYPES else 1e-5
    assert _rel(m.matmul(x), ref) < tol
    assert _rel(m.matvec(x[1]), ref[1]) < tol
    np.testing.assert_array_equal(m.rows([3, 0, 3]), wf[[3, 0, 3]].astype(np.float32))


def test_qmatrix_f32_and_errors() -> None:
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    m = QMatrix(GGMLType.F32, w, (3, 4))
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(m.matmul(x), x @ w.T)
    with pytest.raises(ValueError):
        m.matmul(np.ones((2, 5), np.float32))
    with pytest.raises(IndexError):
        m.rows([3])
    with pytest.raises(ValueError):
        QMatrix(GGMLType.Q8_0, np.zeros((3, 34), np.uint8), (3, 33))


def test_qmatrix_real_model_embedding_and_output(smollm2_path) -> None:  # noqa: ANN001
    """SmolLM2's tied Q8_0 embedding: row lookup exact, output projection near float."""
    with gguf.open(smollm2_path) as f:
        t = f.tensors["token_embd.weight"]
        m = QMatrix.from_tensor(t)
        ids = [0, 1, 49151, 500]
        wf = dequantize(t)
        np.testing.assert_array_equal(m.rows(ids), wf[ids])
        x = _x(1, m.shape[1], seed=9)
        assert _rel(m.matvec(x[0]), (x.astype(np.float64) @ wf.T)[0]) < 0.015
        del wf, m, t


def test_qmatrix_padded_rows_and_paused_halves_change_no_number(smollm2_path,  # noqa: ANN001
                                                                 monkeypatch) -> None:
    """QMatrix.matmul pads 6-7 rows past a multiple of 8 (then runs 1x8 tiles) and, in a
    pass that may stop, a big output product runs in two halves with a stop between them
    when one is asked (``forward_pass.output_product``): each row's products are still bit
    for bit that row's alone."""
    from gguflm.model import forward_pass

    with gguf.open(smollm2_path) as f:
        m = QMatrix.from_tensor(f.tensors["token_embd.weight"])  # 49152 x 576 Q8_0
        monkeypatch.setattr(forward_pass, "SPLIT_BYTES", m.nbytes // 2)
        runs: list[str] = []
        for n in (1, 5, 6, 7, 15):
            x = _x(n, m.shape[1], seed=20 + n)
            alone = np.concatenate([m.matmul(x[i:i + 1]) for i in range(n)])
            got = m.matmul(x)
            assert got.shape == (n, m.shape[0]) and got.flags.c_contiguous
            np.testing.assert_array_equal(got, alone)
            np.testing.assert_array_equal(m.matmul(x, np.empty_like(alone)), alone)
            for flag in (0, 1):
                run = forward_pass.Pass(lambda _, m=m, x=x: forward_pass.output_product(m, x), True)
                if flag:
                    run.stop()
                runs.extend(run)
                np.testing.assert_array_equal(run.logits, alone)
        assert runs == [forward_pass.HALF] * 5  # once per product whose flag was set
        del m


@pytest.mark.parametrize("simd", ["generic", "avx2"])
def test_portable_simd_variants(zoo, simd: str, tmp_path) -> None:  # noqa: ANN001
    """The IR for CPUs without AVX-512 (or without x86) computes the same numbers."""
    if simd == "avx2" and kernels.SIMD == "generic":
        pytest.skip("not an x86 CPU with AVX2")
    code = (
        "import sys, numpy as np, gguflm.gguf as g\n"
        "from gguflm.quant import kernels as K, kerneltypes as KT\n"
        f"assert K.SIMD == {simd!r}\n"
        f"f = g.open({str(zoo.path)!r})\n"
        "x = np.random.default_rng(0).standard_normal((2, 1536)).astype(np.float32)\n"
        f"for name in {KERNEL_TYPES!r}:\n"
        "    t = f.tensors[name + '.q']\n"
        "    out = np.empty((2, t.data.shape[0]), np.float32)\n"
        "    K.qmatmul(int(t.type), t.data, x, out, parallel=False)\n"
        "    tw = KT.twin_qmatmul(int(t.type), t.data, x)\n"
        "    err = np.abs(out - tw).max() / np.abs(tw).max()\n"
        "    assert err < 2e-6, (name, err)\n"
    )
    run_built_for(simd, code, tmp_path)



def test_vnni_same_numbers_as_avx2(zoo, tmp_path) -> None:  # noqa: ANN001
    """On a CPU with VNNI, ``vpdpbusd`` replaces ``pmaddubsw`` + ``pmaddwd`` (and with
    AVX-512 the tiles of the types with integer scales run 512 bits wide, two spans per
    instruction): every product (one row streaming, the 1x4 and 1x8 tiles and their tails)
    is bit-identical to the AVX2 build's, so logits do not depend on which CPU feature ran
    them."""
    if not kernels.VNNI:
        pytest.skip("this CPU has no VNNI (the AVX2 path is the one tested)")
    counts = (1, 3, 4, 8, 13)
    code = (
        "import numpy as np, gguflm.gguf as g\n"
        "from gguflm.quant import kernels as K\n"
        "assert K.SIMD == 'avx2' and not K.VNNI\n"
        f"f = g.open({str(zoo.path)!r})\n"
        "res = {}\n"
        f"for name in {KERNEL_TYPES!r}:\n"
        "    t = f.tensors[name + '.q']\n"
        f"    for n in {counts!r}:\n"
        "        x = np.random.default_rng(n).standard_normal((n, 1536)).astype(np.float32)\n"
        "        out = np.empty((n, t.data.shape[0]), np.float32)\n"
        "        K.qmatmul(int(t.type), t.data, x, out, parallel=False)\n"
        "        res[f'{name}_{n}'] = out\n"
        f"np.savez({str(tmp_path / 'avx2.npz')!r}, **res)\n"
    )
    run_built_for("avx2", code, tmp_path)
    ref = np.load(tmp_path / "avx2.npz")
    for name in KERNEL_TYPES:
        t = zoo.tensors[name + ".q"]
        for n in counts:
            x = np.random.default_rng(n).standard_normal((n, 1536)).astype(np.float32)
            out = np.empty((n, t.data.shape[0]), np.float32)
            kernels.qmatmul(int(t.type), t.data, x, out, parallel=False)
            assert np.array_equal(out, ref[f"{name}_{n}"]), (name, n)

def test_bench_command_json(reference, capsys) -> None:  # noqa: ANN001
    """``gguflm bench --json`` on a small real file: llama-bench's figures, as one object."""
    import json

    from gguflm.cli import main
    from gguflm.quant.matrix import set_threads

    model = reference / "tiny-llama-q4_0" / "tiny-llama-q4_0.gguf"
    try:
        assert main(["bench", str(model), "-p", "8", "-n", "4", "-r", "2", "-t", "1",
                     "--json"]) == 0
    finally:
        set_threads(None)  # back to the default for the tests that follow
    res = json.loads(capsys.readouterr().out)
    assert res["threads"] == 1 and res["n_prompt"] == 8 and res["n_gen"] == 4
    assert res["pp_tps"] > 0 and res["tg_tps"] > 0 and res["peak_rss_mb"] > 0
    assert res["pp"]["median"] == res["pp_tps"] and res["tg"]["std"] >= 0


def test_bench_command_errors(reference, capsys) -> None:  # noqa: ANN001
    from gguflm.cli import main

    model = reference / "tiny-llama-q4_0" / "tiny-llama-q4_0.gguf"
    with pytest.raises(SystemExit) as e:  # a usage error: the command's usage, exit 2
        main(["bench", str(model), "-p", "0", "-n", "0"])
    assert e.value.code == 2 and "nothing to measure" in capsys.readouterr().err


# -- one declaration per kernel type (kerneltypes.KERNEL_TYPES) ------------------------------


@pytest.mark.parametrize("name", KERNEL_TYPES)
def test_declaration_decodes_as_the_dequantizer(zoo, name: str) -> None:  # noqa: ANN001
    """What a type's declaration says its values are is what ggml's to_float makes of the
    same bytes (the zoo's ``.f32``): the layout, planes, bias, scales and offsets agree."""
    t = zoo.tensors[f"{name}.q"]
    ref = zoo.tensors[f"{name}.f32"].data.astype(np.float64)
    k = kerneltypes.kernel_type(t.type)
    got = kerneltypes.twin_dequantize(t.type, t.data)
    assert np.abs(got - ref).max() <= 1e-6 * np.abs(ref).max()
    blocks = np.ascontiguousarray(t.data).reshape(-1, k.type_size)
    out = np.empty((len(blocks), k.block_size), np.float32)
    k.dequantizer(blocks, out)
    np.testing.assert_array_equal(out.reshape(ref.shape), ref)


def test_dispatch_and_kernels_read_one_table() -> None:
    from gguflm.quant import matrix

    for t in GGMLType:
        declared = t in kerneltypes.KERNEL_TYPES
        assert (matrix._fast_path(t) is matrix._quantized_kernel) == declared, t
    assert set(kernels._Q8_0_KINDS + kernels._Q8_K_KINDS) == {
        int(t) for t in kerneltypes.KERNEL_TYPES}


def test_unknown_type_fails_loudly() -> None:
    """A type without a block loop is refused by name, by the Python wrapper and inside the
    jitted code, and the block loop itself gives NaN rather than a silent zero."""
    w = np.zeros((3, 66), np.uint8)  # IQ2_XXS: dequantize-then-multiply only
    x = np.ones((1, 256), np.float32)
    out = np.zeros((1, 3), np.float32)
    with pytest.raises(ValueError, match="no integer kernel for ggml type IQ2_XXS"):
        kernels.qmatmul(int(GGMLType.IQ2_XXS), w, x, out)
    with pytest.raises(ValueError, match="no integer kernel"):
        kernels.qmatmul_serial(np.full(3, int(GGMLType.IQ2_XXS)), (w, w, w), x,
                               kernels.F16_TABLE, (out, out, out), 1)
    with pytest.raises(ValueError, match="no integer kernel for ggml type 99"):
        kerneltypes.kernel_type(99)
    qa, da, aux = kernels.quantize_activations(x, int(GGMLType.Q4_K))
    kernels.qmatmul_rows(int(GGMLType.IQ2_XXS), w, qa, da, aux, np.zeros((0, 8), np.int32),
                         qa[:0], kernels.F16_TABLE, out, 0, 3)
    assert np.isnan(out).all()
    with pytest.raises(ValueError, match="do not fit"):  # a row length of the wrong type
        kernels.qmatmul(int(GGMLType.Q4_K), np.zeros((3, 18), np.uint8), x, out)


def test_stale_kernel_cache_is_rebuilt(tmp_path) -> None:  # noqa: ANN001
    """numba's disk cache follows kernels.py only; a build from other declarations (here:
    the table without Q8_0) is detected by its key and rebuilt, not run."""
    probe = ("import numpy as np\n"
             "from gguflm.quant import kernels as K\n"
             "K.check_build()\n"
             "x = np.ones((1, 32), np.float32)\n"
             "try:\n"
             "    K.quantize_activations(x, 8)\n"
             "    print('Q8_0 quantized')\n"
             "except ValueError as e:\n"
             "    print('refused:', e)\n")
    shrink = ("from gguflm.gguf.types import GGMLType\n"
              "from gguflm.quant import kerneltypes\n"
              "del kerneltypes.KERNEL_TYPES[GGMLType.Q8_0]\n")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))

    def run(code: str) -> str:
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout

    assert run(probe) == "Q8_0 quantized\n"  # builds and caches with the full table
    assert run(shrink + probe).startswith("refused: no integer kernel")
    assert run(probe) == "Q8_0 quantized\n"


@pytest.mark.parametrize("names", [("Q4_K", "Q6_K", "Q5_0"), ("Q4_1", "Q8_0"), ("Q5_K",)])
def test_fused_products_equal_separate_ones(zoo, names: tuple[str, ...]) -> None:  # noqa: ANN001
    """``matmul_many`` (one kernel call: x quantized once per activation type, the
    products' rows in one parallel region) gives each product bit for bit as its own
    ``matmul``, at every batch size's tile path, serial or parallel."""
    from gguflm.quant import matrix

    mats = []
    for i, name in enumerate(names):
        t = zoo.tensors[f"{name}.q"]
        rows = 19 + 5 * i  # odd counts: partial row chunks (the zoo has 32 rows)
        mats.append(QMatrix(t.type, t.data[:rows], (rows, t.shape[0]), name=name))
    k = mats[0].shape[1]
    assert all(m.shape[1] == k for m in mats)
    saved = matrix.PARALLEL_MIN_MACS
    try:
        for threshold in (saved, 0):  # as chosen, then everything parallel
            matrix.PARALLEL_MIN_MACS = threshold
            for n in (1, 2, 3, 4, 5, 8, 13):
                x = _x(n, k, seed=n)
                fused = matrix.matmul_many(mats, x)
                for m, got in zip(mats, fused, strict=True):
                    np.testing.assert_array_equal(got, m.matmul(x))
                    want = np.empty((n, m.shape[0]), np.float32)
                    kernels.qmatmul(m._kind, m.raw, x, want, parallel=False)
                    np.testing.assert_array_equal(got, want)
    finally:
        matrix.PARALLEL_MIN_MACS = saved


@pytest.mark.parametrize("name", KERNEL_TYPES)
def test_batch_tiles_equal_rows_alone(zoo, name: str) -> None:  # noqa: ANN001
    """Batch invariance at the kernel: each row of a batch (the 1x8 tile with its
    side-by-side scales, the 1x4 and 1x1 tiles) is bit for bit that row's product alone
    (the 4x1 decoding stream)."""
    t = zoo.tensors[f"{name}.q"]
    w = t.data[:27]
    for n in (4, 5, 6, 7, 8, 13, 16):
        x = _x(n, t.shape[0], seed=10 + n)
        batch = np.empty((n, 27), np.float32)
        kernels.qmatmul(int(t.type), w, x, batch, parallel=False)
        for i in range(n):
            alone = np.empty((1, 27), np.float32)
            kernels.qmatmul(int(t.type), w, x[i:i + 1], alone, parallel=False)
            np.testing.assert_array_equal(batch[i], alone[0])


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q3_K", "Q2_K", "Q8_0", "Q4_0", "Q5_0",
                                  "IQ4_NL", "IQ4_XS"])
def test_gemm_runs_and_equals_rows_alone(zoo, name: str) -> None:  # noqa: ANN001
    """The interleaved GEMM (``int_gemm``, AVX512-VNNI) runs these types' groups of 8 weight
    rows itself (it returns where the 1-7 rows it leaves begin), and each activation row's
    products are bit for bit that row's alone (the decoding stream), with 4-row passes and
    single-row ones."""
    from gguflm.quant import act_quant, int_gemm
    from gguflm.quant.vector_ir import F16_TABLE

    if not int_gemm.USABLE:
        pytest.skip("no AVX512-VNNI: the per-row tiles run these products")
    t = zoo.tensors[f"{name}.q"]
    kind, w = int(t.type), t.data[:27]
    assert kind in int_gemm.GEMM_KINDS
    for n in (8, 9, 13):
        x = _x(n, t.shape[0], seed=40 + n)
        a32, ak = act_quant.activation_sets(np.array([kind]), 1, x)
        a = ak if kind in act_quant.Q8_K_KINDS else a32
        out = np.full((n, 27), np.nan, np.float32)
        assert int_gemm.gemm_rows(kind, w, 0, 27, a.qa, a.da, a.aux, a.cor, a.qu, F16_TABLE,
                                  out) == 24
        assert np.isnan(out[:, 24:]).all()  # the rows past the last group: the caller's
        for i in range(n):
            alone = np.empty((1, 27), np.float32)
            kernels.qmatmul(kind, w, x[i:i + 1], alone, parallel=False)
            np.testing.assert_array_equal(out[i, :24], alone[0, :24])
