"""The reader on real files: layout invariants, value types, zero-copy views, StringArray,
lifetime. (Malformed files: test_malformed.py; fuzzing: test_fuzz.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gguflm.gguf as gguf
from gguflm.gguf import ArrayType, GGMLType, StringArray, TensorDataError, ValueType
from gguflm.gguf.types import SCALAR_DTYPES

REFERENCE_FILES = [
    "quant-zoo/quant-zoo.gguf", "vocab/ggml-vocab-llama-spm.gguf",
    "vocab/ggml-vocab-gpt-2.gguf", "tiny-llama-q4_0/tiny-llama-q4_0.gguf",
    "arch/gemma2/tiny-gemma2-f16.gguf",
]


def _check_layout(f: gguf.GGUFFile) -> None:
    """ggml's layout: aligned data section, offsets the aligned running sum, in bounds."""
    assert f.version == 3 and f.alignment == 32
    expected = 0
    for t in f.tensors.values():
        assert t.offset == expected and t.file_offset == f.data_offset + t.offset
        assert t.nbytes == t.type.row_bytes(t.shape[0]) * t.n_rows
        expected += -(-t.nbytes // f.alignment) * f.alignment
    if f.tensors:
        assert f.data_offset % f.alignment == 0
        assert f.data_offset + expected == f.file_size
    else:
        assert f.data_offset <= f.file_size


def _check_types(f: gguf.GGUFFile) -> None:
    for key, v in f.metadata.items():
        t = f.types[key]
        if t == ValueType.STRING:
            assert isinstance(v, str)
        elif t == ValueType.BOOL:
            assert isinstance(v, bool)
        elif t in (ValueType.FLOAT32, ValueType.FLOAT64):
            assert isinstance(v, float)
        elif isinstance(t, ValueType):
            assert isinstance(v, int) and not isinstance(v, bool)
        elif t.elem == ValueType.STRING:
            assert isinstance(v, StringArray)
        elif t.elem == ValueType.BOOL:
            assert v.dtype == np.bool_
        else:
            assert isinstance(v, np.ndarray) and v.ndim == 1
            assert v.dtype.str[1:] == np.dtype(SCALAR_DTYPES[t.elem]).str[1:]
            assert not v.flags.owndata  # a view of the file


@pytest.mark.parametrize("rel", REFERENCE_FILES)
def test_reference_files(reference: Path, rel: str) -> None:
    with gguf.open(reference / rel) as f:
        _check_layout(f)
        _check_types(f)


def test_smollm2(smollm2_path: Path) -> None:
    with gguf.open(smollm2_path) as f:
        _check_layout(f)
        _check_types(f)
        assert f["general.architecture"] == "llama"
        assert f.get_arch_value("vocab_size") == len(f["tokenizer.ggml.tokens"])
        assert len(f["tokenizer.ggml.token_type"]) == len(f["tokenizer.ggml.tokens"])
        emb = f.tensors["token_embd.weight"]
        assert emb.np_shape == (f.get_arch_value("vocab_size"),
                                f.get_arch_value("embedding_length"))
        norm = f.tensors["blk.0.attn_norm.weight"]
        assert norm.type == GGMLType.F32 and norm.data.dtype == np.float32
        assert norm.data.shape == norm.np_shape and not norm.data.flags.owndata
        q = f.tensors["blk.0.attn_q.weight"]
        assert q.type.quantized
        assert q.data.dtype == np.uint8 and q.data.shape == (q.np_shape[0], q.row_bytes)


def test_gemma3(gemma3_path: Path) -> None:
    with gguf.open(gemma3_path) as f:
        _check_layout(f)
        _check_types(f)
        toks = f["tokenizer.ggml.tokens"]
        assert len(toks) == len(f["tokenizer.ggml.scores"]) == 262144
        assert f["tokenizer.ggml.bos_token_id"] < len(toks)
        types = {t.type for t in f.tensors.values()}
        assert {GGMLType.Q4_K, GGMLType.Q6_K}.issubset(types)


def test_string_array_api(reference: Path) -> None:
    with gguf.open(reference / "vocab" / "ggml-vocab-llama-spm.gguf") as f:
        toks = f["tokenizer.ggml.tokens"]
        assert f.types["tokenizer.ggml.tokens"] == ArrayType(ValueType.STRING)
    # usable after close: the array keeps its span of the mapping alive
    full = toks.tolist()
    assert len(full) == len(toks) == 32000
    assert list(toks) == full and toks == full
    assert toks[0] == full[0] and toks[-1] == full[-1] and toks[np.int64(7)] == full[7]
    assert toks[10:13] == full[10:13] and toks[::-8000] == full[::-8000]
    assert toks.raw_bytes(100) == full[100].encode("utf-8", "surrogateescape")
    with pytest.raises(IndexError):
        toks[32000]
    with pytest.raises(IndexError):
        toks[-32001]
    enc = bytes(toks.encoded())
    assert len(enc) == sum(8 + len(s.encode()) for s in full)
    assert "+31995 more" in repr(toks)


def test_closing_releases_tensor_views(reference: Path) -> None:
    path = reference / "tiny-llama-f16" / "tiny-llama-f16.gguf"
    with gguf.open(path) as f:
        t = f.tensors["output_norm.weight"]
        kept = t.data.copy()
        scores = f["tokenizer.ggml.scores"]
    with pytest.raises(TensorDataError, match="closed"):
        _ = t.data
    assert scores.shape == (32000,)  # numeric arrays stay valid views
    assert kept.shape == t.np_shape


def test_mapping_protocol(reference: Path) -> None:
    with gguf.open(reference / "tiny-llama-f16" / "tiny-llama-f16.gguf") as f:
        assert len(f) == len(f.metadata) and list(f) == list(f.metadata)
        assert f["general.architecture"] == "llama" and "general.architecture" in f
        assert f.get_arch_value("block_count") == 4
        assert f.get_arch_value("nope", 5) == 5
        assert "tensors" in repr(f)


def test_ggml_types() -> None:
    assert len(GGMLType) == 43 and [int(t) for t in GGMLType] == list(range(43))
    removed = {int(t) for t in GGMLType if t.removed}
    assert removed == {4, 5, 31, 32, 33, 36, 37, 38}
    assert GGMLType.from_name("q4_k") is GGMLType.Q4_K
    assert GGMLType.IQ2_XXS.ggml_name == "IQ2_XXS" and GGMLType(31).ggml_name == "Q4_0_4_4"
    with pytest.raises(ValueError):
        GGMLType.from_name("Q4_2")
