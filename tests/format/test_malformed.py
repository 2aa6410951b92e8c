"""Malformed files: every validation rule of shared/docs/gguf-format.md (ggml's reader plus
the loader's bounds check), truncation at every byte, old magics, odd-but-valid files.

Each case builds the bad field directly (tests/ggufbytes.py), opens the file and checks
the GGUFError subclass and that the message names where (offset) and what (key/tensor).
"""

from __future__ import annotations

import struct
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import gguflm.gguf as gguf
from ggufbytes import Enc, File
from gguflm.gguf import (
    GGMLType,
    GGUFError,
    GGUFWarning,
    MagicError,
    MetadataError,
    TensorDataError,
    TensorInfoError,
    TruncatedError,
    ValueType,
    VersionError,
)

F32 = int(GGMLType.F32)
E = Enc()


def f32(n: int) -> bytes:
    return np.arange(n, dtype="<f4").tobytes()


def good(enc: Enc = E, **over) -> File:
    """A small valid file: three keys, two F32 tensors (16 bytes, padded to 32; 64 bytes)."""
    kw = dict(
        enc=enc,
        kvs=[enc.kv("general.architecture", 8, enc.string("llama")),
             enc.kv("general.alignment", 4, enc.u32(32)),
             enc.kv_arr("tokenizer.ggml.tokens", 8, 3,
                        enc.string("a") + enc.string("bc") + enc.string(""))],
        tensors=[enc.tensor_info("a", [4], F32, 0), enc.tensor_info("b", [8, 2], F32, 32)],
        data=f32(4) + b"\0" * 16 + f32(16),
    )
    kw.update(over)
    return File(**kw)


@pytest.fixture
def openb(tmp_path: Path) -> Callable[[bytes], gguf.GGUFFile]:
    counter = iter(range(10**9))

    def _open(data: bytes) -> gguf.GGUFFile:
        p = tmp_path / f"case{next(counter)}.gguf"
        p.write_bytes(data)
        return gguf.open(p)

    return _open


def expect(openb, data: bytes, cls: type[GGUFError], *, key: str | None = None,
           tensor: str | None = None, text: str = "") -> GGUFError:
    with pytest.raises(GGUFError) as ei:
        openb(data)
    e = ei.value
    assert type(e) is cls, f"{type(e).__name__}: {e}"
    msg = str(e)
    assert e.offset is not None or e.key is not None or e.tensor is not None, msg
    if e.offset is not None:
        assert f"offset {e.offset}" in msg
    if key is not None:
        assert e.key == key and repr(key) in msg, msg
    if tensor is not None:
        assert e.tensor == tensor and repr(tensor) in msg, msg
    assert text.lower() in msg.lower(), msg
    assert ".gguf" in msg  # the path is named too
    return e


def test_the_base_file_is_valid(openb) -> None:
    with openb(good().bytes()) as f:
        assert list(f.tensors) == ["a", "b"]
        assert np.array_equal(f.tensors["b"].data, np.arange(16, dtype="f4").reshape(2, 8))
        assert list(f.metadata["tokenizer.ggml.tokens"]) == ["a", "bc", ""]


# -- magic and version -------------------------------------------------------------------------

def test_empty_file(openb) -> None:
    expect(openb, b"", TruncatedError, text="empty file")


@pytest.mark.parametrize("n", [1, 3])
def test_shorter_than_the_magic(openb, n: int) -> None:
    expect(openb, b"GGUF"[:n], TruncatedError, text="magic")


def test_bad_magic(openb) -> None:
    expect(openb, b"GGUG" + good().bytes()[4:], MagicError, text="bad magic")
    expect(openb, b"\x7fELF" + b"\0" * 60, MagicError, text="expected b'GGUF'")


