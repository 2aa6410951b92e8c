"""GGUFWriter: byte-identical round trips of every real file, exact value types in every
version and byte order, tensors of every kind, alignment, errors, atomic output."""

from __future__ import annotations

import filecmp
import os
import warnings
from pathlib import Path

import numpy as np
import pytest

import gguflm.gguf as gguf
from gguflm.gguf import (
    ArrayType,
    GGMLType,
    GGUFWarning,
    GGUFWriter,
    ValueType,
    WriteError,
    infer_type,
)

REFERENCE_FILES = [
    "quant-zoo/quant-zoo.gguf",
    "vocab/ggml-vocab-gpt-2.gguf", "vocab/ggml-vocab-llama-bpe.gguf",
    "vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-qwen2.gguf",
    "tiny-llama-f16/tiny-llama-f16.gguf", "tiny-llama-q4_0/tiny-llama-q4_0.gguf",
    "arch/qwen2/tiny-qwen2-f16.gguf", "arch/qwen3/tiny-qwen3-f16.gguf",
    "arch/phi3/tiny-phi3-f16.gguf", "arch/gemma2/tiny-gemma2-f16.gguf",
]


def _round_trip(src: Path, out: Path) -> None:
    with gguf.open(src) as f:
        GGUFWriter.from_file(f, out).write()
    assert out.stat().st_size == src.stat().st_size
    assert filecmp.cmp(src, out, shallow=False), f"{src.name}: round trip differs"


@pytest.mark.parametrize("rel", REFERENCE_FILES)
def test_reference_files_round_trip(reference: Path, tmp_path: Path, rel: str) -> None:
    _round_trip(reference / rel, tmp_path / "out.gguf")


def test_smollm2_round_trips(smollm2_path: Path, tmp_path: Path) -> None:
    _round_trip(smollm2_path, tmp_path / "out.gguf")


def test_gemma3_round_trips(gemma3_path: Path, tmp_path: Path) -> None:
    _round_trip(gemma3_path, tmp_path / "out.gguf")


# -- values ------------------------------------------------------------------------------------

def _all_values() -> list[tuple[str, object, object]]:
    """(key, value, type) for every value type, every array element type, nested arrays."""
    scalars = {
        ValueType.UINT8: 255, ValueType.INT8: -128, ValueType.UINT16: 65535,
        ValueType.INT16: -32768, ValueType.UINT32: 2**32 - 1, ValueType.INT32: -(2**31),
        ValueType.FLOAT32: 0.1, ValueType.BOOL: True, ValueType.STRING: "ü\U0001F600 x",
        ValueType.UINT64: 2**64 - 1, ValueType.INT64: -(2**63), ValueType.FLOAT64: 0.1,
    }
    out: list[tuple[str, object, object]] = []
    for t, v in scalars.items():
        out.append((f"s.{t.name.lower()}", v, t))
        arr = [v, v, v] if t != ValueType.BOOL else [True, False, True]
        out.append((f"a.{t.name.lower()}", arr, ArrayType(t)))
        out.append((f"e.{t.name.lower()}", [], ArrayType(t)))
    out.append(("s.bad_utf8", "a\udcffb", ValueType.STRING))  # the byte 0xff, escaped
    out.append(("nested", [[1, 2], ["x", "y"], [], [[3]]],
                ArrayType(ArrayType(ValueType.INT64))))
    return out


def _check_values(f: gguf.GGUFFile) -> None:
    for key, v, t in _all_values():
        got, gt = f[key], f.types[key]
        if key == "nested":
            assert gt == ArrayType(ArrayType(ValueType.INT64))
            assert got[0].tolist() == [1, 2] and got[0].dtype.str[1:] == "i8"
            assert list(got[1]) == ["x", "y"] and got[2].tolist() == []
            assert got[3][0].tolist() == [3]
            continue
        assert gt == t, key
        if t == ValueType.FLOAT32:
            assert got == float(np.float32(v))
        elif isinstance(t, ArrayType) and t.elem == ValueType.FLOAT32:
            assert np.array_equal(got, np.asarray(v, dtype=np.float32))
        elif isinstance(t, ArrayType):
            assert list(got) == list(v), key  # type: ignore[call-overload]
        else:
            assert got == v, key


