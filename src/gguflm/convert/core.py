"""A Hugging Face checkpoint folder -> the GGUF file llama.cpp's ``convert_hf_to_gguf.py``
writes for it: the same keys in the same order, the same tensors, types and bytes.

Key order: ``general.architecture``, ``general.type``, the naming keys, the architecture's
hyperparameters (ending with ``general.file_type``), ``general.quantization_version``, then
the tokenizer. Tensors in checkpoint order (parts sorted by file name, each in its header's
order). Types as the converter chooses them: 1-D tensors, ``*_norm.weight``, biases and a
few named tensors in F32; the rest in the output type (Q8_0 rows that are not a multiple of
32 fall back to F16, as there).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..gguf.types import GGMLType, ValueType
from ..gguf.writer import GGUFWriter, to_bf16_bits
from . import bert, decoders  # noqa: F401 - register the architectures
from .base import REGISTRY, ModelConverter
from .errors import ConvertError
from .naming import Naming, naming
from .safetensors import STensor, read_header
from .vocab import read_json

# --outtype -> (llama_ftype, the ggml type of the converted matrices, the file-name tag)
OUTTYPES = {"f32": (0, GGMLType.F32, "F32"), "f16": (1, GGMLType.F16, "F16"),
            "bf16": (32, GGMLType.BF16, "BF16"), "q8_0": (7, GGMLType.Q8_0, "Q8_0")}
_SKIPPED = (".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")


@dataclass
class Planned:
    name: str
    source: STensor
    type: GGMLType
    shape: tuple[int, ...]  # numpy order


def index_tensors(folder: Path) -> list[STensor]:
    """Every tensor of the checkpoint's ``model*.safetensors`` parts, in the converter's order."""
    index_path = folder / "model.safetensors.index.json"
    index = read_json(index_path, required=False)
    if index is not None:
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict):
            raise ConvertError("no weight_map object", path=str(index_path))
        parts = sorted(set(map(str, weight_map.values())))
    else:
        parts = sorted(p.name for p in folder.iterdir()
                       if p.name.startswith("model") and p.name.endswith(".safetensors"))
    if not parts:
        raise ConvertError("missing: no model*.safetensors (PyTorch .bin checkpoints are not "
                           "supported: they need torch)", path=str(folder))
    tensors = []
    for part in parts:
        path = folder / part
        if "/" in part or not path.is_file():
            raise ConvertError("missing: a part the index names", path=str(path))
        tensors += read_header(path)
    if index is not None and {t.name for t in tensors} != set(weight_map):
        missing = sorted(set(weight_map) - {t.name for t in tensors})
        raise ConvertError(f"the parts do not hold the tensors the index lists (missing: "
                           f"{missing[:3]})", path=str(index_path))
    return tensors


def choose_outtype(outtype: str, tensors: list[STensor], conv: ModelConverter) -> str:
    """``auto``: the 16-bit type (bf16 or f16) of the first matrix the converter keeps,
    else f16."""
    if outtype != "auto":
        return outtype
    first = next((t for t in tensors if len(t.shape) >= 2 and not t.name.endswith(_SKIPPED)
                  and conv.tensor_name(t.name) is not None), None)
    return "bf16" if first is not None and first.dtype == "BF16" else "f16"


def plan(conv: ModelConverter, tensors: list[STensor], qtype: GGMLType) -> list[Planned]:
    out = []
    for t in tensors:
        if t.name.endswith(_SKIPPED):
            continue
        name = conv.tensor_name(t.name)
        if name is None:
            continue
        if len(t.shape) <= 1 or name.endswith("_norm.weight") or conv.forced_f32(name) \
                or not name.endswith(".weight"):
            gtype = GGMLType.F32
        elif qtype == GGMLType.Q8_0 and t.shape[-1] % 32:
            gtype = GGMLType.F16  # the converter's fallback when Q8_0 cannot hold the rows
        else:
            gtype = qtype
        out.append(Planned(name, t, gtype, conv.out_shape(name, t.shape)))
    return out


def encode(p: Planned, conv: ModelConverter) -> Callable[[], np.ndarray]:
    """The tensor's bytes, made when the writer reaches it (one tensor in memory at a time)."""
    def make() -> np.ndarray:
        data = p.source.load()
        if data.dtype not in (np.float16, np.float32):
            data = data.astype(np.float32)
        data = conv.modify(p.name, np.asarray(data))
        if data.shape != p.shape:
            raise ConvertError(f"became {data.shape}, planned {p.shape}", tensor=p.name)
        if p.type == GGMLType.F32:
            return np.ascontiguousarray(data, dtype="<f4")
        if p.type == GGMLType.F16:
            return np.ascontiguousarray(data, dtype="<f2")
        if p.type == GGMLType.BF16:
            return to_bf16_bits(data.astype(np.float32))
        from ..quant.quantize import quantize

        return quantize(data.astype(np.float32), p.type, name=p.name)
    return make