@pytest.mark.parametrize("magic,name", [
    (b"lmgg", "ggml"), (b"fmgg", "ggmf"), (b"tjgg", "ggjt"), (b"algg", "ggla"),
    (b"ggml", "ggml"), (b"ggjt", "ggjt"),
])
def test_legacy_magics_are_named(openb, magic: bytes, name: str) -> None:
    e = expect(openb, magic + b"\x03\0\0\0" + b"\0" * 64, MagicError, text=name)
    assert "pre-GGUF" in str(e)


@pytest.mark.parametrize("version", [0, 4, 99, 0x7FFFFFFF])
def test_unsupported_version(openb, version: int) -> None:
    expect(openb, good(version=version).bytes(), VersionError, text=f"version {version}")


def test_big_endian_unsupported_version(openb) -> None:
    be = Enc(3, ">")
    expect(openb, good(be, version=5).bytes(), VersionError, text="version 5")


def test_truncated_version(openb) -> None:
    expect(openb, b"GGUF\x03\0", TruncatedError, text="wanted 4 bytes, 2 left")


# -- counts ------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [10**4, 2**63, 2**64 - 1])
def test_kv_count_larger_than_the_file(openb, n: int) -> None:
    expect(openb, good(n_kv=n).bytes(), TruncatedError)


@pytest.mark.parametrize("n", [10**6, 2**63, 2**64 - 1])
def test_tensor_count_larger_than_the_file(openb, n: int) -> None:
    expect(openb, good(n_tensors=n).bytes(), TruncatedError, text="tensor count")


# -- keys and values ---------------------------------------------------------------------------

def test_empty_key(openb) -> None:
    expect(openb, good(kvs=[E.kv("", 4, E.u32(1))]).bytes(), MetadataError, text="empty key")


def test_duplicate_key(openb) -> None:
    kvs = [E.kv("x.y", 4, E.u32(1)), E.kv("x.y", 4, E.u32(2))]
    expect(openb, good(kvs=kvs).bytes(), MetadataError, key="x.y", text="duplicate")


def test_key_not_utf8(openb) -> None:
    expect(openb, good(kvs=[E.kv(b"k\xff", 4, E.u32(1))]).bytes(), MetadataError,
           text="UTF-8")


@pytest.mark.parametrize("vtype", [13, 100, 2**31, 2**32 - 1])
def test_unknown_value_type(openb, vtype: int) -> None:
    expect(openb, good(kvs=[E.kv("k", vtype, E.u32(1))]).bytes(), MetadataError, key="k",
           text=f"unknown value type {vtype}")


@pytest.mark.parametrize("etype", [13, 2**32 - 1])
def test_unknown_array_element_type(openb, etype: int) -> None:
    expect(openb, good(kvs=[E.kv_arr("k", etype, 1, E.u32(1))]).bytes(), MetadataError,
           key="k", text="array element type")


def test_key_length_over_1gib(openb) -> None:
    data = good().bytes()[:24] + E.u64((1 << 30) + 1) + b"k" * 64
    expect(openb, data, MetadataError, text="1 GiB")


def test_key_length_past_eof(openb) -> None:
    data = good().bytes()[:24] + E.u64(1000) + b"k" * 64
    expect(openb, data, TruncatedError, text="wanted 1000 bytes")


def test_string_value_over_1gib(openb) -> None:
    kvs = [E.kv("s", 8, E.u64((1 << 30) + 1) + b"x" * 16)]
    expect(openb, good(kvs=kvs).bytes(), MetadataError, key="s", text="1 GiB")


def test_string_value_past_eof(openb) -> None:
    kvs = [E.kv("s", 8, E.u64(10**9) + b"x" * 16)]
    expect(openb, good(kvs=kvs, tensors=[], data=b"").bytes(), TruncatedError, key="s",
           text=f"wanted {10**9} bytes")


@pytest.mark.parametrize("etype,size", [(0, 1), (4, 4), (10, 8), (12, 8), (7, 1)])
def test_array_bytes_exceed_the_file(openb, etype: int, size: int) -> None:
    kvs = [E.kv_arr("arr", etype, 10**6, b"\0" * 64)]
    expect(openb, good(kvs=kvs).bytes(), TruncatedError, key="arr",
           text=f"needs {10**6 * size} bytes")


