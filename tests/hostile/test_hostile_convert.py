"""``gguflm convert`` on hostile checkpoints: one ``error:`` line naming the file and the
key or tensor, exit status 1, no traceback, no output and no temporary file left, and the
checkpoint never overwritten.

The base is a tiny valid Llama checkpoint (one layer, hidden size 8, a byte-level BPE
vocabulary of the 256 bytes, one merge and one special token) that converts in a few
milliseconds. Its pre-tokenizer hash is not in llama.cpp's table (no real tokenizer has
this vocabulary), so the tests add it there (``known_tiny_vocab``): only that lookup is
bypassed. Each case changes one value of one file and runs the real command in-process
(``gguflm.cli.main``; a few run it as a subprocess too).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gguflm.cli import main
from gguflm.convert.pretok_hashes import CHECK_TEXT, PRE_BY_HASH

ARCH_KEYS = {"architectures": ["LlamaForCausalLM"], "hidden_size": 8,
             "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 1,
             "intermediate_size": 16, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
             "rope_theta": 10000.0, "vocab_size": 258}
SHAPES = {"model.embed_tokens.weight": (258, 8), "model.norm.weight": (8,),
          "lm_head.weight": (258, 8), "model.layers.0.input_layernorm.weight": (8,),
          "model.layers.0.post_attention_layernorm.weight": (8,),
          "model.layers.0.self_attn.q_proj.weight": (8, 8),
          "model.layers.0.self_attn.k_proj.weight": (4, 8),
          "model.layers.0.self_attn.v_proj.weight": (4, 8),
          "model.layers.0.self_attn.o_proj.weight": (8, 8),
          "model.layers.0.mlp.gate_proj.weight": (16, 8),
          "model.layers.0.mlp.up_proj.weight": (16, 8),
          "model.layers.0.mlp.down_proj.weight": (8, 16)}
# the ids of the check text: one token per byte (the one merge, of bytes 0 and 1, never
# applies), so every pre-tokenizer gives the same ids
TINY_VOCAB_HASH = hashlib.sha256(str(list(CHECK_TEXT.encode())).encode()).hexdigest()


def byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character table (byte-level BPE's alphabet)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
          *range(ord("®"), ord("ÿ") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def tokenizer() -> dict:
    bc = byte_chars()
    vocab = {bc[b]: b for b in range(256)}
    vocab[bc[0] + bc[1]] = 257
    return {"added_tokens": [{"id": 256, "content": "<|endoftext|>", "special": True}],
            "normalizer": None, "post_processor": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": vocab, "merges": [f"{bc[0]} {bc[1]}"]}}


def safetensors_bytes(header: dict, data: bytes) -> bytes:
    head = json.dumps(header).encode()
    return struct.pack("<Q", len(head)) + head + data


def weights() -> tuple[dict, bytes]:
    """The safetensors header and data of the tiny Llama (F32, seeded)."""
    rng = np.random.default_rng(0)
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, shape in SHAPES.items():
        raw = rng.standard_normal(shape).astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    return header, b"".join(blobs)


def write_checkpoint(folder: Path, config: dict | None = None, tj: dict | None = None,
                     header: dict | None = None) -> Path:
    """The tiny checkpoint in ``folder`` (any of its three JSON documents replaced)."""
    folder.mkdir(parents=True, exist_ok=True)
    base_header, data = weights()
    (folder / "config.json").write_text(json.dumps(config or ARCH_KEYS), "utf-8")
    (folder / "tokenizer.json").write_text(json.dumps(tj or tokenizer()), "utf-8")
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|endoftext|>", "add_bos_token": False}), "utf-8")
    (folder / "model.safetensors").write_bytes(safetensors_bytes(header or base_header, data))
    return folder


@pytest.fixture(autouse=True)
def known_tiny_vocab(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PRE_BY_HASH, TINY_VOCAB_HASH, "gpt-2")


def leftovers(folder: Path) -> list[str]:
    """Files a conversion left in ``folder`` beyond the checkpoint's own."""
    own = {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors",
           "model.safetensors.index.json"}
    return sorted(p.name for p in folder.iterdir() if p.name not in own)