def default_filename(n: Naming, tag: str) -> str:
    """gguf-py's ``naming_convention``: ``Base-Name-SIZE-finetune-version-TYPE.gguf``."""
    base = (n.basename or n.name or "ggml-model").strip().replace(" ", "-").replace("/", "-")
    parts = [base] + [f"{s.strip().replace(' ', '-')}" for s in (n.size_label, n.finetune,
                                                                   n.version) if s]
    return "-".join(parts + [tag.upper()]) + ".gguf"


def convert(folder: str | Path, outfile: str | Path | None = None,
            outtype: str = "auto") -> Path:
    """Convert the checkpoint in ``folder``; returns the path written.

    ``outfile`` may hold ``{ftype}`` / ``{FTYPE}`` (replaced by the output type); without one
    the file goes into ``folder`` under llama.cpp's default name.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ConvertError("not a folder (a Hugging Face checkpoint folder is needed)",
                           path=str(folder))
    if outtype not in (*OUTTYPES, "auto"):
        raise ConvertError(f"unknown --outtype {outtype!r} (f32, f16, bf16, q8_0, auto)")
    hparams = read_json(folder / "config.json")
    conv_cls = _converter_class(folder, hparams)
    tensors = index_tensors(folder)
    conv = conv_cls(folder, hparams, 0)
    outtype = choose_outtype(outtype, tensors, conv)
    file_type, qtype, tag = OUTTYPES[outtype]
    conv.file_type = file_type
    planned = plan(conv, tensors, qtype)
    total = sum(math.prod(p.shape) for p in planned)
    names = naming(hparams.get("_name_or_path"), folder.name, total)
    if outfile is None:
        path = folder / default_filename(names, tag)
    else:
        path = Path(str(outfile).replace("{ftype}", tag.lower()).replace("{FTYPE}", tag))
    w = GGUFWriter(path)
    w.add("general.architecture", conv.gguf_arch, ValueType.STRING)
    w.add("general.type", "model", ValueType.STRING)
    for key in ("name", "version", "organization", "finetune", "basename", "size_label"):
        if (value := getattr(names, key)) is not None:
            w.add(f"general.{key}", value, ValueType.STRING)
    for key, value, vtype in conv.parameters():
        w.add(key, value, vtype)
    w.add("general.quantization_version", 2, ValueType.UINT32)
    for key, value, vtype in conv.vocabulary():
        w.add(key, value, vtype)
    for p in planned:
        w.add_tensor(p.name, encode(p, conv), type=p.type, shape=tuple(reversed(p.shape)))
    return w.write()


def _converter_class(folder: Path, hparams: object) -> type[ModelConverter]:
    where = str(folder / "config.json")
    if not isinstance(hparams, dict):
        raise ConvertError("expected a JSON object", path=where)
    if isinstance(hparams.get("text_config"), dict):
        hparams.update({**hparams, **hparams["text_config"]})
    archs = hparams.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise ConvertError("no \"architectures\" list", path=where)
    cls = REGISTRY.get(archs[0])
    if cls is None:
        raise ConvertError(f"unsupported architecture {archs[0]!r} (supported: "
                           f"{', '.join(sorted(REGISTRY))})", path=where)
    return cls