@pytest.mark.parametrize("version,bo", [(3, "<"), (3, ">"), (2, "<"), (1, "<"), (1, ">")])
def test_every_value_type_round_trips(tmp_path: Path, version: int, bo: str) -> None:
    w = GGUFWriter(tmp_path / "v.gguf", version=version, byte_order=bo)
    for key, v, t in _all_values():
        w.add(key, v, t)
    w.add_tensor("x", np.arange(6, dtype=np.float32).reshape(2, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GGUFWarning)
        w.write()
        with gguf.open(tmp_path / "v.gguf") as f:
            assert f.version == version and f.byte_order == bo
            _check_values(f)
            assert np.array_equal(f.tensors["x"].data, np.arange(6).reshape(2, 3))
            GGUFWriter.from_file(f, tmp_path / "again.gguf").write()
    assert filecmp.cmp(tmp_path / "v.gguf", tmp_path / "again.gguf", shallow=False)


def test_converting_encodings_and_back(reference: Path, tmp_path: Path) -> None:
    """LE v3 -> BE v3 -> LE v1 -> LE v3: metadata re-encoded each way (string arrays too),
    tensors copied raw; the last file is the first, byte for byte."""
    src = reference / "tiny-llama-q4_0" / "tiny-llama-q4_0.gguf"
    paths = [src]
    for i, (version, bo) in enumerate([(3, ">"), (1, "<"), (3, "<")]):
        out = tmp_path / f"step{i}.gguf"
        with gguf.open(paths[-1]) as f:
            w = GGUFWriter(out, version=version, byte_order=bo)
            for k, v in f.metadata.items():
                w.add(k, v, f.types[k])
            for t in f.tensors.values():
                w.add_tensor(t.name, t)
            w.write()
        paths.append(out)
    with gguf.open(paths[1]) as be, gguf.open(src) as le:
        assert be.byte_order == ">"
        assert list(be["tokenizer.ggml.tokens"]) == list(le["tokenizer.ggml.tokens"])
        assert np.array_equal(be["tokenizer.ggml.scores"], le["tokenizer.ggml.scores"])
    assert filecmp.cmp(src, paths[-1], shallow=False)


def test_infer_type() -> None:
    assert infer_type(True) == ValueType.BOOL
    assert infer_type(7) == ValueType.INT32
    assert infer_type(2**40) == ValueType.INT64
    assert infer_type(2**63) == ValueType.UINT64
    assert infer_type(0.5) == ValueType.FLOAT32
    assert infer_type("x") == ValueType.STRING
    assert infer_type(["a", "b"]) == ArrayType(ValueType.STRING)
    assert infer_type([1, 2**33]) == ArrayType(ValueType.INT64)
    assert infer_type([1, 2.5]) == ArrayType(ValueType.FLOAT32)
    assert infer_type(np.zeros(3, np.uint16)) == ArrayType(ValueType.UINT16)
    assert infer_type([[1], [2]]) == ArrayType(ArrayType(ValueType.INT32))
    assert infer_type(np.float64(1)) == ValueType.FLOAT64
    for bad in ([], [1, "a"], {1: 2}, 2**64):
        with pytest.raises(WriteError):
            infer_type(bad)


@pytest.mark.parametrize("value,vtype,text", [
    (256, ValueType.UINT8, "does not fit"), (-1, ValueType.UINT64, "does not fit"),
    (2**63, ValueType.INT64, "does not fit"), ("1", ValueType.INT32, "expected"),
    (1.5, ValueType.UINT32, "expected"), (2, ValueType.BOOL, "bool"),
    (True, ValueType.INT32, "expected"), (3, ValueType.STRING, "string"),
    ([1, 300], ArrayType(ValueType.UINT8), "[0, 255]"), ([1.5], ArrayType(ValueType.INT32),
                                                         "integers"),
    ("abc", ArrayType(ValueType.STRING), "expected"), ([1], ArrayType(ValueType.STRING),
                                                       "holds"),
    ([[1]], ArrayType(ValueType.INT32), "one-dimensional"), (1, ValueType.ARRAY, "not a"),
])
def test_bad_values(tmp_path: Path, value: object, vtype: object, text: str) -> None:
    w = GGUFWriter(tmp_path / "x.gguf")
    with pytest.raises(WriteError, match=None) as ei:
        w.add("k", value, vtype)  # type: ignore[arg-type]
    assert text in str(ei.value) and "'k'" in str(ei.value)


def test_key_rules(tmp_path: Path) -> None:
    w = GGUFWriter(tmp_path / "x.gguf")
    w.add("a", 1)
    with pytest.raises(WriteError, match="duplicate"):
        w.add("a", 2)
    w.set("a", 3)  # replace keeps the place
    w.add("b", 4)
    w.set("a", "x")
    assert w.keys == ["a", "b"]
    with pytest.raises(WriteError, match="non-empty"):
        w.add("", 1)
    for bad in [(64, ValueType.UINT64), (48, ValueType.UINT32), (0, ValueType.UINT32)]:
        with pytest.raises(WriteError, match="power of two"):
            w.add("general.alignment", *bad)
    with pytest.raises(WriteError, match="no such key"):
        w.delete("zzz")
    w.delete("b")
    assert w.keys == ["a"]


# -- tensors -----------------------------------------------------------------------------------

def test_plain_tensors(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "f16": rng.standard_normal((7,)).astype(np.float16),
        "f64": rng.standard_normal((2, 2, 2)).astype(np.float64),
        "i8": rng.integers(-128, 127, (4, 4), dtype=np.int8),
        "i16": rng.integers(-999, 999, (9,), dtype=np.int16),
        "i32": rng.integers(-(2**31), 2**31 - 1, (2, 3), dtype=np.int32),
        "i64": rng.integers(-(2**62), 2**62, (1, 1, 1, 3), dtype=np.int64),
        "scalar": np.float32(3.5).reshape(()),
        "empty": np.zeros((0, 4), np.float32),
        "strided": np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2],
    }
    for bo in "<>":
        path = tmp_path / f"t{bo == '>'}.gguf"
        w = GGUFWriter(path, byte_order=bo)
        for name, a in arrays.items():
            w.add_tensor(name, a)
        w.write()
        with gguf.open(path) as f:
            for name, a in arrays.items():
                t = f.tensors[name]
                assert t.shape == tuple(reversed(a.shape)), name
                assert t.file_offset % 32 == 0
                assert np.array_equal(t.data, a), name
            assert f.tensors["i64"].type == GGMLType.I64
            assert f.tensors["f16"].type == GGMLType.F16