def test_array_count_over_ggml_limit(openb) -> None:
    kvs = [E.kv_arr("arr", 0, (1 << 30) + 1, b"\0" * 64)]
    expect(openb, good(kvs=kvs).bytes(), MetadataError, key="arr", text="limit")


def test_string_array_count_exceeds_the_file(openb) -> None:
    kvs = [E.kv_arr("toks", 8, 10**6, E.string("a"))]
    expect(openb, good(kvs=kvs).bytes(), TruncatedError, key="toks")


def test_string_array_element_past_eof(openb) -> None:
    kvs = [E.kv_arr("toks", 8, 3, E.string("a") + E.string("b") + E.u64(5000) + b"c")]
    e = expect(openb, good(kvs=kvs, tensors=[], data=b"").bytes(), TruncatedError, key="toks",
               text="string 2 of 3: wanted 5000 bytes")
    assert e.offset == 24 + 8 + 4 + 4 + 4 + 8 + 9 + 9  # the third string's length field


def test_string_array_element_over_1gib(openb) -> None:
    kvs = [E.kv_arr("toks", 8, 2, E.string("a") + E.u64(2**40) + b"c" * 32)]
    expect(openb, good(kvs=kvs).bytes(), MetadataError, key="toks",
           text="string 1 of 2: length")


@pytest.mark.parametrize("length", [2**63 - 9, 2**63, 2**64 - 1])
def test_string_array_element_length_past_int64(openb, length: int) -> None:
    """Found by the fuzzer: a huge length made the fast walk's next position overflow."""
    kvs = [E.kv_arr("toks", 8, 3, E.string("a") + E.u64(length) + E.string("b") * 4)]
    expect(openb, good(kvs=kvs).bytes(), MetadataError, key="toks",
           text="string 1 of 3: length")


def test_string_array_element_length_field_cut(openb) -> None:
    kvs = [E.kv_arr("toks", 8, 2, E.string("a" * 20) + b"\1\0\0")]
    data = good(kvs=kvs, tensors=[], data=b"").bytes()
    expect(openb, data, TruncatedError, key="toks", text="string 1 of 2: wanted 8 bytes")


def test_nested_arrays_too_deep(openb) -> None:
    body = E.arr(0, 0, b"")
    for _ in range(70):
        body = E.arr(9, 1, body)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GGUFWarning)
        expect(openb, good(kvs=[E.kv("deep", 9, body)]).bytes(), MetadataError, key="deep",
               text="nested")


# -- alignment ---------------------------------------------------------------------------------

@pytest.mark.parametrize("vtype,payload", [
    (10, E.u64(32)), (5, struct.pack("<i", 32)), (8, E.string("32")), (2, b"\x20\0"),
])
def test_alignment_must_be_u32(openb, vtype: int, payload: bytes) -> None:
    expect(openb, good(kvs=[E.kv("general.alignment", vtype, payload)]).bytes(),
           MetadataError, key="general.alignment", text="must be uint32")


@pytest.mark.parametrize("align", [0, 3, 48, 2**32 - 1])
def test_alignment_must_be_a_power_of_two(openb, align: int) -> None:
    expect(openb, good(kvs=[E.kv("general.alignment", 4, E.u32(align))]).bytes(),
           MetadataError, key="general.alignment", text="power of two")


def test_other_alignment_is_honoured(openb) -> None:
    kvs = [E.kv("general.alignment", 4, E.u32(64))]
    tensors = [E.tensor_info("a", [4], F32, 0), E.tensor_info("b", [8, 2], F32, 64)]
    f = File(E, kvs, tensors, f32(4) + b"\0" * 48 + f32(16), alignment=64)
    with openb(f.bytes()) as g:
        assert g.alignment == 64 and g.data_offset % 64 == 0
        assert g.tensors["b"].data[1, 0] == 8.0


