"""The ``bert`` encoder: a tiny random file against an independent float64 forward, batch
company, and the real all-MiniLM-L6-v2 (``gguflm pull all-minilm-l6-v2``) against
sentence-transformers' vectors through ``/v1/embeddings`` with the official openai client;
generation routes refuse an encoder."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import numpy as np
import pytest

from gguflm.api import LLM, InvalidRequestError
from gguflm.cli import main
from gguflm.gguf.types import ArrayType, ValueType
from gguflm.gguf.writer import GGUFWriter

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "▁the", "▁cat", "▁sat", "▁on", "▁mat",
         "▁a", "▁dog", "s", "▁.", "▁big", "▁red"]
D, HEADS, FF, LAYERS, CTX = 32, 4, 48, 2, 64


def _tiny_bert(path: Path, pooling: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    t: dict[str, np.ndarray] = {
        "token_embd.weight": rng.standard_normal((len(WORDS), D)),
        "position_embd.weight": rng.standard_normal((CTX, D)) * 0.3,
        "token_types.weight": rng.standard_normal((2, D)) * 0.3,
        "token_embd_norm.weight": 1 + 0.1 * rng.standard_normal(D),
        "token_embd_norm.bias": 0.1 * rng.standard_normal(D)}
    for i in range(LAYERS):
        for name, shape in (("attn_q", (D, D)), ("attn_k", (D, D)), ("attn_v", (D, D)),
                            ("attn_output", (D, D)), ("ffn_up", (FF, D)),
                            ("ffn_down", (D, FF))):
            t[f"blk.{i}.{name}.weight"] = rng.standard_normal(shape) / math.sqrt(shape[1])
            t[f"blk.{i}.{name}.bias"] = 0.1 * rng.standard_normal(shape[0])
        for name in ("attn_output_norm", "layer_output_norm"):
            t[f"blk.{i}.{name}.weight"] = 1 + 0.1 * rng.standard_normal(D)
            t[f"blk.{i}.{name}.bias"] = 0.1 * rng.standard_normal(D)
    t = {k: v.astype(np.float32) for k, v in t.items()}
    w = GGUFWriter(path)
    u32 = ValueType.UINT32
    for key, value, vtype in (
            ("general.architecture", "bert", ValueType.STRING),
            ("bert.block_count", LAYERS, u32), ("bert.context_length", CTX, u32),
            ("bert.embedding_length", D, u32), ("bert.feed_forward_length", FF, u32),
            ("bert.attention.head_count", HEADS, u32),
            ("bert.attention.layer_norm_epsilon", 1e-12, ValueType.FLOAT32),
            ("bert.attention.causal", False, ValueType.BOOL),
            ("bert.pooling_type", pooling, u32),
            ("tokenizer.ggml.token_type_count", 2, u32),
            ("tokenizer.ggml.model", "bert", ValueType.STRING),
            ("tokenizer.ggml.tokens", WORDS, ArrayType(ValueType.STRING)),
            ("tokenizer.ggml.token_type", [3] * 5 + [1] * (len(WORDS) - 5),
             ArrayType(ValueType.INT32)),
            ("tokenizer.ggml.bos_token_id", 2, u32), ("tokenizer.ggml.seperator_token_id", 3,
                                                      u32),
            ("tokenizer.ggml.unknown_token_id", 1, u32),
            ("tokenizer.ggml.padding_token_id", 0, u32)):
        w.add(key, value, vtype)
    for name, arr in t.items():
        w.add_tensor(name, arr)
    w.write()
    return t


def _gelu_ggml(h: np.ndarray) -> np.ndarray:
    """GELU as ggml-cpu computes it: its input rounded to float16, the tanh form in float32
    rounded to float16 (its table); 0 below -10, identity above 10."""
    x = h.astype(np.float16).astype(np.float32)
    g = np.float32(0.5) * x * (1 + np.tanh(np.float32(math.sqrt(2 / math.pi))
                                           * x * (1 + np.float32(0.044715) * x * x)))
    g = g.astype(np.float16).astype(np.float64)
    return np.where(h <= -10, 0.0, np.where(h >= 10, h, g))


def _reference(t: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """BERT in float64, written from the paper's description (GELU as ggml's)."""
    g = {k: v.astype(np.float64) for k, v in t.items()}

    def ln(x: np.ndarray, p: str) -> np.ndarray:
        x = x - x.mean(-1, keepdims=True)
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-12) * g[p + ".weight"] + \
            g[p + ".bias"]

    def lin(x: np.ndarray, p: str) -> np.ndarray:
        return x @ g[p + ".weight"].T + g[p + ".bias"]

    n = len(ids)
    x = g["token_embd.weight"][ids] + g["position_embd.weight"][:n] + g["token_types.weight"][0]
    x = ln(x, "token_embd_norm")
    dh = D // HEADS
    for i in range(LAYERS):
        b = f"blk.{i}."
        q, k, v = (lin(x, b + n_).reshape(n, HEADS, dh).transpose(1, 0, 2)
                   for n_ in ("attn_q", "attn_k", "attn_v"))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(dh)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        a = (p @ v).transpose(1, 0, 2).reshape(n, D)
        x = ln(x + lin(a, b + "attn_output"), b + "attn_output_norm")
        h = lin(x, b + "ffn_up")
        x = ln(x + lin(_gelu_ggml(h), b + "ffn_down"), b + "layer_output_norm")
    return x


TEXTS = ["the cat sat on the mat.", "a big red dog", "cats", "the the the the dog sat",
         "a mat"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("bert") / "tiny-bert.gguf"
    return path, _tiny_bert(path)


def test_tiny_bert_matches_reference(tiny: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, tensors = tiny
    llm = LLM(path, parallel=2)
    try:
        assert llm.model.is_encoder and "model/encoder.py" in repr(llm.model)
        ids = [llm.tokenize(t) for t in TEXTS]
        assert ids[0][0] == 2 and ids[0][-1] == 3  # [CLS] ... [SEP]
        hidden = llm.model.embed_batch(ids)
        for h, i in zip(hidden, ids, strict=True):
            assert np.abs(h - _reference(tensors, i)).max() < 2e-4
        mean = llm.embed(TEXTS[0], normalize=False)
        want = _reference(tensors, ids[0]).mean(0)
        assert np.abs(np.asarray(mean) - want).max() < 2e-4
        cls = llm.embed(TEXTS[0], pooling="cls")
        assert np.abs(np.asarray(cls) - want_cls(tensors, ids[0])).max() < 2e-4
    finally:
        llm.close()


def want_cls(tensors: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    v = _reference(tensors, ids)[0]
    return v / np.linalg.norm(v)


def test_a_vector_does_not_depend_on_its_batch(tiny: tuple[Path, dict]) -> None:
    llm = LLM(tiny[0])
    try:
        together = llm.embed(TEXTS)
        reordered = llm.embed(TEXTS[::-1] + TEXTS[:2])
        for i, text in enumerate(TEXTS):
            alone = llm.embed(text)
            assert np.array_equal(np.asarray(alone, np.float32),
                                  np.asarray(together[i], np.float32))
            assert np.array_equal(np.asarray(alone, np.float32),
                                  np.asarray(reordered[len(TEXTS) - 1 - i], np.float32))
    finally:
        llm.close()


def test_encoder_refuses_generation_and_long_inputs(tiny: tuple[Path, dict]) -> None:
    llm = LLM(tiny[0])
    try:
        for call in (lambda: llm.generate("the cat"),
                     lambda: llm.chat([{"role": "user", "content": "hi"}]),
                     lambda: llm.submit([2, 5, 3])):
            with pytest.raises(InvalidRequestError, match="embedding model"):
                call()
        with pytest.raises(InvalidRequestError, match="positions"):
            llm.embed("the " * (CTX + 5))
        with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
            llm.embed([[2, 999, 3]])
    finally:
        llm.close()


# --- the real model -------------------------------------------------------------------------

def _cos(a: object, b: object) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_minilm_openai_client_matches_sentence_transformers(minilm_path: Path,
                                                             reference: Path) -> None:
    openai = pytest.importorskip("openai", reason="the openai client is a test dependency")
    import http.client

    from gguflm.server import make_server

    dev = json.loads((reference / "minilm" / "sentence-transformers-dev.json").read_text())
    llm = LLM(minilm_path, parallel=2)
    server = make_server(llm, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        r = client.embeddings.create(model="all-minilm-l6-v2", input=dev["texts"])
        cos = [_cos(d.embedding, e) for d, e in zip(r.data, dev["embeddings"], strict=True)]
        print(f"all-MiniLM-L6-v2 F16 vs sentence-transformers: min cosine {min(cos):.7f}")
        assert min(cos) >= 0.99999
        single = client.embeddings.create(model="x", input=dev["texts"][5])
        assert np.array_equal(np.asarray(single.data[0].embedding, np.float32),
                              np.asarray(r.data[5].embedding, np.float32))
        with pytest.raises(openai.BadRequestError, match="embedding model"):
            client.completions.create(model="x", prompt="hello", max_tokens=4)
        with pytest.raises(openai.BadRequestError, match="embedding model"):
            client.chat.completions.create(model="x", messages=[{"role": "user",
                                                                 "content": "hi"}])
        host, port = server.server_address
        conn = http.client.HTTPConnection(host, port, timeout=60)
        for path in ("/health", "/v1/models", "/slots"):
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200, path
        conn.close()
    finally:
        server.shutdown()
        server.server_close()
        llm.close()


def test_embed_and_run_commands(minilm_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["embed", str(minilm_path), "-p", "A cat.", "-p", "A kitten."]) == 0
    out, err = capsys.readouterr()
    assert "cosine similarity matrix" in out and "model/encoder.py" in err
    assert main(["run", str(minilm_path), "-p", "hello", "-n", "4"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "embedding model" in err[0]
    assert main(["chat", str(minilm_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "embedding model" in err[0]
    assert main(["inspect", str(minilm_path)]) == 0
    out = capsys.readouterr().out
    assert "model/encoder.py" in out and "KV cache" not in out


# --- nomic-bert: a random NomicBertModel checkpoint, converted, against float64 -------------

def test_nomic_bert_converted_runs_like_its_reference(tmp_path: Path) -> None:
    import shutil

    from gguflm.convert import convert
    from gguflm.hub import checkpoint_dir
    from test_convert import write_safetensors

    source = checkpoint_dir("all-minilm-l6-v2")
    if not (source / "tokenizer.json").is_file():
        pytest.skip(f"no WordPiece tokenizer at {source}: `gguflm pull all-minilm-l6-v2`")
    for name in ("tokenizer.json", "tokenizer_config.json", "modules.json"):
        shutil.copy(source / name, tmp_path / name)
    shutil.copytree(source / "1_Pooling", tmp_path / "1_Pooling")
    rng = np.random.default_rng(2)
    d, ff, n_vocab = 32, 48, 30522

    def r(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = {"embeddings.word_embeddings.weight": r(n_vocab, d),
         "embeddings.token_type_embeddings.weight": r(2, d, scale=0.3),
         "emb_ln.weight": 1 + r(d, scale=0.1), "emb_ln.bias": r(d, scale=0.1)}
    for i in range(2):
        p = f"encoder.layers.{i}."
        w |= {p + "attn.Wqkv.weight": r(3 * d, d, scale=d ** -0.5),
              p + "attn.out_proj.weight": r(d, d, scale=d ** -0.5),
              p + "mlp.fc11.weight": r(ff, d, scale=d ** -0.5),
              p + "mlp.fc12.weight": r(ff, d, scale=d ** -0.5),
              p + "mlp.fc2.weight": r(d, ff, scale=ff ** -0.5)}
        for n in ("norm1", "norm2"):
            w |= {p + n + ".weight": 1 + r(d, scale=0.1), p + n + ".bias": r(d, scale=0.1)}
    write_safetensors(tmp_path / "model.safetensors", w)
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["NomicBertModel"], "n_embd": d, "n_head": HEADS, "n_inner": ff,
        "n_layer": 2, "n_positions": 2048, "max_trained_positions": 2048,
        "rotary_emb_base": 1000, "type_vocab_size": 2, "layer_norm_epsilon": 1e-12,
        "vocab_size": n_vocab, "activation_function": "swiglu", "causal": False,
        "qkv_proj_bias": False, "mlp_fc1_bias": False, "mlp_fc2_bias": False,
        "prenorm": False, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
        "rotary_emb_scale_base": None}), "utf-8")
    path = convert(tmp_path, tmp_path / "nomic.gguf", "f32")
    llm = LLM(path)
    try:
        assert llm.model.config.arch == "nomic-bert" and llm.model.config.n_ctx_train == 512
        for text in TEXTS[:3]:
            ids = llm.tokenize(text)
            want = _nomic_reference(w, ids).mean(0)
            assert np.abs(np.asarray(llm.embed(text, normalize=False)) - want).max() < 2e-4
    finally:
        llm.close()


def _nomic_reference(w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """nomic-bert in float64: NEOX (rotate-half) RoPE, SwiGLU down(silu(fc12) * fc11)."""
    g = {k: v.astype(np.float64) for k, v in w.items()}

    def ln(x: np.ndarray, p: str) -> np.ndarray:
        x = x - x.mean(-1, keepdims=True)
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-12) * g[p + ".weight"] + \
            g[p + ".bias"]

    def rope(x: np.ndarray) -> np.ndarray:  # (H, T, dh)
        dh = x.shape[-1]
        ang = np.arange(x.shape[1])[:, None] * 1000.0 ** (-np.arange(0, dh, 2) / dh)
        cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
        return x * cos + np.concatenate([-x[..., dh // 2:], x[..., :dh // 2]], -1) * sin

    n, d = len(ids), 32
    dh = d // HEADS
    x = ln(g["embeddings.word_embeddings.weight"][ids]
           + g["embeddings.token_type_embeddings.weight"][0], "emb_ln")
    for i in range(2):
        p = f"encoder.layers.{i}."
        q, k, v = (y.reshape(n, HEADS, dh).transpose(1, 0, 2)
                   for y in np.split(x @ g[p + "attn.Wqkv.weight"].T, 3, axis=1))
        q, k = rope(q), rope(k)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(dh)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = (a @ v).transpose(1, 0, 2).reshape(n, d)
        x = ln(x + o @ g[p + "attn.out_proj.weight"].T, p + "norm1")
        gate, up = x @ g[p + "mlp.fc12.weight"].T, x @ g[p + "mlp.fc11.weight"].T
        x = ln(x + (gate / (1 + np.exp(-gate)) * up) @ g[p + "mlp.fc2.weight"].T, p + "norm2")
    return x