def test_bf16_from_floats_rounds_to_nearest_even(tmp_path: Path) -> None:
    bits = np.array([0x3F800000, 0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7FC00001, 0xFF800000],
                    dtype=np.uint32)
    x = bits.view(np.float32)
    w = GGUFWriter(tmp_path / "b.gguf")
    w.add_tensor("b", x, type=GGMLType.BF16)
    w.add_tensor("raw", np.array([1, 2, 3], np.uint16), type=GGMLType.BF16)
    w.write()
    with gguf.open(tmp_path / "b.gguf") as f:
        got = f.tensors["b"].data.tolist()
        # 1.0; a tie rounds down to even; a tie rounds up to even; above half rounds up;
        # a NaN stays a (quiet) NaN; -inf stays -inf
        assert got[:4] == [0x3F80, 0x3F80, 0x3F82, 0x3F81]
        assert (got[4] & 0x7F80) == 0x7F80 and got[4] & 0x7F and got[5] == 0xFF80
        assert f.tensors["raw"].data.tolist() == [1, 2, 3]


def test_quantized_tensors_from_raw_bytes(reference: Path, tmp_path: Path) -> None:
    with gguf.open(reference / "quant-zoo" / "quant-zoo.gguf") as z:
        w = GGUFWriter(tmp_path / "q.gguf")
        w.add("general.alignment", 64, ValueType.UINT32)
        kinds = {}
        for t in z.tensors.values():
            if not t.type.quantized:
                continue
            how = len(kinds) % 3
            if how == 0:
                w.add_tensor(t.name, t.data, type=t.type)  # (rows, row_bytes) uint8
            elif how == 1:
                w.add_tensor(t.name, bytes(t.data), type=t.type, shape=t.shape)
            else:
                w.add_tensor(t.name, t)
            kinds[t.name] = t
        w.write()
        with gguf.open(tmp_path / "q.gguf") as f:
            assert f.alignment == 64
            for name, t in kinds.items():
                g = f.tensors[name]
                assert g.type == t.type and g.shape == t.shape and g.file_offset % 64 == 0
                assert np.array_equal(g.data, t.data)
    assert len(kinds) >= 20


