"""``gguflm convert``: Hugging Face checkpoints to the GGUF llama.cpp's converter writes.

- all-MiniLM-L6-v2 (the checkpoint ``gguflm pull all-minilm-l6-v2`` keeps in the cache, or
  ``$GGUFLM_MINILM_DIR``) against the manifest of llama.cpp's own ``--outtype f16`` output:
  every key, type and value (``general.name`` included), every tensor's name, type, shape
  and sha256, in order.
- Decoder families on small random checkpoints written here, with the tokenizer.json of
  llama.cpp's test vocabularies (which llama.cpp's converter made from the real tokenizers):
  tensor names and types, the Llama Q/K permutation, keys, and the vocabulary round trip.
- Bad inputs: one ``error:`` line naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REFERENCE
from gguflm import gguf
from gguflm.convert import ConvertError, convert
from gguflm.gguf.types import type_name

REF = REFERENCE  # $GGUFLM_REFERENCE or ../shared/reference, as every test reads it


def _minilm_dir() -> Path:
    from gguflm.hub import checkpoint_dir

    folder = Path(os.environ.get("GGUFLM_MINILM_DIR") or checkpoint_dir("all-minilm-l6-v2"))
    if not (folder / "model.safetensors").is_file():
        pytest.skip(f"the all-MiniLM-L6-v2 checkpoint is not at {folder}: run "
                    "`gguflm pull all-minilm-l6-v2` (or set GGUFLM_MINILM_DIR)")
    return folder


def _manifest(reference: Path) -> dict:
    path = reference / "minilm" / "convert-f16-manifest.json"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    return json.loads(path.read_text("utf-8"))


def _value_matches(value: object, want: object) -> bool:
    if isinstance(want, dict) and "sha256" in want:
        items = value.tolist() if hasattr(value, "tolist") else list(value)
        text = json.dumps(items, ensure_ascii=False)
        return len(items) == want["len"] and hashlib.sha256(text.encode()).hexdigest() == \
            want["sha256"]
    return (value.item() if hasattr(value, "item") else value) == want


def test_minilm_f16_is_llama_cpp_output(reference: Path, tmp_path: Path) -> None:
    manifest = _manifest(reference)
    out = convert(_minilm_dir(), tmp_path / "m.gguf", "f16")
    with gguf.open(out) as f:
        assert list(f.metadata) == list(manifest["metadata"])
        for key, spec in manifest["metadata"].items():
            assert type_name(f.types[key]).upper() == spec["type"], key
            assert _value_matches(f.metadata[key], spec["value"]), key
        assert list(f.tensors) == [t["name"] for t in manifest["tensors"]]
        for t in manifest["tensors"]:
            info = f.tensors[t["name"]]
            assert (info.type.ggml_name, list(info.shape)) == (t["type"], t["shape"])
            assert hashlib.sha256(bytes(info.data)).hexdigest() == t["sha256"], t["name"]


def test_minilm_other_outtypes(tmp_path: Path) -> None:
    folder = _minilm_dir()
    with gguf.open(convert(folder, tmp_path / "f32.gguf", "f32")) as f:
        assert f.metadata["general.file_type"] == 0
        assert {t.type.ggml_name for t in f.tensors.values()} == {"F32"}
        from gguflm.convert.safetensors import read_header

        src = {t.name: t for t in read_header(folder / "model.safetensors")}
        q = np.asarray(f.tensors["blk.0.attn_q.weight"].data)
        want = src["encoder.layer.0.attention.self.query.weight"].load()
        assert np.array_equal(q.view(np.float32).reshape(want.shape), want)
    with gguf.open(convert(folder, tmp_path / "{ftype}.gguf", "q8_0")) as f:
        assert Path(f.path).name == "q8_0.gguf"
        assert f.metadata["general.file_type"] == 7
        assert f.tensors["token_embd.weight"].type.ggml_name == "Q8_0"
        assert f.tensors["blk.0.attn_q.bias"].type.ggml_name == "F32"


# --- random decoder checkpoints ---------------------------------------------------------------

def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    names = {np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<u2"): "BF16"}
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": names[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def tokenizer_json(vocab_file: Path, folder: Path) -> dict:
    """A tokenizer.json + tokenizer_config.json rebuilt from a llama.cpp vocabulary file."""
    with gguf.open(vocab_file) as f:
        md = dict(f.metadata)
    tokens = list(md["tokenizer.ggml.tokens"])
    types = np.asarray(md["tokenizer.ggml.token_type"]).tolist()
    added = [{"id": i, "content": t, "special": ty == 3, "normalized": False}
             for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (3, 4)]
    bos = md.get("tokenizer.ggml.bos_token_id")
    bos_text = tokens[bos] if bos is not None else None
    add_bos = md.get("tokenizer.ggml.add_bos_token", md["tokenizer.ggml.pre"] == "llama-bpe")
    post = ({"type": "TemplateProcessing", "single": [
        {"SpecialToken": {"id": bos_text, "type_id": 0}}, {"Sequence": {"id": "A"}}]}
        if add_bos else {"type": "ByteLevel"})
    tj = {"added_tokens": added, "post_processor": post,
          "model": {"type": "BPE", "vocab": {t: i for i, (t, ty) in enumerate(zip(tokens, types))
                                             if ty not in (3, 4)},  # added ones apart, as HF
                    "merges": list(md["tokenizer.ggml.merges"])}}
    (folder / "tokenizer.json").write_text(json.dumps(tj), "utf-8")
    config = {"bos_token": bos_text} if add_bos else {}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), "utf-8")
    return md


ARCHS = {  # HF architecture -> (GGUF arch, vocabulary, Q/K norms, biases)
    "LlamaForCausalLM": ("llama", "llama-bpe", False, False),
    "Qwen2ForCausalLM": ("qwen2", "qwen2", False, True),
    "Qwen3ForCausalLM": ("qwen3", "qwen2", True, False),
    "Gemma3ForCausalLM": ("gemma3", "qwen2", True, False),
}


def random_decoder(folder: Path, hf_arch: str, n_vocab: int) -> dict[str, np.ndarray]:
    _, _, qk_norm, bias = ARCHS[hf_arch]
    rng = np.random.default_rng(0)
    d, heads, kv, hd, ff = 64, 4, 2, 16, 96
    w = {"model.embed_tokens.weight": rng.standard_normal((n_vocab, d), np.float32),
         "model.norm.weight": rng.standard_normal(d, np.float32),
         "lm_head.weight": rng.standard_normal((n_vocab, d), np.float32)}
    for i in range(2):
        p = f"model.layers.{i}."
        shapes = {"self_attn.q_proj": (heads * hd, d), "self_attn.k_proj": (kv * hd, d),
                  "self_attn.v_proj": (kv * hd, d), "self_attn.o_proj": (d, heads * hd),
                  "mlp.gate_proj": (ff, d), "mlp.up_proj": (ff, d), "mlp.down_proj": (d, ff)}
        for name, shape in shapes.items():
            w[p + name + ".weight"] = rng.standard_normal(shape, np.float32)
            if bias and name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
                w[p + name + ".bias"] = rng.standard_normal(shape[0], np.float32)
        w[p + "input_layernorm.weight"] = rng.standard_normal(d, np.float32)
        w[p + "post_attention_layernorm.weight"] = rng.standard_normal(d, np.float32)
        if qk_norm:
            w[p + "self_attn.q_norm.weight"] = rng.standard_normal(hd, np.float32)
            w[p + "self_attn.k_norm.weight"] = rng.standard_normal(hd, np.float32)
        if hf_arch.startswith("Gemma3"):
            w[p + "pre_feedforward_layernorm.weight"] = rng.standard_normal(d, np.float32)
            w[p + "post_feedforward_layernorm.weight"] = rng.standard_normal(d, np.float32)
    if hf_arch.startswith("Gemma3"):
        del w["lm_head.weight"]  # tied, and 8 rows beyond the tokenizer's (the cut)
        w["model.embed_tokens.weight"] = rng.standard_normal((n_vocab + 8, d), np.float32)
    write_safetensors(folder / "model.safetensors", w)
    config = {"architectures": [hf_arch], "hidden_size": d, "num_attention_heads": heads,
              "num_key_value_heads": kv, "num_hidden_layers": 2, "intermediate_size": ff,
              "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "vocab_size": n_vocab, "tie_word_embeddings": False}
    if qk_norm:
        config["head_dim"] = hd
    if hf_arch.startswith("Gemma3"):
        config.update(sliding_window=32, sliding_window_pattern=6, rope_local_base_freq=10000.0,
                      rope_theta=1e6, query_pre_attn_scalar=hd)
    (folder / "config.json").write_text(json.dumps(config), "utf-8")
    return w


def _permuted(w: np.ndarray, n_head: int) -> np.ndarray:
    """Row r of head h: HF rotate-half order (i, i + d/2) -> llama.cpp's pairs (2i, 2i+1)."""
    d = w.shape[0] // n_head
    order = [h * d + (j // 2 if j % 2 == 0 else d // 2 + j // 2)
             for h in range(n_head) for j in range(d)]
    return w[order]


@pytest.mark.parametrize("hf_arch", list(ARCHS))
def test_decoder_layout(hf_arch: str, tmp_path: Path) -> None:
    arch, vocab_name, qk_norm, bias = ARCHS[hf_arch]
    vocab_file = REF / "vocab" / f"ggml-vocab-{vocab_name}.gguf"
    if not vocab_file.is_file():
        pytest.skip(f"{vocab_file} not found")
    md = tokenizer_json(vocab_file, tmp_path)
    n_vocab = len(md["tokenizer.ggml.tokens"])
    w = random_decoder(tmp_path, hf_arch, n_vocab)
    with gguf.open(convert(tmp_path, tmp_path / "out.gguf", "f32")) as f:
        assert f.metadata["general.architecture"] == arch
        for key in ("model", "pre", "tokens", "merges", "token_type"):
            got, want = f.metadata[f"tokenizer.ggml.{key}"], md[f"tokenizer.ggml.{key}"]
            assert np.array_equal(np.asarray(got), np.asarray(want)), key
        assert f.metadata[f"{arch}.attention.head_count_kv"] == 2
        assert f.metadata[f"{arch}.rope.freq_base"] == (1e6 if arch == "gemma3" else 10000.0)
        names = set(f.tensors)
        assert {"token_embd.weight", "output_norm.weight",
                "blk.1.ffn_gate.weight", "blk.1.attn_output.weight"} <= names
        assert ("output.weight" in names) == (arch != "gemma3")
        assert ("blk.0.attn_q.bias" in names) == bias
        assert ("blk.0.attn_k_norm.weight" in names) == qk_norm

        def data(name: str) -> np.ndarray:
            t = f.tensors[name]
            return np.asarray(t.data).view(np.float32).reshape(tuple(reversed(t.shape)))

        q, k = w["model.layers.0.self_attn.q_proj.weight"], \
            w["model.layers.0.self_attn.k_proj.weight"]
        if arch == "gemma3":
            assert data("token_embd.weight").shape == (n_vocab, 64)  # cut to the tokenizer
            assert np.array_equal(data("blk.1.post_ffw_norm.weight"),
                                  w["model.layers.1.post_feedforward_layernorm.weight"] + 1)
            assert np.array_equal(data("output_norm.weight"), w["model.norm.weight"] + 1)
            assert f.metadata["gemma3.attention.sliding_window"] == 32
            assert f.metadata["gemma3.rope.freq_base_swa"] == 10000.0
            assert f.metadata["gemma3.attention.key_length"] == 16
            from gguflm import load_model

            model = load_model(f.path)  # gguflm's gemma3 runs what the converter wrote
            assert np.isfinite(model.logits([1, 2, 3])).all()
        if arch == "llama":
            assert np.array_equal(data("blk.0.attn_q.weight"), _permuted(q, 4))
            assert np.array_equal(data("blk.0.attn_k.weight"), _permuted(k, 2))
            assert f.metadata["llama.rope.dimension_count"] == 16
        else:
            assert np.array_equal(data("blk.0.attn_q.weight"), q)
            assert np.array_equal(data("blk.0.attn_k.weight"), k)
    with gguf.open(convert(tmp_path, tmp_path / "f16.gguf", "f16")) as f:
        assert f.tensors["blk.0.attn_q.weight"].type.ggml_name == "F16"
        assert f.tensors["blk.0.attn_norm.weight"].type.ggml_name == "F32"


# --- bad inputs --------------------------------------------------------------------------------

def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gguflm.cli", "convert", *args],
                          capture_output=True, text=True, timeout=120)


