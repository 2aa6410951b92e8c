"""Fuzzing ``gguflm.convert.convert`` (short and deterministic for CI; long on request).

Mutations of the tiny valid checkpoint of ``test_hostile_convert``: random JSON values
(integers of any size, floats with NaN, inf and 1e300, strings with lone surrogates and
control characters, lists, objects, null, bools) set into or deleted from the keys the
converter reads in ``config.json`` (every ``CONFIG_KEYS`` entry, RoPE objects, each
architecture), the fields of ``tokenizer.json`` and ``tokenizer_config.json``, and the
entries of the safetensors header (dtype, shape, data_offsets, whole entries), under each
``--outtype``. Each conversion must either write a file that opens, or raise a GGUFError
(ConvertError included) and leave nothing behind: no output, no temporary file. Nothing
else may escape, and each example must finish within 5 s.

    GGUFLM_FUZZ_SECONDS=600 /usr/bin/time -v python -m pytest tests/hostile/test_fuzz_convert.py \\
        -k long -s

runs fresh random examples for that long (in batches of 200) and prints how many ran, the
outcomes and the slowest; ``/usr/bin/time -v`` gives the process's maximum RSS.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gguflm import gguf
from gguflm.convert import REGISTRY, convert
from gguflm.convert.params import CONFIG_KEYS
from gguflm.convert.pretok_hashes import PRE_BY_HASH
from gguflm.gguf.errors import GGUFError
from test_hostile_convert import (
    ARCH_KEYS,
    TINY_VOCAB_HASH,
    safetensors_bytes,
    tokenizer,
    weights,
)

LONG_SECONDS = float(os.environ.get("GGUFLM_FUZZ_SECONDS") or 0)
EXAMPLE_SECONDS = 5.0
STATS: dict = {"examples": 0, "slowest": 0.0, "outcomes": collections.Counter()}

INTERESTING = [0, 1, -1, 2, 3, 4, 8, 255, 256, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40,
               2**48, 2**62, 2**63 - 1, 2**63, 2**64, 2**70, 10**30, -(2**63)]
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.sampled_from(INTERESTING),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e300, -1e300, 1e-300,
                                                                      3.5e38, 0.5, 1.0]),
    st.text(max_size=12), st.sampled_from(["\ud800", "a\udc80", "\x00", "F32", "BF16",
                                           "linear", "yarn", "<|endoftext|>", "A"]))
json_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                           max_leaves=10)
_rope = st.dictionaries(st.sampled_from(["rope_type", "type", "factor", "rope_theta",
                                         "original_max_position_embeddings", "mrope_section",
                                         "partial_rotary_factor", "full_attention",
                                         "sliding_attention"]), json_values, max_size=4)
DELETE = "<delete>"  # as a value: remove the key or field
_read_by_llama = sorted({*ARCH_KEYS, "head_dim", "n_heads", "n_kv_heads", "rope_scaling",
                         "rope_parameters", "text_config", "_name_or_path"})
# the keys the base's converter reads four times as often as the others
_config_ops = st.lists(st.tuples(
    st.sampled_from(_read_by_llama * 4 + sorted(CONFIG_KEYS)),
    st.one_of(st.integers(-3, 9), st.sampled_from(INTERESTING), json_values, _rope,
              st.just(DELETE))), min_size=1, max_size=3)
_architectures = st.sampled_from(["LlamaForCausalLM"] * 4 + sorted(REGISTRY))
TOKENIZER_FIELDS = ["model", "model.vocab", "model.merges", "model.merges.0", "added_tokens",
                    "added_tokens.0", "added_tokens.0.id", "added_tokens.0.content",
                    "added_tokens.0.special", "normalizer", "normalizer.type",
                    "normalizer.lowercase", "normalizer.normalizers", "post_processor",
                    "post_processor.type", "post_processor.single", "post_processor.pair",
                    "post_processor.processors", "post_processor.cls", "post_processor.sep"]
_post_processors = st.fixed_dictionaries({
    "type": st.sampled_from(["TemplateProcessing", "RobertaProcessing", "ByteLevel",
                             "Sequence"]),
    "single": st.lists(st.sampled_from([{"SpecialToken": {"id": "<|endoftext|>"}},
                                        {"Sequence": {"id": "A"}}, {"Sequence": {"id": "B"}},
                                        {"SpecialToken": {"id": "x"}}]), max_size=4),
    "pair": st.lists(st.sampled_from([{"SpecialToken": {"id": "<|endoftext|>"}},
                                      {"Sequence": {"id": "A"}}, {"Sequence": {"id": "B"}}]),
                     max_size=5),
    "cls": st.lists(json_values, max_size=2)})
_tokenizer_ops = st.lists(st.one_of(
    st.tuples(st.sampled_from(TOKENIZER_FIELDS), json_values),
    st.tuples(st.sampled_from(TOKENIZER_FIELDS), st.just(DELETE)),
    st.tuples(st.just("post_processor"), _post_processors),
    st.tuples(st.just("added_tokens"), st.lists(st.fixed_dictionaries(
        {"id": st.sampled_from(INTERESTING + [257]), "content": st.text(max_size=4),
         "special": st.booleans()}), max_size=3)),
), max_size=2)
_tokenizer_config = st.dictionaries(st.sampled_from(
    ["chat_template", "add_bos_token", "add_eos_token", "bos_token", "eos_token", "cls_token",
     "sep_token", "unk_token"]), json_values | st.sampled_from(["<|endoftext|>", True]),
    max_size=3)
_header_ops = st.lists(st.tuples(
    st.sampled_from(["model.norm.weight", "model.layers.0.self_attn.q_proj.weight",
                     "model.embed_tokens.weight", "lm_head.weight"]),
    st.sampled_from(["dtype", "shape", "data_offsets", "entry", "rename"]),
    json_values | st.lists(st.sampled_from(INTERESTING), max_size=3)
    | st.sampled_from(["F16", "BF16", "F64", "I8", "U8", "BOOL", "I64", DELETE])),
    max_size=2)


def _set(doc: dict, path: str, value: object) -> None:
    """Set the dotted field ``path`` of ``doc`` (as far as the structure allows)."""
    *parents, last = path.split(".")
    node: object = doc
    for name in parents:
        if isinstance(node, list) and name.isdigit() and int(name) < len(node):
            node = node[int(name)]
        elif isinstance(node, dict):
            node = node.setdefault(name, {})
        else:
            return
    if isinstance(node, list) and last.isdigit() and int(last) < len(node):
        if value == DELETE:
            del node[int(last)]
        else:
            node[int(last)] = value
    elif isinstance(node, dict):
        if value == DELETE:
            node.pop(last, None)
        else:
            node[last] = value


def _header(ops: list[tuple]) -> dict:
    header, _ = weights()
    for name, field, value in ops:
        if field == "entry":
            header[name] = value
        elif field == "rename":
            header[str(value)] = header.pop(name, None)
        elif isinstance(header.get(name), dict) and value == DELETE:
            header[name].pop(field, None)
        elif isinstance(header.get(name), dict):
            header[name][field] = value
    return header


def _write(folder: Path, config: dict, tj: dict, tc: dict, header: dict) -> None:
    folder.mkdir()
    _, data = weights()
    for name, doc in (("config.json", config), ("tokenizer.json", tj),
                      ("tokenizer_config.json", tc)):
        (folder / name).write_text(json.dumps(doc), "utf-8")
    (folder / "model.safetensors").write_bytes(safetensors_bytes(header, data))


def check(config_ops: list[tuple], tokenizer_ops: list[tuple], tc: dict,
          header_ops: list[tuple], outtype: str, arch: str = "LlamaForCausalLM") -> str:
    """Convert the mutated checkpoint; the outcome's name. Asserts the contract."""
    config = {**ARCH_KEYS, "architectures": [arch]}
    for key, value in config_ops:
        if value == DELETE:
            config.pop(key, None)
        else:
            config[key] = value
    tj = tokenizer()
    for path, value in tokenizer_ops:
        _set(tj, path, value)
    work = Path(tempfile.mkdtemp(prefix="fuzzconvert"))
    try:
        _write(work / "ckpt", config, tj, tc, _header(header_ops))
        out = work / "out" / "model.gguf"
        out.parent.mkdir()
        start = time.perf_counter()
        try:
            with mock.patch.dict(PRE_BY_HASH, {TINY_VOCAB_HASH: "gpt-2"}):
                convert(work / "ckpt", out, outtype)
            outcome = "ok"
        except GGUFError as e:
            outcome = type(e).__name__
        elapsed = time.perf_counter() - start
        left = sorted(p.name for p in out.parent.iterdir())
        if outcome == "ok":
            assert left == ["model.gguf"], left
            with gguf.open(out) as f:
                assert f.tensors
        else:
            assert left == [], left  # no partial output, no temporary file
        assert elapsed < EXAMPLE_SECONDS, f"{elapsed:.1f} s"
        STATS["examples"] += 1
        STATS["slowest"] = max(STATS["slowest"], elapsed)
        STATS["outcomes"][outcome] += 1
        return outcome
    finally:
        shutil.rmtree(work, ignore_errors=True)


