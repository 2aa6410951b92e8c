"""quantize_file against llama-quantize: the four tiny reference models x 13 file types must
come out byte-identical to llama.cpp's files (shared/reference/quantize/expected.json); the
mixture rules those files do not reach (deeper models, grouped-query and 70B attention,
experts, falcon, other file types, the options) are checked on models our writer makes,
against the rules of llama.cpp's src/llama-quant.cpp as written there."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

import gguflm.gguf as gguf
from gguflm.gguf.errors import GGUFError
from gguflm.gguf.types import GGMLType, ValueType
from gguflm.gguf.writer import GGUFWriter
from gguflm.quant import dequantize, quantize, quantize_file
from gguflm.quant.mixture import file_type, tensor_order

T = GGMLType
MODELS = {
    "tiny-llama-f16.gguf": "tiny-llama-f16/tiny-llama-f16.gguf",
    "tiny-qwen2-f16.gguf": "arch/qwen2/tiny-qwen2-f16.gguf",
    "tiny-gemma2-f16.gguf": "arch/gemma2/tiny-gemma2-f16.gguf",
    "tiny-phi3-f16.gguf": "arch/phi3/tiny-phi3-f16.gguf",
}
FILE_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M",
              "Q6_K", "IQ4_NL", "IQ4_XS", "TQ2_0"]


@pytest.fixture(scope="module")
def expected(reference: Path) -> dict:
    return json.loads((reference / "quantize" / "expected.json").read_text())["models"]


def sha256(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("ftype", FILE_TYPES)
@pytest.mark.parametrize("model", list(MODELS))
def test_llama_quantize_files_byte_for_byte(reference, expected, tmp_path, model, ftype):
    want = expected[model][ftype]
    out = tmp_path / "out.gguf"
    report = quantize_file(reference / MODELS[model], out, ftype, threads=2)
    data = out.read_bytes()
    if sha256(data) == want["sha256"]:
        assert len(data) == want["size"] and report.ftype == want["file_type"]
        return
    # say what differs: keys, then each tensor's name, type, shape and bytes
    with gguf.open(out) as f:
        assert list(f.metadata) == want["keys"]
        got = [(n, t.type.ggml_name, list(t.shape),
                sha256(f.raw_bytes(t.file_offset, t.file_offset + t.nbytes)))
               for n, t in f.tensors.items()]
    ref = [(t["name"], t["type"], t["shape"], t["sha256"]) for t in want["tensors"]]
    bad = [(g, r) for g, r in zip(got, ref) if g != r]
    assert len(got) == len(ref) and not bad, bad[:3]
    pytest.fail("every tensor matches but the files differ")


# -- models with the shapes the rules care about -------------------------------------------------

def write_model(path: Path, arch: str, n_layer: int, *, n_head: int = 8, n_head_kv: int = 2,
                n_expert: int = 0, tied: bool = False, n_embd: int = 256, ffn_cols: int = 96,
                extra_meta: dict | None = None, dtype: GGMLType = T.F16) -> Path:
    """A model with llama-style tensor names, random values: 2-D tensors ``n_embd`` wide
    (ffn_down ``ffn_cols`` wide) and 4 rows, so that quantizing it is quick; norms F32."""
    rng = np.random.default_rng(0)
    w = GGUFWriter(path)
    w.add("general.architecture", arch)
    w.add(f"{arch}.block_count", n_layer, ValueType.UINT32)
    w.add(f"{arch}.attention.head_count", n_head, ValueType.UINT32)
    w.add(f"{arch}.attention.head_count_kv", n_head_kv, ValueType.UINT32)
    if n_expert:
        w.add(f"{arch}.expert_count", n_expert, ValueType.UINT32)
    for k, v in (extra_meta or {}).items():
        if isinstance(v, tuple):
            w.add(k, *v)
        else:
            w.add(k, v)

    def add(name: str, shape: tuple[int, ...], t: GGMLType = dtype) -> None:
        x = (rng.standard_normal(shape[::-1]) * 0.1).astype(np.float32)
        if t == T.F32:
            w.add_tensor(name, x)
        elif t == T.F16:
            w.add_tensor(name, x.astype(np.float16))
        else:
            w.add_tensor(name, quantize(x, t), type=t)

    add("token_embd.weight", (n_embd, 8))
    if not tied:
        add("output.weight", (n_embd, 8))
    add("output_norm.weight", (n_embd,), T.F32)
    for i in range(n_layer):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (n_embd,), T.F32)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            add(p + name + ".weight", (n_embd, 4))
        if n_expert:
            add(p + "ffn_gate_inp.weight", (n_embd, n_expert))
            add(p + "ffn_gate_exps.weight", (n_embd, 4, n_expert))
            add(p + "ffn_up_exps.weight", (n_embd, 4, n_expert))
            add(p + "ffn_down_exps.weight", (ffn_cols, 4, n_expert))
        else:
            add(p + "ffn_gate.weight", (n_embd, 4))
            add(p + "ffn_up.weight", (n_embd, 4))
            add(p + "ffn_down.weight", (ffn_cols, 4))
        add(p + "ffn_norm.weight", (n_embd,), T.F32)
    return w.write()


def types_of(path: Path) -> dict[str, str]:
    with gguf.open(path) as f:
        return {n: t.type.ggml_name for n, t in f.tensors.items()}


def per_layer(types: dict[str, str], part: str, n_layer: int) -> list[str]:
    return [types[f"blk.{i}.{part}.weight"] for i in range(n_layer)]


def use_more_bits(i: int, n: int) -> bool:  # llama-quant.cpp's, for the expectations
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


@pytest.fixture(scope="module")
def deep(tmp_path_factory) -> Path:
    """16 layers, 8 heads on 2 KV heads (n_gqa 4), untied output, ffn_down rows of 96."""
    return write_model(tmp_path_factory.mktemp("m") / "deep.gguf", "llama", 16)


def test_mixture_q4_k_s_and_fallbacks(deep, tmp_path):
    n = 16
    types = types_of(quantize_file(deep, tmp_path / "o.gguf", "Q4_K_S").path)
    # attn_v: Q5_K for the first 4; ffn_down: Q5_K below n/8, 96-wide rows fall back to the
    # 32-block kin (Q5_K -> Q5_1, Q4_K -> Q5_0)
    assert per_layer(types, "attn_v", n) == ["Q5_K"] * 4 + ["Q4_K"] * 12
    assert per_layer(types, "ffn_down", n) == ["Q5_1"] * 2 + ["Q5_0"] * 14
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"
    assert set(per_layer(types, "attn_q", n) + per_layer(types, "ffn_up", n)) == {"Q4_K"}
    assert types["output_norm.weight"] == types["blk.3.ffn_norm.weight"] == "F32"


def test_mixture_more_bits_layers(deep, tmp_path):
    n = 16
    more = [use_more_bits(i, n) for i in range(n)]
    types = types_of(quantize_file(deep, tmp_path / "m.gguf", "Q5_K_M").path)
    assert per_layer(types, "attn_v", n) == ["Q6_K" if m else "Q5_K" for m in more]
    assert per_layer(types, "ffn_down", n) == ["Q8_0" if m else "Q5_1" for m in more]
    types = types_of(quantize_file(deep, tmp_path / "l.gguf", "Q3_K_M").path)
    assert per_layer(types, "attn_v", n) == ["Q5_K"] * 2 + ["Q4_K"] * 14
    assert per_layer(types, "ffn_down", n) == ["Q5_1"] + ["Q5_0"] * 15  # n/16 = 1
    assert set(per_layer(types, "attn_output", n)) == {"Q4_K"}
    types = types_of(quantize_file(deep, tmp_path / "k.gguf", "Q3_K_L").path)
    assert set(per_layer(types, "attn_v", n) + per_layer(types, "attn_output", n)) == {"Q5_K"}
    assert set(per_layer(types, "ffn_down", n)) == {"Q5_1"}


def test_mixture_grouped_query_and_low_bits(deep, tmp_path):
    n = 16
    types = types_of(quantize_file(deep, tmp_path / "a.gguf", "Q2_K").path)
    assert set(per_layer(types, "attn_v", n)) == {"Q4_K"}  # n_gqa >= 4
    assert set(per_layer(types, "ffn_down", n)) == {"Q4_0"}  # Q3_K, 96 wide
    assert set(per_layer(types, "attn_output", n)) == {"Q3_K"}
    assert types["token_embd.weight"] == "Q2_K"
    types = types_of(quantize_file(deep, tmp_path / "b.gguf", "IQ4_XS").path)
    assert set(per_layer(types, "attn_v", n)) == {"Q5_K"}
    assert per_layer(types, "ffn_down", n) == ["Q5_1"] * 2 + ["IQ4_NL"] * 14
    types = types_of(quantize_file(deep, tmp_path / "c.gguf", "TQ1_0").path)
    assert types["token_embd.weight"] == "Q4_K" and types["output.weight"] == "Q6_K"
    assert set(per_layer(types, "ffn_down", n)) == {"Q4_0"}
    assert set(per_layer(types, "attn_q", n)) == {"TQ1_0"}


def test_70b_attention_and_falcon(tmp_path):
    big = write_model(tmp_path / "70b.gguf", "llama", 80)
    types = types_of(quantize_file(big, tmp_path / "o.gguf", "Q4_K_S").path)
    assert set(per_layer(types, "attn_v", 80)) == {"Q5_K"}  # Q4_K bumped for the 70B
    falcon = write_model(tmp_path / "falcon.gguf", "falcon", 16, ffn_cols=256)
    types = types_of(quantize_file(falcon, tmp_path / "f.gguf", "Q4_K_M").path)
    assert types["output.weight"] == "Q8_0"
    assert per_layer(types, "ffn_down", 16) == [
        "Q6_K" if i < 1 else "Q5_K" if use_more_bits(i, 16) else "Q4_K" for i in range(16)]


def test_experts(tmp_path):
    moe = write_model(tmp_path / "moe.gguf", "llama", 8, n_expert=8, ffn_cols=256)
    types = types_of(quantize_file(moe, tmp_path / "q.gguf", "Q4_K_M").path)
    assert set(per_layer(types, "attn_v", 8) + per_layer(types, "attn_k", 8)) == {"Q8_0"}
    assert set(per_layer(types, "attn_output", 8)) == {"Q5_K"}
    assert per_layer(types, "ffn_down_exps", 8) == [
        "Q6_K" if use_more_bits(i, 8) else "Q4_K" for i in range(8)]
    assert types["blk.0.ffn_gate_inp.weight"] == "F16"  # routers stay as they are
    types = types_of(quantize_file(moe, tmp_path / "m.gguf", "MXFP4_MOE").path)
    assert set(per_layer(types, "ffn_up_exps", 8)) == {"MXFP4"}
    assert set(per_layer(types, "attn_q", 8)) | {types["output.weight"]} == {"Q8_0"}


def test_options(deep, tmp_path):
    def run(**kw):
        return types_of(quantize_file(deep, tmp_path / "o.gguf", "Q4_K_M", **kw).path)

    types = run(pure=True)
    assert types["output.weight"] == types["blk.2.attn_v.weight"] == "Q4_K"
    assert types["blk.0.ffn_down.weight"] == "Q5_0"  # pure still falls back
    types = run(output_tensor_type="Q8_0", token_embedding_type="f16")
    assert types["output.weight"] == "Q8_0" and types["token_embd.weight"] == "F16"
    assert run(leave_output_tensor=True)["output.weight"] == "F16"
    tied = write_model(tmp_path / "tied.gguf", "llama", 2, tied=True)
    assert types_of(quantize_file(tied, tmp_path / "t.gguf", "Q4_0").path)[
        "token_embd.weight"] == "Q6_K"  # a tied embedding is the output
    assert types_of(quantize_file(tied, tmp_path / "t.gguf", "Q4_0",
                                  output_tensor_type="Q5_1").path)["token_embd.weight"] == "Q5_1"


def test_rows_fitting_no_block_fall_back_to_f16(tmp_path):
    odd = write_model(tmp_path / "odd.gguf", "llama", 2, ffn_cols=40)
    report = quantize_file(odd, tmp_path / "o.gguf", "Q4_K_M")
    types = types_of(report.path)
    assert types["blk.0.ffn_down.weight"] == "F16" and report.n_fallback == 2
    assert types["blk.0.ffn_up.weight"] == "Q4_K"


# -- file-level behaviour ------------------------------------------------------------------------

def test_metadata_order_and_keys(tmp_path):
    src = write_model(tmp_path / "m.gguf", "llama", 2, extra_meta={
        "general.file_type": (1, ValueType.UINT32), "general.quantization_version":
        (1, ValueType.UINT32), "split.no": (0, ValueType.UINT16), "general.name": "m"})
    with gguf.open(src) as f:
        before = list(f.metadata)
        assert f.version == 3
    out = quantize_file(src, tmp_path / "o.gguf", "Q8_0").path
    with gguf.open(out) as f:
        keys = list(f.metadata)
        assert keys == [k for k in before if k not in (
            "general.file_type", "general.quantization_version", "split.no")] + [
            "general.quantization_version", "general.file_type"]
        assert f["general.file_type"] == 7 and f["general.quantization_version"] == 2
        assert f.types["general.file_type"] == ValueType.UINT32
        assert list(f.tensors) == tensor_order(f.tensors)
        assert list(f.tensors)[:3] == ["output.weight", "output_norm.weight",
                                       "token_embd.weight"]


def test_tensor_order_is_by_layer_then_name():
    names = ["blk.10.a", "blk.2.b", "token_embd.weight", "blk.2.a", "output.weight", "blk.1.z"]
    assert tensor_order(names) == ["output.weight", "token_embd.weight", "blk.1.z", "blk.2.a",
                                   "blk.2.b", "blk.10.a"]


def test_plain_file_types_and_copy(tmp_path):
    src = write_model(tmp_path / "m.gguf", "llama", 2)
    with gguf.open(src) as f:
        ref = {n: dequantize(t) for n, t in f.tensors.items()}
    for ftype, t in (("F32", T.F32), ("BF16", T.BF16), ("F16", T.F16)):
        out = quantize_file(src, tmp_path / f"{ftype}.gguf", ftype).path
        with gguf.open(out) as f:
            assert f["general.file_type"] == file_type(ftype).ftype
            for n, x in f.tensors.items():
                want = T.F32 if len(x.shape) == 1 else t
                assert x.type == want, n
                y = dequantize(x)
                if t == T.BF16 and want == T.BF16:
                    assert np.allclose(y, ref[n], rtol=1 / 128), n
                else:
                    assert np.array_equal(y, ref[n]), n
    copy = quantize_file(src, tmp_path / "c.gguf", "COPY").path
    with gguf.open(copy) as f:
        assert f["general.file_type"] == 1 | 1024  # not in the input: guessed, as llama.cpp
        assert all(t.type == T.F16 for t in f.tensors.values() if len(t.shape) > 1)


def test_requantizing_needs_the_flag(tmp_path):
    q8 = write_model(tmp_path / "q8.gguf", "llama", 2, ffn_cols=256, dtype=T.Q8_0)
    out = tmp_path / "o.gguf"
    with pytest.raises(GGUFError, match="already quantized \\(Q8_0\\).*--allow-requantize"):
        quantize_file(q8, out, "Q4_K_M")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q8.gguf"]
    # a file type that keeps every tensor's type needs no flag: tensors are copied
    assert quantize_file(q8, out, "Q8_0").tensors[0].converted is False
    quantize_file(q8, out, "Q4_K_M", allow_requantize=True)
    with gguf.open(q8) as a, gguf.open(out) as b:
        t = a.tensors["blk.0.ffn_up.weight"]
        assert b.tensors[t.name].type == T.Q4_K
        assert np.array_equal(b.tensors[t.name].data, quantize(dequantize(t), T.Q4_K))


@pytest.mark.parametrize("ftype, kw, message", [
    ("Q9_K", {}, "unknown file type 'Q9_K'"),
    ("IQ2_XS", {}, "IQ2_XS is not supported yet"),
    ("Q2_K_S", {}, "Q2_K.*importance matrix"),
    ("Q4_0", {"token_embedding_type": "IQ2_XXS"}, "cannot make IQ2_XXS.*importance matrix"),
    ("Q4_0", {"output_tensor_type": "Q9"}, "unknown ggml type 'Q9'"),
    # an explicit type is not fallen back: rows of 96 fit no Q4_K block
    ("Q4_K_M", {"output_tensor_type": "Q4_K"},
     "'output.weight'.*row length 96.*Q4_K block size 256"),
])
def test_refusals_write_nothing(tmp_path, ftype, kw, message):
    # rows of 96 everywhere for the last case; 256 otherwise (a Q2_K_S file of 96-wide rows
    # has no Q2_K tensor, so it needs no importance matrix)
    src = write_model(tmp_path / "m.gguf", "llama", 2,
                      n_embd=96 if "output_tensor_type" in kw else 256)
    with pytest.raises(GGUFError, match=message):
        quantize_file(src, tmp_path / "o.gguf", ftype, **kw)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def test_output_is_not_the_input(tmp_path):
    src = write_model(tmp_path / "m.gguf", "llama", 2)
    before = src.read_bytes()
    for out in (src, tmp_path / "." / "m.gguf"):
        with pytest.raises(GGUFError, match="output file is the input"):
            quantize_file(src, out, "Q8_0")
    assert src.read_bytes() == before


def test_interrupt_leaves_nothing(tmp_path):
    src = write_model(tmp_path / "m.gguf", "llama", 2)

    def progress(done, total, tensor):
        if done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        quantize_file(src, tmp_path / "o.gguf", "Q4_K_M", progress=progress)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]