def _one_error_line(proc: subprocess.CompletedProcess, names: str) -> None:
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert names in lines[0], lines[0]


def _checkpoint(folder: Path) -> None:
    (folder / "config.json").write_text(json.dumps(
        {"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 1}), "utf-8")
    write_safetensors(folder / "model.safetensors",
                      {"model.norm.weight": np.ones(8, np.float32)})


def test_bad_inputs(tmp_path: Path) -> None:
    _one_error_line(_cli(str(tmp_path / "nowhere")), "nowhere")
    _one_error_line(_cli(str(tmp_path)), "config.json")
    _checkpoint(tmp_path)
    (tmp_path / "config.json").write_text('{"architectures": ["Mamba9000"]}', "utf-8")
    proc = _cli(str(tmp_path))
    _one_error_line(proc, "config.json")
    assert "Mamba9000" in proc.stderr
    (tmp_path / "config.json").write_text("{not json", "utf-8")
    _one_error_line(_cli(str(tmp_path)), "config.json")

    _checkpoint(tmp_path)
    st = tmp_path / "model.safetensors"
    raw = st.read_bytes()
    st.write_bytes(raw[:20])  # truncated inside the header
    _one_error_line(_cli(str(tmp_path)), "model.safetensors")
    st.write_bytes(raw[:-4])  # the data is shorter than the header says
    proc = _cli(str(tmp_path))
    _one_error_line(proc, "model.safetensors")
    assert "model.norm.weight" in proc.stderr
    head_len = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + head_len])
    head["model.norm.weight"]["shape"] = [9]  # a lying shape: 36 bytes in 32
    new = json.dumps(head).encode()
    st.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + head_len:])
    _one_error_line(_cli(str(tmp_path)), "model.safetensors")
    st.write_bytes(struct.pack("<Q", 1 << 60) + raw[8:])  # an absurd header length
    _one_error_line(_cli(str(tmp_path)), "model.safetensors")