_SETTINGS = dict(deadline=int(EXAMPLE_SECONDS * 1000), database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
_outtypes = st.sampled_from(["auto", "f32", "f16", "bf16", "q8_0"])


@settings(max_examples=80, derandomize=True, **_SETTINGS)
@given(config_ops=_config_ops, outtype=_outtypes, arch=_architectures)
def test_fuzz_config(config_ops: list[tuple], outtype: str, arch: str) -> None:
    check(config_ops, [], {}, [], outtype, arch)


@settings(max_examples=60, derandomize=True, **_SETTINGS)
@given(tokenizer_ops=_tokenizer_ops, tc=_tokenizer_config)
def test_fuzz_tokenizer(tokenizer_ops: list[tuple], tc: dict) -> None:
    check([], tokenizer_ops, tc, [], "f16")


@settings(max_examples=60, derandomize=True, **_SETTINGS)
@given(header_ops=_header_ops, outtype=_outtypes)
def test_fuzz_safetensors_header(header_ops: list[tuple], outtype: str) -> None:
    check([], [], {}, header_ops, outtype)


def test_unmutated_base_converts() -> None:
    for outtype in ("auto", "f32", "f16", "bf16", "q8_0"):
        assert check([], [], {}, [], outtype) == "ok"


@settings(max_examples=200, derandomize=False, **_SETTINGS)
@given(config_ops=st.just([]) | _config_ops,
       tokenizer_ops=_tokenizer_ops, tc=_tokenizer_config, header_ops=_header_ops,
       outtype=_outtypes, arch=_architectures)
def _fuzz_everything(config_ops: list[tuple], tokenizer_ops: list[tuple], tc: dict,
                     header_ops: list[tuple], outtype: str, arch: str) -> None:
    check(config_ops, tokenizer_ops, tc, header_ops, outtype, arch)


@pytest.mark.skipif(not LONG_SECONDS, reason="set GGUFLM_FUZZ_SECONDS for the long run")
def test_fuzz_long() -> None:
    """Fresh random batches of every mutation at once until GGUFLM_FUZZ_SECONDS pass."""
    end = time.monotonic() + LONG_SECONDS
    batches = 0
    while time.monotonic() < end:
        _fuzz_everything()
        batches += 1
    print(f"\nconvert fuzz: {STATS['examples']} examples in {batches} batches, slowest "
          f"{STATS['slowest']:.2f} s, outcomes {dict(STATS['outcomes'])}")