# -- tensor infos ------------------------------------------------------------------------------

def test_tensor_name_too_long(openb) -> None:
    name = "t" * 64
    expect(openb, good(tensors=[E.tensor_info(name, [4], F32, 0)], data=f32(4)).bytes(),
           TensorInfoError, tensor=name, text="at most 63")


def test_tensor_name_of_63_bytes_is_fine(openb) -> None:
    name = "t" * 63
    with openb(good(tensors=[E.tensor_info(name, [4], F32, 0)], data=f32(4)).bytes()) as f:
        assert name in f.tensors


def test_tensor_name_length_over_1gib(openb) -> None:
    t = E.u64(2**31) + b"x" * 40
    expect(openb, good(tensors=[t], data=f32(4)).bytes(), TensorInfoError, text="1 GiB")


def test_tensor_name_not_utf8(openb) -> None:
    expect(openb, good(tensors=[E.tensor_info(b"\xc3(", [4], F32, 0)], data=f32(4)).bytes(),
           TensorInfoError, text="UTF-8")


def test_duplicate_tensor_name(openb) -> None:
    tensors = [E.tensor_info("a", [4], F32, 0), E.tensor_info("a", [4], F32, 32)]
    expect(openb, good(tensors=tensors).bytes(), TensorInfoError, tensor="a", text="duplicate")


@pytest.mark.parametrize("n_dims", [5, 2**32 - 1])
def test_too_many_dims(openb, n_dims: int) -> None:
    t = E.tensor_info("a", [4], F32, 0, n_dims=n_dims)
    expect(openb, good(tensors=[t], data=f32(4)).bytes(), TensorInfoError, tensor="a",
           text=f"n_dims {n_dims}")


@pytest.mark.parametrize("shape", [[-1], [4, -2], [4, 1, 1, -(2**63)]])
def test_negative_dim(openb, shape: list[int]) -> None:
    t = E.tensor_info("a", shape, F32, 0)
    expect(openb, good(tensors=[t], data=f32(4)).bytes(), TensorInfoError, tensor="a",
           text="negative")


@pytest.mark.parametrize("shape", [[2**32, 2**32], [2**62, 2, 1, 1], [2, 2, 2**31, 2**31]])
def test_element_count_overflow(openb, shape: list[int]) -> None:
    t = E.tensor_info("a", shape, F32, 0)
    expect(openb, good(tensors=[t], data=f32(4)).bytes(), TensorInfoError, tensor="a",
           text="overflows int64")


def test_size_in_bytes_overflow(openb) -> None:
    t = E.tensor_info("a", [2**62], int(GGMLType.F64), 0)  # 2**65 bytes
    expect(openb, good(tensors=[t], data=f32(4)).bytes(), TensorInfoError, tensor="a",
           text="overflows size_t")


@pytest.mark.parametrize("tid", [43, 100, 2**31, 2**32 - 1])
def test_unknown_tensor_type(openb, tid: int) -> None:
    t = E.tensor_info("a", [4], tid, 0)
    expect(openb, good(tensors=[t], data=f32(4)).bytes(), TensorInfoError, tensor="a",
           text=f"unknown ggml type id {tid}")


@pytest.mark.parametrize("tid", [4, 5, 31, 32, 33, 36, 37, 38])
def test_removed_tensor_type(openb, tid: int) -> None:
    t = E.tensor_info("a", [32], tid, 0)
    expect(openb, good(tensors=[t], data=b"\0" * 64).bytes(), TensorInfoError, tensor="a",
           text="removed")


@pytest.mark.parametrize("gtype,ne0", [(GGMLType.Q4_0, 48), (GGMLType.Q4_K, 128),
                                       (GGMLType.NVFP4, 32), (GGMLType.Q1_0, 64)])