def test_auto_keeps_bf16(tmp_path: Path) -> None:
    vocab_file = REF / "vocab" / "ggml-vocab-qwen2.gguf"
    if not vocab_file.is_file():
        pytest.skip(f"{vocab_file} not found")
    n_vocab = len(tokenizer_json(vocab_file, tmp_path)["tokenizer.ggml.tokens"])
    w = random_decoder(tmp_path, "Qwen2ForCausalLM", n_vocab)
    bf16 = {k: (v.view(np.uint32) >> 16).astype("<u2") for k, v in w.items()}
    write_safetensors(tmp_path / "model.safetensors", bf16)
    with gguf.open(convert(tmp_path, tmp_path / "auto.gguf")) as f:
        assert f.metadata["general.file_type"] == 32
        t = f.tensors["blk.0.ffn_up.weight"]
        assert t.type.ggml_name == "BF16"
        assert np.array_equal(np.asarray(t.data).view("<u2").reshape(-1),
                              bf16["model.layers.0.mlp.up_proj.weight"].reshape(-1))
        assert f.tensors["blk.0.attn_q.bias"].type.ggml_name == "F32"


def test_missing_tokenizer_and_unmapped_tensor(tmp_path: Path) -> None:
    _checkpoint(tmp_path)
    with pytest.raises(ConvertError, match="tokenizer.json"):
        convert(tmp_path, tmp_path / "x.gguf")
    (tmp_path / "tokenizer.model").write_bytes(b"\n\x05")
    with pytest.raises(ConvertError, match="tokenizer.model"):
        convert(tmp_path, tmp_path / "x.gguf")
    (tmp_path / "tokenizer.model").unlink()
    write_safetensors(tmp_path / "model.safetensors",
                      {"model.mystery.weight": np.ones(8, np.float32)})
    with pytest.raises(ConvertError, match="model.mystery.weight"):
        convert(tmp_path, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()
    write_safetensors(tmp_path / "model.safetensors", {"model.norm.weight": np.ones(8, "<f4")})
    (tmp_path / "tokenizer.json").write_text(json.dumps(
        {"model": {"vocab": {"a": 0}, "merges": []}}), "utf-8")
    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 1,
         "vocab_size": 10 ** 12}), "utf-8")
    with pytest.raises(ConvertError, match="vocab_size"):
        convert(tmp_path, tmp_path / "x.gguf")


