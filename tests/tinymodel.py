"""Tiny random-weight models for any registered architecture, written by our GGUFWriter.

The tensors are not listed here: ``declared_tensors`` runs the architecture's own
``load_tensors`` against a recorder that notes every (name, shape) it asks for, so a new
architecture gets a tiny model (and the cached-vs-uncached and missing-tensor tests) with
no extra code. Only the metadata differs per architecture (``tiny_metadata`` overrides).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gguflm.gguf.types import GGMLType
from gguflm.gguf.writer import GGUFWriter
from gguflm.model import archs
from gguflm.model.config import ModelConfig
from gguflm.model.weights import Weights
from gguflm.quant.matrix import QMatrix


def tiny_metadata(arch: str, **overrides: Any) -> dict[str, Any]:
    """Small hyperparameters under ``{arch}.``: 2 layers, n_embd 64, 4 heads, 2 KV heads
    (grouped-query), FFN 96, vocab 96. Keyword overrides use the key's tail with ``__``
    for dots (``attention__head_count_kv=4``); None removes a key."""
    md: dict[str, Any] = {
        "general.architecture": arch,
        "general.name": f"tiny-random-{arch}",
        f"{arch}.context_length": 64,
        f"{arch}.embedding_length": 64,
        f"{arch}.block_count": 2,
        f"{arch}.feed_forward_length": 96,
        f"{arch}.attention.head_count": 4,
        f"{arch}.attention.head_count_kv": 2,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-5,
        f"{arch}.rope.freq_base": 10000.0,
        f"{arch}.vocab_size": 96,
    }
    for k, v in overrides.items():
        key = f"{arch}.{k.replace('__', '.')}"
        if v is None:
            md.pop(key, None)
        else:
            md[key] = v
    return md


class _Recorder(Weights):
    """Answers every request with zeros of its shape (None for optional tensors) and notes
    it."""

    def __init__(self, arch: str) -> None:
        self.arch = arch
        self.used = set()
        self.requests: dict[str, tuple[tuple[int, ...], bool]] = {}

    def has(self, name: str) -> bool:
        return False

    def get(self, name: str, shape: tuple[int, ...], *, optional: bool = False) -> Any:
        self.requests[name] = (tuple(shape), optional)
        if optional:
            return None
        zeros = np.zeros(shape, np.float32)  # the architecture builds its layer specs of them
        if len(shape) == 3:  # experts
            return tuple(QMatrix(GGMLType.F32, z, shape[1:], name) for z in zeros)
        return QMatrix(GGMLType.F32, zeros, shape, name) if len(shape) == 2 else zeros


def declared_tensors(metadata: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], bool]]:
    """{name: (numpy shape, optional)} that the architecture asks for with this metadata."""
    cls = archs.get(metadata["general.architecture"])
    config: ModelConfig = cls.config_class.from_metadata(metadata)
    model = cls(None, config)  # type: ignore[arg-type]
    rec = _Recorder(config.arch)
    model.load_tensors(rec)
    return rec.requests


def random_tensors(metadata: dict[str, Any], seed: int = 0, with_optional: tuple[str, ...] = ()
                   ) -> dict[str, np.ndarray]:
    """float32 random values for every required tensor, plus optional ones whose name ends
    with one of ``with_optional`` (e.g. ``("output.weight",)`` for an untied output)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, (shape, optional) in declared_tensors(metadata).items():
        if optional and not any(name.endswith(s) for s in with_optional):
            continue
        if len(shape) == 1:  # norm weights near 1, biases near 0
            base = 0.0 if name.endswith(".bias") else 1.0
            out[name] = (base + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:  # keep activations O(1): std 1/sqrt(fan-in), embeddings std 1
            scale = 1.0 if name == "token_embd.weight" else 1.0 / np.sqrt(shape[1])
            out[name] = (scale * rng.standard_normal(shape)).astype(np.float32)
    return out


def write_model(path: Path, metadata: dict[str, Any], tensors: dict[str, np.ndarray],
                types: dict[str, GGMLType] | None = None) -> Path:
    """Write a GGUF model file. 2-D tensors are F32 unless ``types`` names another type
    (F16, or one our quantizer writes: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1)."""
    w = GGUFWriter(path)
    for k, v in metadata.items():
        w.add(k, v)
    for name, x in tensors.items():
        t = (types or {}).get(name, GGMLType.F32)
        if t == GGMLType.F32:
            w.add_tensor(name, x.astype(np.float32))
        elif t == GGMLType.F16:
            w.add_tensor(name, x.astype(np.float16))
        else:
            from gguflm.quant.quantize import quantize

            w.add_tensor(name, quantize(x, t), type=t)
    return w.write()


def write_tiny(path: Path, arch: str = "llama", seed: int = 0,
               with_optional: tuple[str, ...] = (), types: dict[str, GGMLType] | None = None,
               **overrides: Any) -> Path:
    """A complete tiny random model of ``arch`` at ``path``."""
    md = tiny_metadata(arch, **overrides)
    return write_model(path, md, random_tensors(md, seed, with_optional), types)