def test_row_not_a_multiple_of_the_block(openb, gtype: GGMLType, ne0: int) -> None:
    t = E.tensor_info("q", [ne0, 2], int(gtype), 0)
    expect(openb, good(tensors=[t], data=b"\0" * 1024).bytes(), TensorInfoError, tensor="q",
           text=f"block size {gtype.block_size}")


@pytest.mark.parametrize("offsets", [(0, 16), (0, 64), (0, 0), (32, 64), (1, 33)])
def test_offsets_must_be_the_aligned_running_sum(openb, offsets: tuple[int, int]) -> None:
    tensors = [E.tensor_info("a", [4], F32, offsets[0]),
               E.tensor_info("b", [8, 2], F32, offsets[1])]
    bad = "a" if offsets[0] else "b"
    expect(openb, good(tensors=tensors, data=b"\0" * 256).bytes(), TensorInfoError,
           tensor=bad, text="expected")


def test_tensor_data_past_eof(openb) -> None:
    data = good().bytes()[:-4]
    e = expect(openb, data, TensorDataError, tensor="b", text="4 bytes missing")
    assert e.offset is not None


def test_data_section_past_eof(openb) -> None:
    f = good(data=b"")
    header = f.header()
    assert len(header) % 32  # the padding is what is missing
    expect(openb, header, TruncatedError, text="data section")


# -- truncation at every byte ------------------------------------------------------------------

def _rich_file(tmp_path: Path) -> Path:
    """A writer-made file with every value type, nested arrays and three tensors."""
    from gguflm.gguf import ArrayType, GGUFWriter

    w = GGUFWriter(tmp_path / "rich.gguf")
    for i, t in enumerate(ValueType):
        if t == ValueType.ARRAY:
            continue
        v = {ValueType.BOOL: True, ValueType.STRING: "héllo", ValueType.FLOAT32: 1.5,
             ValueType.FLOAT64: 2.5}.get(t, i)
        w.add(f"scalar.{t.name.lower()}", v, t)
        if t != ValueType.STRING:
            w.add(f"array.{t.name.lower()}", [v, v], ArrayType(t))
    w.add("array.string", ["a", "", "ü"], ArrayType(ValueType.STRING))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GGUFWarning)
        w.add("array.nested", [[1, 2], ["x"], []], ArrayType(ArrayType(ValueType.INT32)))
    w.add_tensor("t.f32", np.arange(8, dtype=np.float32))
    w.add_tensor("t.f16", np.ones((2, 16), dtype=np.float16))
    w.add_tensor("t.q8", np.zeros((2, 34), dtype=np.uint8), type=GGMLType.Q8_0)
    return w.write()


def test_truncation_at_every_byte(tmp_path: Path) -> None:
    src = _rich_file(tmp_path)
    data = src.read_bytes()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GGUFWarning)
        with gguf.open(src) as f:
            data_offset = f.data_offset
            ends = [t.file_offset + t.nbytes for t in f.tensors.values()]
        cut = tmp_path / "cut.gguf"
        kinds: dict[str, int] = {}
        for n in range(len(data)):
            cut.write_bytes(data[:n])
            try:
                gguf.open(cut).close()
            except GGUFError as e:
                kinds[type(e).__name__] = kinds.get(type(e).__name__, 0) + 1
                want = TruncatedError if n < data_offset else TensorDataError
                assert type(e) is want, f"cut at {n}: {type(e).__name__}: {e}"
                assert e.offset is not None and f"offset {e.offset}" in str(e)
            else:
                assert n >= max(ends), f"cut at {n} opened"
    assert kinds["TruncatedError"] == data_offset


