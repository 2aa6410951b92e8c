"""Fuzzing the reader (short, deterministic run for CI; benchmarks/fuzz_long.py runs long).

Mutations of real headers (byte flips, sets, insertions, deletions, truncations and
"interesting" u32/u64 values written over counts and lengths): opening the result must
either succeed, with every value and tensor view usable, or raise a GGUFError. Nothing
else may escape, and no case may allocate more than a bounded amount of memory.
"""

from __future__ import annotations

import struct
import tempfile
import tracemalloc
import warnings
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gguflm.gguf as gguf
from gguflm.gguf import GGMLType, GGUFError, GGUFWarning, GGUFWriter, ValueType

MEMORY_LIMIT = 32 << 20  # bytes traced during one open: the real files need ~3 MB
INTERESTING = [0, 1, 2, 3, 4, 7, 8, 9, 12, 13, 31, 32, 33, 63, 64, 255, 256, 0xFFFF,
               1 << 30, (1 << 30) + 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62,
               2**63 - 1, 2**63, 2**64 - 1]


@cache
def _small_file() -> bytes:
    """A writer-made file: a few keys of several types, nested arrays, three tensors."""
    with tempfile.TemporaryDirectory() as d:
        w = GGUFWriter(Path(d) / "s.gguf")
        w.add("general.architecture", "llama")
        w.add("general.alignment", 32, ValueType.UINT32)
        w.add("tokenizer.ggml.tokens", ["<s>", "a", "bc", "\u00e9"])
        w.add("tokenizer.ggml.scores", np.array([0, -1, -2, -3], np.float32))
        w.add("flag", True)
        w.add("big", 2**40)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", GGUFWarning)
            w.add("nested", [[1, 2], ["x"]], gguf.ArrayType(gguf.ArrayType(ValueType.INT32)))
        w.add_tensor("a", np.arange(8, dtype=np.float32))
        w.add_tensor("b", np.zeros((2, 34), np.uint8), type=GGMLType.Q8_0)
        w.add_tensor("c", np.ones((3, 4), np.float16))
        return w.write().read_bytes()


def _vocab_file() -> bytes:
    from conftest import REFERENCE

    path = REFERENCE / "vocab" / "ggml-vocab-llama-spm.gguf"
    if not path.is_file():
        pytest.skip(f"reference data not found at {REFERENCE}")
    return path.read_bytes()


_op = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 4095), st.integers(0, 7)),
    st.tuples(st.just("set"), st.integers(0, 4095), st.integers(0, 255)),
    st.tuples(st.just("insert"), st.integers(0, 4095), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), st.integers(0, 4095), st.integers(1, 16)),
    st.tuples(st.just("truncate"), st.integers(0, 4095), st.just(0)),
    st.tuples(st.just("u32"), st.integers(0, 4095), st.sampled_from(INTERESTING)),
    st.tuples(st.just("u64"), st.integers(0, 4095), st.sampled_from(INTERESTING)),
)


def mutate(data: bytes, ops: list[tuple]) -> bytes:
    b = bytearray(data)
    for kind, pos, arg in ops:
        pos = pos % (len(b) + 1)
        if kind == "flip" and pos < len(b):
            b[pos] ^= 1 << arg
        elif kind == "set" and pos < len(b):
            b[pos] = arg
        elif kind == "insert":
            b[pos:pos] = arg
        elif kind == "delete":
            del b[pos:pos + arg]
        elif kind == "truncate":
            del b[pos:]
        elif kind == "u32":
            b[pos:pos + 4] = struct.pack("<I", arg & 0xFFFFFFFF)
        elif kind == "u64":
            b[pos:pos + 8] = struct.pack("<Q", arg)
    return bytes(b)


def open_and_touch(path: Path) -> str:
    """Open, then use every value and tensor view; the outcome's name."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GGUFWarning)
        try:
            f = gguf.open(path)
        except GGUFError as e:
            return type(e).__name__
    with f:
        for v in f.metadata.values():
            if isinstance(v, gguf.StringArray):
                v.tolist()
            elif isinstance(v, list):
                repr(v)
        for t in f.tensors.values():
            d = t.data
            if d.size:
                d.reshape(-1)[-1]  # the last byte of every tensor is readable
    return "ok"


def check(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    tracemalloc.start()
    try:
        outcome = open_and_touch(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_LIMIT, f"{peak} bytes traced"
    return outcome


_SETTINGS = dict(max_examples=100, derandomize=True, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture,
                                        HealthCheck.too_slow])


@settings(**_SETTINGS)
@given(ops=st.lists(_op, min_size=1, max_size=4))
def test_fuzz_small_file(tmp_path: Path, ops: list[tuple]) -> None:
    check(tmp_path / "f.gguf", mutate(_small_file(), ops))


@settings(**_SETTINGS)
@given(ops=st.lists(_op, min_size=1, max_size=4))
def test_fuzz_vocab_header(tmp_path: Path, ops: list[tuple]) -> None:
    check(tmp_path / "f.gguf", mutate(_vocab_file(), ops))


def test_unmutated_bases_open(tmp_path: Path) -> None:
    assert check(tmp_path / "a.gguf", _small_file()) == "ok"
    assert check(tmp_path / "b.gguf", _vocab_file()) == "ok"