@pytest.mark.parametrize("kwargs,text", [
    (dict(data=np.zeros(4, np.uint8)), "pass type"),
    (dict(data=np.zeros(4, np.complex64)), "no ggml type"),
    (dict(data=np.zeros(32, np.float32), type=GGMLType.Q4_0), "block type"),
    (dict(data=b"\0" * 18, type=GGMLType.Q4_0), "shape"),
    (dict(data=b"\0" * 17, type=GGMLType.Q4_0, shape=[32]), "needs 18 bytes, got 17"),
    (dict(data=b"\0" * 18, type=GGMLType.Q4_0, shape=[16, 2]), "block size 32"),
    (dict(data=b"\0" * 4, type=GGMLType.F32, shape=[1, 1, 1, 1, 1]), "at most 4"),
    (dict(data=np.zeros((2, 17), np.uint8), type=GGMLType.Q4_0), "whole number"),
    (dict(data=np.zeros(2, np.int64) + 300, type=GGMLType.I8), "do not fit"),
    (dict(data=b"\0" * 4, type=GGMLType.Q4_2_REMOVED, shape=[1]), "removed"),
    (dict(data=np.zeros(4, np.float32), shape=[5]), "does not match"),
])
def test_bad_tensors(tmp_path: Path, kwargs: dict, text: str) -> None:
    w = GGUFWriter(tmp_path / "x.gguf")
    with pytest.raises(WriteError) as ei:
        w.add_tensor("t", **kwargs)
    assert text in str(ei.value) and "'t'" in str(ei.value)


def test_tensor_name_rules(tmp_path: Path) -> None:
    w = GGUFWriter(tmp_path / "x.gguf")
    w.add_tensor("t" * 63, np.zeros(1, np.float32))
    with pytest.raises(WriteError, match="at most 63"):
        w.add_tensor("t" * 64, np.zeros(1, np.float32))
    with pytest.raises(WriteError, match="duplicate"):
        w.add_tensor("t" * 63, np.zeros(1, np.float32))


def test_closed_source_tensor(reference: Path, tmp_path: Path) -> None:
    f = gguf.open(reference / "quant-zoo" / "quant-zoo.gguf")
    t = next(iter(f.tensors.values()))
    f.close()
    with pytest.raises(WriteError, match="closed"):
        GGUFWriter(tmp_path / "x.gguf").add_tensor("t", t)


# -- output ------------------------------------------------------------------------------------

def test_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "out.gguf"
    target.write_bytes(b"previous")
    w = GGUFWriter(target)
    w.add_tensor("t", np.zeros(1 << 16, np.float32))

    def fail(done: int, total: int) -> None:
        raise OSError("disk full (simulated)")

    with pytest.raises(OSError, match="simulated"):
        w.write(progress=fail)
    assert target.read_bytes() == b"previous"
    assert sorted(os.listdir(tmp_path)) == ["out.gguf"]


def test_empty_file_and_header_padding(tmp_path: Path) -> None:
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    w = GGUFWriter(a)
    w.add("k", "v")
    w.write()
    GGUFWriter(b, pad_header=False).write()
    assert a.stat().st_size % 32 == 0 and b.stat().st_size == 24
    with gguf.open(a) as f, gguf.open(b) as g:
        assert f["k"] == "v" and len(g) == 0 and not g.tensors
        GGUFWriter.from_file(f, tmp_path / "a2.gguf").write()
        GGUFWriter.from_file(g, tmp_path / "b2.gguf").write()
    assert filecmp.cmp(a, tmp_path / "a2.gguf", shallow=False)
    assert filecmp.cmp(b, tmp_path / "b2.gguf", shallow=False)