def test_truncating_a_real_vocab_file(reference: Path, tmp_path: Path) -> None:
    """Cut the llama-spm vocabulary at every byte of its first 2 KB and at 60 places
    through its string arrays: always a TruncatedError."""
    data = (reference / "vocab" / "ggml-vocab-llama-spm.gguf").read_bytes()
    rng = np.random.default_rng(0)
    cuts = list(range(0, 2048)) + sorted(rng.integers(2048, len(data), 60).tolist())
    cut = tmp_path / "cut.gguf"
    for n in cuts:
        cut.write_bytes(data[:n])
        with pytest.raises(TruncatedError) as ei:
            gguf.open(cut)
        assert ei.value.offset is not None


# -- unusual but valid -------------------------------------------------------------------------

def test_bool_is_any_non_zero_byte(openb) -> None:
    kvs = [E.kv("b0", 7, b"\0"), E.kv("b2", 7, b"\2"), E.kv("bff", 7, b"\xff"),
           E.kv_arr("ba", 7, 4, b"\0\1\2\xff")]
    with openb(good(kvs=kvs).bytes()) as f:
        assert f["b0"] is False and f["b2"] is True and f["bff"] is True
        assert f["ba"].tolist() == [False, True, True, True]
        assert f.types["ba"] == gguf.ArrayType(ValueType.BOOL)


def test_arrays_of_arrays_are_read_with_a_warning(openb) -> None:
    body = E.arr(9, 3, E.arr(5, 2, struct.pack("<ii", 1, -2)) +
                 E.arr(8, 1, E.string("x")) + E.arr(9, 0, b""))
    with pytest.warns(GGUFWarning, match="llama.cpp will refuse"):
        f = openb(good(kvs=[E.kv("nest", 9, body)]).bytes())
    with f:
        v = f["nest"]
        assert v[0].tolist() == [1, -2] and list(v[1]) == ["x"] and v[2] == []
        assert f.types["nest"] == gguf.ArrayType(gguf.ArrayType(ValueType.INT32))
        assert f.warnings and "nest" in f.warnings[0]


@pytest.mark.parametrize("version", [1, 2])
def test_old_versions(openb, version: int) -> None:
    enc = Enc(version)
    with openb(good(enc).bytes()) as f:
        assert f.version == version
        assert f["general.architecture"] == "llama"
        assert list(f["tokenizer.ggml.tokens"]) == ["a", "bc", ""]
        assert f.tensors["b"].shape == (8, 2)
        assert np.array_equal(f.tensors["b"].data.ravel(), np.arange(16, dtype="f4"))


def test_big_endian_file(openb) -> None:
    be = Enc(3, ">")
    data = np.arange(4, dtype=">f4").tobytes() + b"\0" * 16 + np.arange(16, dtype=">f4").tobytes()
    kvs = [be.kv("general.architecture", 8, be.string("llama")), be.kv("n", 4, be.u32(7)),
           be.kv_arr("ints", 5, 2, struct.pack(">ii", 1, -1)),
           be.kv_arr("toks", 8, 2, be.string("x") + be.string("yz"))]
    with openb(good(be, kvs=kvs, data=data).bytes()) as f:
        assert f.byte_order == ">" and f.version == 3
        assert f["n"] == 7 and f["ints"].tolist() == [1, -1] and list(f["toks"]) == ["x", "yz"]
        assert f.tensors["b"].data[1, 7] == 15.0


def test_invalid_utf8_string_values_survive(openb) -> None:
    kvs = [E.kv("s", 8, E.string(b"a\xffb")), E.kv_arr("t", 8, 1, E.string(b"\xc3"))]
    with openb(good(kvs=kvs).bytes()) as f:
        assert f["s"].encode("utf-8", "surrogateescape") == b"a\xffb"
        assert f["t"].raw_bytes(0) == b"\xc3"


def test_zero_tensors_need_no_padding(openb) -> None:
    with openb(good(tensors=[], data=b"").bytes()) as f:
        assert f.tensors == {} and f.data_offset == f.file_size


def test_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match="cannot read"):
        gguf.open(tmp_path / "missing.gguf")
    with pytest.raises(GGUFError, match="cannot read"):
        gguf.open(tmp_path)