def _hf_llama_logits(w: dict[str, np.ndarray], ids: list[int], heads: int, kv: int,
                     eps: float = 1e-6, theta: float = 10000.0) -> np.ndarray:
    """Hugging Face's Llama in float64 on the checkpoint's own (unpermuted) weights:
    rotate-half RoPE, grouped-query causal attention, SwiGLU."""
    g = {k: v.astype(np.float64) for k, v in w.items()}

    def norm(x: np.ndarray, wt: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * wt

    def rope(x: np.ndarray) -> np.ndarray:  # x (T, H, d)
        d = x.shape[-1]
        inv = theta ** (-np.arange(0, d, 2) / d)
        ang = np.arange(len(x))[:, None] * inv[None]              # (T, d/2)
        cos = np.cos(np.concatenate([ang, ang], -1))[:, None]
        sin = np.sin(np.concatenate([ang, ang], -1))[:, None]
        rot = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1)
        return x * cos + rot * sin

    x, n = g["model.embed_tokens.weight"][ids], len(ids)
    for i in range(2):
        p = f"model.layers.{i}."
        h = norm(x, g[p + "input_layernorm.weight"])
        q = (h @ g[p + "self_attn.q_proj.weight"].T).reshape(n, heads, -1)
        k = (h @ g[p + "self_attn.k_proj.weight"].T).reshape(n, kv, -1)
        v = (h @ g[p + "self_attn.v_proj.weight"].T).reshape(n, kv, -1)
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, heads // kv, 1), np.repeat(v, heads // kv, 1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(q.shape[-1])
        s += np.triu(np.full((n, n), -np.inf), 1)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", a, v).reshape(n, -1)
        x = x + o @ g[p + "self_attn.o_proj.weight"].T
        h = norm(x, g[p + "post_attention_layernorm.weight"])
        gate, up = h @ g[p + "mlp.gate_proj.weight"].T, h @ g[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ g[p + "mlp.down_proj.weight"].T
    return norm(x, g["model.norm.weight"]) @ g["lm_head.weight"].T


def test_converted_llama_runs_like_hugging_face(tmp_path: Path) -> None:
    """The permuted file through gguflm's llama (NORM RoPE) gives Hugging Face's logits."""
    vocab_file = REF / "vocab" / "ggml-vocab-llama-bpe.gguf"
    if not vocab_file.is_file():
        pytest.skip(f"{vocab_file} not found")
    from gguflm import load_model

    n_vocab = len(tokenizer_json(vocab_file, tmp_path)["tokenizer.ggml.tokens"])
    w = random_decoder(tmp_path, "LlamaForCausalLM", n_vocab)
    w = {k: (v * 0.1 if v.ndim == 2 else 1 + 0.1 * v) for k, v in w.items()}  # tame scales
    write_safetensors(tmp_path / "model.safetensors", w)
    model = load_model(convert(tmp_path, tmp_path / "llama.gguf", "f32"))
    model.kv_type = "f32"
    ids = [128000, 791, 4062, 14198, 39935, 35308, 927, 279]
    got = model.logits(ids)
    want = _hf_llama_logits(w, ids, heads=4, kv=2)
    assert np.abs(got - want).max() < 1e-3 * max(1.0, np.abs(want).max())