def refused(capsys: pytest.CaptureFixture, folder: Path, *names: str,
            args: tuple[str, ...] = ()) -> str:
    """Run ``gguflm convert`` in-process; assert one error line naming ``names``, exit
    status 1, and nothing left behind. Returns the line."""
    out = folder / "out.gguf"
    status = main(["convert", str(folder), "--outfile", str(out), *args])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert status == 1, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for name in names:
        assert name in lines[0], (name, lines[0])
    assert "Traceback" not in err
    assert leftovers(folder) == [], leftovers(folder)
    return lines[0]


def test_the_base_converts(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = write_checkpoint(tmp_path / "ckpt")
    assert main(["convert", str(folder), "--outfile", str(tmp_path / "o.gguf")]) == 0
    from gguflm import gguf

    with gguf.open(tmp_path / "o.gguf") as f:
        assert f.metadata["llama.attention.head_count"] == 2
        assert f.metadata["tokenizer.ggml.pre"] == "gpt-2"
        assert len(f.tensors) == len(SHAPES)


# --- config.json -------------------------------------------------------------------------------

def _config(**changes: object) -> dict:
    """The base config with keys changed (a value of DELETE removes the key)."""
    config = {**ARCH_KEYS, **changes}
    return {k: v for k, v in config.items() if v is not DELETE}


DELETE = object()
NAN, INF = float("nan"), float("inf")
BAD_CONFIG = [  # (key as the error names it, the changes)
    ("num_attention_heads", {"num_attention_heads": 0}),
    ("num_attention_heads", {"num_attention_heads": -2}),
    ("num_attention_heads", {"num_attention_heads": DELETE}),
    ("num_attention_heads", {"num_attention_heads": "2"}),
    ("num_attention_heads", {"num_attention_heads": 2.0}),
    ("num_attention_heads", {"num_attention_heads": True}),
    ("num_attention_heads", {"num_attention_heads": [2]}),
    ("num_attention_heads", {"num_attention_heads": 2**64}),
    ("num_attention_heads", {"num_attention_heads": 3}),  # 8 does not split into 3 heads
    ("num_key_value_heads", {"num_key_value_heads": 0}),
    ("num_key_value_heads", {"num_key_value_heads": 3}),
    ("num_key_value_heads", {"num_key_value_heads": {"a": 1}}),
    ("hidden_size", {"hidden_size": DELETE}),
    ("hidden_size", {"hidden_size": "64"}),
    ("hidden_size", {"hidden_size": 2**32}),
    ("hidden_size", {"hidden_size": None, "n_embd": None, "dim": None}),
    ("n_embd", {"hidden_size": DELETE, "n_embd": -1}),
    ("intermediate_size", {"intermediate_size": 0}),
    ("max_position_embeddings", {"max_position_embeddings": 1e9}),
    ("max_position_embeddings", {"max_position_embeddings": -1}),
    ("num_hidden_layers", {"num_hidden_layers": 1_000_000_000}),
    ("num_hidden_layers", {"num_hidden_layers": DELETE}),
    ("num_hidden_layers", {"num_hidden_layers": 0}),
    ("num_hidden_layers", {"num_hidden_layers": "1"}),
    ("vocab_size", {"vocab_size": -1}),
    ("vocab_size", {"vocab_size": 10**12}),
    ("vocab_size", {"vocab_size": "258"}),
    ("vocab_size", {"vocab_size": DELETE}),
    ("rms_norm_eps", {"rms_norm_eps": 1e300}),
    ("rms_norm_eps", {"rms_norm_eps": NAN}),
    ("rms_norm_eps", {"rms_norm_eps": INF}),
    ("rms_norm_eps", {"rms_norm_eps": -1e-5}),
    ("rms_norm_eps", {"rms_norm_eps": "1e-5"}),
    ("rms_norm_eps", {"rms_norm_eps": 10**400 // 10**390 * 10**300}),
    ("layer_norm_eps", {"layer_norm_eps": -INF}),
    ("rope_theta", {"rope_theta": 0}),
    ("rope_theta", {"rope_theta": 1e39}),
    ("rope_theta", {"rope_theta": [10000]}),
    ("head_dim", {"head_dim": 0}),
    ("head_dim", {"head_dim": 4.5}),
    ("rope_scaling", {"rope_scaling": [1, 2]}),
    ("rope_scaling", {"rope_scaling": "linear"}),
    ("rope_scaling", {"rope_scaling": 8}),
    ("rope_scaling.factor", {"rope_scaling": {"rope_type": "linear", "factor": "8"}}),
    ("rope_scaling.factor", {"rope_scaling": {"rope_type": "linear", "factor": 1e300}}),
    ("rope_scaling.factor", {"rope_scaling": {"rope_type": "yarn", "factor": -2.0}}),
    ("rope_scaling.rope_type", {"rope_scaling": {"rope_type": 5, "factor": 2.0}}),
    ("rope_scaling.original_max_position_embeddings",
     {"rope_scaling": {"rope_type": "yarn", "factor": 2.0,
                       "original_max_position_embeddings": -5}}),
    ("rope_scaling.mrope_section", {"rope_scaling": {"mrope_section": 5}}),
    ("rope_scaling.mrope_section[1]", {"rope_scaling": {"mrope_section": [16, "x"]}}),
    ("rope_scaling.mrope_section", {"rope_scaling": {"mrope_section": [1, 2, 3, 4, 5]}}),
    ("rope_scaling.mrope_section[0]", {"rope_scaling": {"mrope_section": [2**40]}}),
    ("rope_parameters.full_attention", {"rope_parameters": {"full_attention": 5}}),
    ("rope_parameters.full_attention.rope_theta",
     {"rope_parameters": {"full_attention": {"rope_theta": "big"}}}),
    ("rope_parameters.sliding_attention",
     {"rope_parameters": {"sliding_attention": [1]}}),
    ("rope_parameters", {"rope_parameters": True}),
    ("partial_rotary_factor", {"partial_rotary_factor": 2.0}),
    ("num_experts", {"num_experts": -1}),
    ("num_experts_per_tok", {"num_experts_per_tok": 1.5}),
    ("is_causal", {"is_causal": "no"}),
    ("text_config", {"text_config": [1]}),
    ("text_config.hidden_size", {"text_config": {"hidden_size": 0}}),
    ("architectures", {"architectures": "LlamaForCausalLM"}),
    ("architectures", {"architectures": []}),
    ("architectures[0]", {"architectures": [5]}),
    ("architectures", {"architectures": DELETE}),
    ("_name_or_path", {"_name_or_path": 5}),
    ("_name_or_path", {"_name_or_path": "a\ud800b"}),
]


@pytest.mark.parametrize("key, changes", BAD_CONFIG,
                         ids=[f"{k}-{i}" for i, (k, _) in enumerate(BAD_CONFIG)])
def test_bad_config_value(tmp_path: Path, capsys: pytest.CaptureFixture, key: str,
                          changes: dict) -> None:
    folder = write_checkpoint(tmp_path, config=_config(**changes))
    line = refused(capsys, folder, "config.json", key)
    assert f"key '{key}" in line or f"/{key}" in line, line  # missing: all its spellings


def test_config_that_is_not_an_object(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = write_checkpoint(tmp_path)
    for text in ("[1, 2]", "5", "null", '"x"', "[" * 100_000, "1" * 5000, "{\"a\": NaN"):
        (folder / "config.json").write_text(text, "utf-8")
        refused(capsys, folder, "config.json")


NOMIC_SETTINGS = {"activation_function": "swiglu", "causal": False, "qkv_proj_bias": False,
                  "mlp_fc1_bias": False, "mlp_fc2_bias": False, "prenorm": False,
                  "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
                  "rotary_emb_scale_base": None, "n_positions": 2048}


@pytest.mark.parametrize("arch, changes, key", [
    ("Gemma3ForCausalLM", {"sliding_window": "32", "sliding_window_pattern": 6},
     "sliding_window"),
    ("Gemma3ForCausalLM", {"sliding_window_pattern": 6}, "sliding_window"),
    ("Gemma3ForCausalLM", {"final_logit_softcapping": INF, "sliding_window": 4},
     "final_logit_softcapping"),
    ("Gemma3ForCausalLM", {"rope_local_base_freq": -1, "sliding_window": 4},
     "rope_local_base_freq"),
    ("BertModel", {"type_vocab_size": -1}, "type_vocab_size"),
    ("BertModel", {"layer_norm_eps": 1e300}, "layer_norm_eps"),
    ("NomicBertModel", {"n_positions": "8192"}, "n_positions"),
    ("NomicBertModel", {"moe_every_n_layers": 2}, "moe_every_n_layers"),
    ("NomicBertModel", {"prenorm": True}, "prenorm"),
])
def test_bad_config_value_other_architectures(tmp_path: Path, capsys: pytest.CaptureFixture,
                                               arch: str, changes: dict, key: str) -> None:
    """Keys that only some converters read: refused there too (the tensors do not
    matter: the config is read first)."""
    if arch == "NomicBertModel":
        changes = {**NOMIC_SETTINGS, **changes}
    folder = write_checkpoint(tmp_path, config=_config(architectures=[arch], **changes),
                              header={"__metadata__": {}})  # no tensors to map
    refused(capsys, folder, "config.json", f"key '{key}'")


def test_permutation_that_cannot_split(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """hidden 8, 4 heads: fine for the config, but q_proj's 8 rows hold 4 heads of 2 rows,
    and K's 4 rows cannot be 4 key/value heads of pairs: named before anything is written."""
    folder = write_checkpoint(tmp_path, config=_config(num_attention_heads=4,
                                                       num_key_value_heads=4))
    line = refused(capsys, folder, "config.json", "key 'num_key_value_heads'",
                   "tensor 'model.layers.0.self_attn.k_proj.weight'")
    assert "4 heads of pairs" in line


# --- tokenizer.json and tokenizer_config.json ---------------------------------------------------

def _tokenizer(path: str, value: object) -> dict:
    """The base tokenizer.json with the dotted field ``path`` set to ``value``."""
    tj = tokenizer()
    *parents, last = path.split(".")
    node = tj
    for name in parents:
        node = node[int(name)] if isinstance(node, list) else node.setdefault(name, {})
    node[int(last) if isinstance(node, list) else last] = value
    return tj


BAD_TOKENIZER = [  # (field as the error names it, field set, value)
    ("post_processor.single", "post_processor.single", 5),
    ("post_processor.single", "post_processor.single", "abc"),
    ("post_processor.single[0]", "post_processor.single", [5]),
    ("post_processor.single[0].SpecialToken", "post_processor.single",
     [{"SpecialToken": "x"}, {"Sequence": {"id": "A"}}]),
    ("post_processor.single[1].Sequence.id", "post_processor.single",
     [{"SpecialToken": {"id": "<|endoftext|>"}}, {"Sequence": {"id": 1}}]),
    ("post_processor.pair", "post_processor.pair", {"a": 1}),
    ("post_processor.processors", "post_processor.processors", 5),
    ("post_processor.processors[0]", "post_processor.processors", [7]),
    ("post_processor.cls", "post_processor", {"type": "RobertaProcessing", "cls": {"a": 1}}),
    ("post_processor.cls[0]", "post_processor", {"type": "RobertaProcessing", "cls": [[1]]}),
    ("post_processor.type", "post_processor.type", 5),
    ("post_processor", "post_processor", [1]),
    ("added_tokens", "added_tokens", 5),
    ("added_tokens", "added_tokens", {"id": 3}),
    ("added_tokens[0]", "added_tokens", ["<s>"]),
    ("added_tokens[0].id", "added_tokens", [{"id": -1, "content": "x"}]),
    ("added_tokens[0].id", "added_tokens", [{"id": "1", "content": "x"}]),
    ("added_tokens[0].id", "added_tokens", [{"content": "x"}]),
    ("added_tokens[0].content", "added_tokens", [{"id": 1, "content": 5}]),
    ("added_tokens[0].content", "added_tokens", [{"id": 1, "content": "\ud800"}]),
    ("added_tokens[0].special", "added_tokens", [{"id": 1, "content": "x", "special": "y"}]),
    ("added_tokens", "added_tokens", [{"id": 2**40, "content": "x"}]),
    ("model", "model", [1]),
    ("model.vocab", "model.vocab", [["a", 0.0]]),
    ("model.vocab", "model.vocab", {}),
    ("model.vocab.a", "model.vocab", {"a": -1}),
    ("model.vocab.a", "model.vocab", {"a": 1.5}),
    ("model.vocab.a", "model.vocab", {"a": None}),
    ("model.vocab", "model.vocab", {"a": 0, "\ud800": 1}),
    ("model.vocab", "model.vocab", {"a": 10**6}),
    ("model.merges", "model.merges", "a b"),
    ("model.merges[0]", "model.merges", [5]),
    ("model.merges[0]", "model.merges", [["a", "b", "c"]]),
    ("model.merges[1]", "model.merges", ["a b", ["a", 5]]),
    ("normalizer", "normalizer", "lowercase"),
    ("normalizer.lowercase", "normalizer", {"type": "BertNormalizer", "lowercase": "yes"}),
    ("normalizer.normalizers", "normalizer", {"type": "Sequence", "normalizers": 5}),
    ("normalizer.normalizers[0].normalizers[0]", "normalizer",
     {"type": "Sequence", "normalizers": [{"type": "Sequence", "normalizers": [1]}]}),
    ("normalizer", "normalizer", json.loads('{"normalizers": [' * 200 + "]}" * 200)),
]


@pytest.mark.parametrize("key, field, value", BAD_TOKENIZER,
                         ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(BAD_TOKENIZER)])
def test_bad_tokenizer_field(tmp_path: Path, capsys: pytest.CaptureFixture, key: str,
                             field: str, value: object) -> None:
    folder = write_checkpoint(tmp_path, tj=_tokenizer(field, value))
    refused(capsys, folder, "tokenizer.json", key)


@pytest.mark.parametrize("text", ["[]", "5", "null", '{"model": 5}', "{" * 50_000])
def test_tokenizer_that_is_not_an_object(tmp_path: Path, capsys: pytest.CaptureFixture,
                                         text: str) -> None:
    folder = write_checkpoint(tmp_path)
    (folder / "tokenizer.json").write_text(text, "utf-8")
    refused(capsys, folder, "tokenizer.json")


@pytest.mark.parametrize("key, value", [
    ("chat_template", 5), ("chat_template", {"a": "b"}), ("add_bos_token", "yes"),
    ("add_eos_token", 1), ("bos_token", 5), ("bos_token", ["<s>"]),
    ("eos_token.content", {"content": 5}), ("unk_token", "\udc80"),
])
def test_bad_tokenizer_config_field(tmp_path: Path, capsys: pytest.CaptureFixture, key: str,
                                    value: object) -> None:
    folder = write_checkpoint(tmp_path)
    name = key.partition(".")[0]
    (folder / "tokenizer_config.json").write_text(json.dumps({name: value}), "utf-8")
    refused(capsys, folder, "tokenizer_config.json", f"key '{key}'")


def test_tokenizer_config_that_is_not_an_object(tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    folder = write_checkpoint(tmp_path)
    (folder / "tokenizer_config.json").write_text("[1]", "utf-8")
    refused(capsys, folder, "tokenizer_config.json")


# --- model.safetensors -------------------------------------------------------------------------

NORM = "model.norm.weight"
BAD_HEADER = [  # (what the error says, the norm's entry)
    ("dtype", {"dtype": ["F32"]}),
    ("dtype", {"dtype": {"F32": 1}}),
    ("dtype", {"dtype": None}),
    ("dtype", {"dtype": 5}),
    ("dtype", {"dtype": "F8_E4M3"}),
    ("2**40", {"shape": [0, 4611686018427387904], "data_offsets": [0, 0]}),
    ("2**40", {"shape": [0, 2**70], "data_offsets": [0, 0]}),
    ("2**48", {"shape": [0, 2**30, 2**30], "data_offsets": [0, 0]}),
    ("2**40", {"shape": [-1, -8]}),
    ("integers", {"shape": [8.0]}),
    ("integers", {"shape": [True] * 8}),
    ("integers", {"shape": "8"}),
    ("integers", {"shape": [[8]]}),
    ("dimensions", {"shape": [1] * 9}),
    ("dimensions", {"shape": [1] * 100_000}),
    ("data_offsets", {"data_offsets": [0.0, 32.0]}),
    ("data_offsets", {"data_offsets": [0]}),
    ("data_offsets", {"data_offsets": "0-32"}),
    ("data_offsets", {"data_offsets": [False, 32]}),
    ("outside", {"data_offsets": [-32, 0]}),
    ("outside", {"data_offsets": [0, 2**70]}),
    ("outside", {"data_offsets": [2**64, 2**64 + 32]}),
    ("needs", {"shape": [9]}),
    ("needs", {"shape": [2**40], "data_offsets": [0, 32]}),
    ("dimensions; ggml allows at most 4", {"shape": [1, 1, 1, 1, 8]}),
]


@pytest.mark.parametrize("says, entry", BAD_HEADER,
                         ids=[f"{s.split()[0]}-{i}" for i, (s, _) in enumerate(BAD_HEADER)])
def test_bad_safetensors_entry(tmp_path: Path, capsys: pytest.CaptureFixture, says: str,
                               entry: dict) -> None:
    header, data = weights()
    header[NORM] = {**header[NORM], **entry}
    folder = write_checkpoint(tmp_path, header=header)
    line = refused(capsys, folder, "model.safetensors", f"tensor '{NORM}'")
    assert says in line, line


@pytest.mark.parametrize("entry", [5, "x", None, [1, 2]])
def test_safetensors_entry_that_is_not_an_object(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                 entry: object) -> None:
    header, _ = weights()
    header[NORM] = entry
    refused(capsys, write_checkpoint(tmp_path, header=header), "model.safetensors", NORM)


def test_empty_tensor_of_huge_shape_is_refused_before_numpy_sees_it(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Zero elements pass the byte count; the bound on the other dimensions catches it."""
    header, data = weights()
    header["model.layers.0.mlp.up_proj.weight"] = {"dtype": "F32", "shape": [0, 2**41],
                                                   "data_offsets": [0, 0]}
    folder = write_checkpoint(tmp_path, header=header)
    refused(capsys, folder, "model.safetensors", "mlp.up_proj", "2**40")


def test_header_json_that_cannot_parse(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = write_checkpoint(tmp_path)
    for head in (b"[" * 100_000, b"1" * 5000, b"\xff\xfe", b"[1]", b'{"a": NaN'):
        (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(head)) + head)
        refused(capsys, folder, "model.safetensors")


# --- files that are not regular files ---------------------------------------------------------

def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _folder(path: Path) -> None:
    path.mkdir()


def _loop(path: Path) -> None:
    path.symlink_to(path.name)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "tokenizer.json",
                                  "tokenizer_config.json"])
@pytest.mark.parametrize("make, says", [(_fifo, "not a regular file: a FIFO"),
                                        (_dev_zero, "not a regular file: a character device"),
                                        (_folder, "not a regular file: a directory"),
                                        (_loop, "cannot read")])
def test_special_files_are_named_not_opened(tmp_path: Path, capsys: pytest.CaptureFixture,
                                            name: str, make: Callable[[Path], None],
                                            says: str) -> None:
    """A FIFO would block a reader forever: it is refused by what it is, without waiting."""
    folder = write_checkpoint(tmp_path)
    (folder / name).unlink()
    make(folder / name)
    line = refused(capsys, folder, name, says)
    assert "missing" not in line


def test_a_megabyte_tensor_name_is_shortened(tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    header, _ = weights()
    header["x" * 1_000_000] = header.pop(NORM)
    line = refused(capsys, write_checkpoint(tmp_path, header=header), "model.safetensors",
                   "cannot map it to a llama tensor")
    assert len(line) < 1000


def test_index_naming_a_bad_part(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = write_checkpoint(tmp_path)
    index = folder / "model.safetensors.index.json"
    for part in ("../x.safetensors", "", "..", "a\x00b", "/etc/passwd"):
        index.write_text(json.dumps({"weight_map": {NORM: part}}), "utf-8")
        refused(capsys, folder, "model.safetensors.index.json", "weight_map")
    for weight_map in (5, {NORM: 5}, [NORM]):
        index.write_text(json.dumps({"weight_map": weight_map}), "utf-8")
        refused(capsys, folder, "model.safetensors.index.json", "weight_map")
    index.unlink()


# --- the output is never one of the inputs ------------------------------------------------------

def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("spelling", [
    lambda ckpt, tmp: ckpt / "model.safetensors",
    lambda ckpt, tmp: Path(f"{ckpt}/./model.safetensors"),
    lambda ckpt, tmp: Path(f"{ckpt}/../{ckpt.name}/config.json"),
    lambda ckpt, tmp: ckpt / "tokenizer.json",
    lambda ckpt, tmp: ckpt / "tokenizer_config.json",
], ids=["part", "dot", "dotdot-config", "tokenizer", "tokenizer-config"])
def test_output_is_an_input_by_name(tmp_path: Path, capsys: pytest.CaptureFixture,
                                    spelling: Callable[[Path, Path], Path]) -> None:
    ckpt = write_checkpoint(tmp_path / "ckpt")
    before = _snapshot(ckpt)
    status = main(["convert", str(ckpt), "--outfile", str(spelling(ckpt, tmp_path))])
    err = capsys.readouterr().err
    assert status == 1 and err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert "refusing to overwrite" in err
    assert _snapshot(ckpt) == before


@pytest.mark.parametrize("link", ["symlink", "hardlink", "symlink-to-folder"])
def test_output_is_an_input_by_identity(tmp_path: Path, capsys: pytest.CaptureFixture,
                                        link: str) -> None:
    ckpt = write_checkpoint(tmp_path / "ckpt")
    before = _snapshot(ckpt)
    out = tmp_path / "out.gguf"
    if link == "symlink":
        out.symlink_to(ckpt / "model.safetensors")
    elif link == "hardlink":
        os.link(ckpt / "model.safetensors", out)
    else:
        (tmp_path / "alias").symlink_to(ckpt)
        out = tmp_path / "alias" / "model.safetensors"
    status = main(["convert", str(ckpt), "--outfile", str(out)])
    err = capsys.readouterr().err
    assert status == 1 and "refusing to overwrite" in err, err
    assert _snapshot(ckpt) == before
    assert {p.name for p in tmp_path.iterdir()} == \
        {"ckpt", "alias" if link == "symlink-to-folder" else "out.gguf"}


def test_default_output_name_that_links_to_an_input(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    """Without --outfile the name is llama.cpp's, in the folder: a link there by that name
    to a checkpoint file is refused too."""
    ckpt = write_checkpoint(tmp_path / "ckpt")
    assert main(["convert", str(ckpt)]) == 0
    made = next(ckpt.glob("*.gguf"))
    made.unlink()
    made.symlink_to("model.safetensors")
    before = _snapshot(ckpt)
    capsys.readouterr()
    assert main(["convert", str(ckpt)]) == 1
    assert "refusing to overwrite" in capsys.readouterr().err
    assert _snapshot(ckpt) == before


def test_a_hostile_name_or_path_makes_a_safe_default_name(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    ckpt = write_checkpoint(tmp_path / "ckpt", config=_config(_name_or_path="a\u0000b\\c\nd"))
    assert main(["convert", str(ckpt)]) == 0, capsys.readouterr().err
    (made,) = ckpt.glob("*.gguf")
    assert made.name.isprintable() and "\\" not in made.name, made.name


# --- failures while writing leave nothing ------------------------------------------------------

def test_a_failure_while_encoding_leaves_nothing(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The tensors are made while the file is written (one at a time): an error in the
    last one still leaves no output and no temporary file."""
    from gguflm.convert import ConvertError, convert, decoders

    ckpt = write_checkpoint(tmp_path / "ckpt")
    real = decoders.LlamaConverter.modify

    def failing(self: object, name: str, data: np.ndarray) -> np.ndarray:
        if name == "blk.0.ffn_down.weight":
            raise ConvertError("made to fail", tensor=name)
        return real(self, name, data)

    monkeypatch.setattr(decoders.LlamaConverter, "modify", failing)
    with pytest.raises(ConvertError, match="made to fail"):
        convert(ckpt, tmp_path / "out.gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert leftovers(ckpt) == []


def test_a_checkpoint_truncated_after_its_header_was_read(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """The file shrinks between the header check and the mapping of a tensor's bytes."""
    from gguflm.convert import safetensors

    ckpt = write_checkpoint(tmp_path / "ckpt")
    real = safetensors.STensor.load

    def shrink_then_load(self: safetensors.STensor) -> np.ndarray:
        os.truncate(self.path, 100)
        return real(self)

    monkeypatch.setattr(safetensors.STensor, "load", shrink_then_load)
    status = main(["convert", str(ckpt), "--outfile", str(tmp_path / "o.gguf")])
    err = capsys.readouterr().err
    assert status == 1 and "model.safetensors" in err and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


# --- the real command, as a process -----------------------------------------------------------

CLI_WITH_TINY_VOCAB = ("import sys; from gguflm.convert.pretok_hashes import PRE_BY_HASH; "
                       f"PRE_BY_HASH[{TINY_VOCAB_HASH!r}] = 'gpt-2'; "
                       "from gguflm.cli import main; sys.exit(main(sys.argv[1:]))")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CLI_WITH_TINY_VOCAB, "convert", *args],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("case", ["heads-zero", "post-processor", "dtype-list", "overwrite"])
def test_as_a_process(tmp_path: Path, case: str) -> None:
    """The brief's reproductions, through a real process: status 1, one line, no traceback."""
    ckpt = tmp_path / "ckpt"
    out = tmp_path / "out.gguf"
    if case == "heads-zero":  # the attacker's repro: a config and a lone norm weight
        ckpt.mkdir()
        (ckpt / "config.json").write_text(json.dumps(
            {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "vocab_size": 8,
             "hidden_size": 64, "num_attention_heads": 0}), "utf-8")
        (ckpt / "model.safetensors").write_bytes(safetensors_bytes(
            {NORM: {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}},
            np.ones(8, "<f4").tobytes()))
        names = ["config.json", "num_attention_heads"]
    elif case == "post-processor":
        write_checkpoint(ckpt, tj=_tokenizer("post_processor.single", 5))
        names = ["tokenizer.json", "post_processor.single"]
    elif case == "dtype-list":
        header, _ = weights()
        header[NORM]["dtype"] = ["F32"]
        write_checkpoint(ckpt, header=header)
        names = ["model.safetensors", NORM]
    else:
        write_checkpoint(ckpt)
        out = ckpt / "model.safetensors"
        names = ["refusing to overwrite"]
    before = _snapshot(ckpt)
    proc = _cli(str(ckpt), "--outfile", str(out))
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert all(name in lines[0] for name in names), lines[0]
    assert _snapshot(ckpt) == before
    assert not (tmp_path / "out.gguf").exists()


def test_process_converts_the_base(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path / "ckpt")
    proc = _cli(str(ckpt), "--outfile", str(tmp_path / "o.gguf"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "o.gguf").stat().st_size > 0


# --- the writer's own last line of defence -----------------------------------------------------

@pytest.mark.parametrize("value, vtype", [
    (1e300, "FLOAT32"), (10**400, "FLOAT64"), (10**400, "FLOAT32"), (-1, "UINT32"),
    (2**32, "UINT32"), ("a\ud800", "STRING"), (["a", "\udfff"], "ARRAY_STRING"),
    (np.array([1e300]), "ARRAY_FLOAT32"),
])
def test_writer_refuses_unpackable_values_when_added(tmp_path: Path, value: object,
                                                     vtype: str) -> None:
    """Values the encoder could not pack are refused by ``add`` with the key named, not by
    an OverflowError or UnicodeEncodeError halfway through writing."""
    from gguflm.gguf import ArrayType, GGUFWriter, ValueType
    from gguflm.gguf.errors import WriteError

    mtype = ArrayType(ValueType[vtype.removeprefix("ARRAY_")]) if vtype.startswith("ARRAY") \
        else ValueType[vtype]
    w = GGUFWriter(tmp_path / "w.gguf")
    with pytest.raises(WriteError, match="'k'"):
        w.add("k", value, mtype)
    for ok in (math.inf, math.nan, 3.4028234663852886e38):
        w.set("f", ok, ValueType.FLOAT32)
    w.write()
