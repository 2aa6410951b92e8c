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

from ..gguf.errors import WriteError
from ..gguf.types import GGMLType, ValueType
from ..gguf.writer import GGUFWriter, to_bf16_bits
from . import bert, decoders  # noqa: F401 - register the architectures
from .base import REGISTRY, Keys, ModelConverter
from .errors import ConvertError
from .files import read_json, reading, same_file_as_input
from .naming import Naming, naming
from .params import Config
from .safetensors import STensor, read_header
from .schema import MapOf, Obj, Text, show

# --outtype -> (llama_ftype, the ggml type of the converted matrices, the file-name tag)
OUTTYPES = {"f32": (0, GGMLType.F32, "F32"), "f16": (1, GGMLType.F16, "F16"),
            "bf16": (32, GGMLType.BF16, "BF16"), "q8_0": (7, GGMLType.Q8_0, "Q8_0")}
_SKIPPED = (".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")
INDEX_JSON = Obj({"weight_map": MapOf(Text())}, required=("weight_map",))
MAX_NAME_BYTES = 200  # the default output name (the temporary file adds ~10 to it)


@dataclass
class Planned:
    name: str
    source: STensor
    type: GGMLType
    shape: tuple[int, ...]  # numpy order


def _located(e: ConvertError, t: STensor) -> ConvertError:
    """``e`` naming the checkpoint tensor ``t`` (and its file, when it names no file)."""
    return e.located(path=None if e.path else str(t.path),
                     tensor=None if e.tensor else t.name)  # type: ignore[return-value]


def _parts(folder: Path, index: dict | None, index_path: Path) -> list[str]:
    """The safetensors files: those the index names, else ``model*.safetensors``."""
    if index is not None:
        parts = sorted(set(index["weight_map"].values()))
        for part in parts:
            if part in ("", ".", "..") or any(c in part for c in "/\\\0"):
                raise ConvertError(f"{part!r} is not a file name in the checkpoint folder",
                                   path=str(index_path), key="weight_map")
        return parts
    try:
        return sorted(p.name for p in folder.iterdir()
                      if p.name.startswith("model") and p.name.endswith(".safetensors"))
    except OSError as e:
        raise ConvertError(f"cannot list: {e.strerror or e}", path=str(folder)) from None


def index_tensors(folder: Path) -> list[STensor]:
    """Every tensor of the checkpoint's ``model*.safetensors`` parts, in the converter's order."""
    index_path = folder / "model.safetensors.index.json"
    index = read_json(index_path, required=False, schema=INDEX_JSON)
    parts = _parts(folder, index, index_path)
    if not parts:
        raise ConvertError("missing: no model*.safetensors (PyTorch .bin checkpoints are not "
                           "supported: they need torch)", path=str(folder))
    tensors = []
    for part in parts:
        tensors += read_header(folder / part)
    if index is not None and {t.name for t in tensors} != set(index["weight_map"]):
        missing = sorted(set(index["weight_map"]) - {t.name for t in tensors})
        raise ConvertError(f"the parts do not hold the tensors the index lists (missing: "
                           f"{show(missing)})", path=str(index_path))
    return tensors


def _gguf_name(conv: ModelConverter, t: STensor) -> str | None:
    try:
        return conv.tensor_name(t.name)
    except ConvertError as e:
        raise _located(e, t) from None


def choose_outtype(outtype: str, tensors: list[STensor], conv: ModelConverter) -> str:
    """``auto``: the 16-bit type (bf16 or f16) of the first matrix the converter keeps,
    else f16."""
    if outtype != "auto":
        return outtype
    first = next((t for t in tensors if len(t.shape) >= 2 and not t.name.endswith(_SKIPPED)
                  and _gguf_name(conv, t) is not None), None)
    return "bf16" if first is not None and first.dtype == "BF16" else "f16"


def plan(conv: ModelConverter, tensors: list[STensor], qtype: GGMLType) -> list[Planned]:
    out = []
    for t in tensors:
        if t.name.endswith(_SKIPPED):
            continue
        name = _gguf_name(conv, t)
        if name is None:
            continue
        if len(t.shape) <= 1 or name.endswith("_norm.weight") or conv.forced_f32(name) \
                or not name.endswith(".weight"):
            gtype = GGMLType.F32
        elif qtype == GGMLType.Q8_0 and t.shape[-1] % 32:
            gtype = GGMLType.F16  # the converter's fallback when Q8_0 cannot hold the rows
        else:
            gtype = qtype
        try:
            shape = conv.out_shape(name, t.shape)
        except ConvertError as e:
            raise _located(e, t) from None
        out.append(Planned(name, t, gtype, shape))
    return out


def encode(p: Planned, conv: ModelConverter) -> Callable[[], np.ndarray]:
    """The tensor's bytes, made when the writer reaches it (one tensor in memory at a time)."""
    def make() -> np.ndarray:
        try:
            data = conv.modify(p.name, np.asarray(_as_float(p.source.load())))
        except ConvertError as e:
            raise _located(e, p.source) from None
        if data.shape != p.shape:
            raise ConvertError(f"became {data.shape}, planned {p.shape}",
                               path=str(p.source.path), tensor=p.source.name)
        if p.type == GGMLType.F32:
            return np.ascontiguousarray(data, dtype="<f4")
        if p.type == GGMLType.F16:
            return np.ascontiguousarray(data, dtype="<f2")
        if p.type == GGMLType.BF16:
            return to_bf16_bits(data.astype(np.float32))
        from ..quant.quantize import quantize

        return quantize(data.astype(np.float32), p.type, name=p.name)
    return make


def _as_float(data: np.ndarray) -> np.ndarray:
    return data if data.dtype in (np.float16, np.float32) else data.astype(np.float32)


def default_filename(n: Naming, tag: str) -> str:
    """gguf-py's ``naming_convention``: ``Base-Name-SIZE-finetune-version-TYPE.gguf`` (with
    anything that cannot be in a file name, a separator or a control character, as ``-``)."""
    base = (n.basename or n.name or "ggml-model").strip().replace(" ", "-").replace("/", "-")
    parts = [base] + [f"{s.strip().replace(' ', '-')}" for s in (n.size_label, n.finetune,
                                                                   n.version) if s]
    name = "-".join(parts + [tag.upper()]) + ".gguf"
    return "".join(c if c.isprintable() and c not in "/\\" else "-" for c in name)


def convert(folder: str | Path, outfile: str | Path | None = None,
            outtype: str = "auto") -> Path:
    """Convert the checkpoint in ``folder``; returns the path written.

    ``outfile`` may hold ``{ftype}`` / ``{FTYPE}`` (replaced by the output type); without one
    the file goes into ``folder`` under llama.cpp's default name. An output that is one of
    the files the conversion reads (by identity: through symlinks and hard links) is
    refused before anything is written.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ConvertError("not a folder (a Hugging Face checkpoint folder is needed)",
                           path=str(folder))
    if outtype not in (*OUTTYPES, "auto"):
        raise ConvertError(f"unknown --outtype {outtype!r} (f32, f16, bf16, q8_0, auto)")
    with reading() as inputs:
        w = _writer(folder, outfile, outtype)
        if same_file_as_input(w.path, inputs):
            raise ConvertError("the output is one of the checkpoint's own files (the "
                               "conversion reads it): refusing to overwrite it",
                               path=str(w.path))
        return w.write()


def _writer(folder: Path, outfile: str | Path | None, outtype: str) -> GGUFWriter:
    """A writer holding every key and (still to be made) tensor of the output."""
    config = Config(read_json(folder / "config.json"), folder / "config.json")
    conv_cls = _converter_class(config)
    tensors = index_tensors(folder)
    conv = conv_cls(folder, config, 0)
    outtype = choose_outtype(outtype, tensors, conv)
    file_type, qtype, tag = OUTTYPES[outtype]
    conv.file_type = file_type
    planned = plan(conv, tensors, qtype)
    total = sum(math.prod(p.shape) for p in planned)
    names = naming(config.get("_name_or_path"), folder.name, total)
    w = GGUFWriter(_output_path(folder, outfile, names, tag))
    w.add("general.architecture", conv.gguf_arch, ValueType.STRING)
    w.add("general.type", "model", ValueType.STRING)
    _add_keys(w, [(f"general.{key}", value, ValueType.STRING)
                  for key in ("name", "version", "organization", "finetune", "basename",
                              "size_label") if (value := getattr(names, key)) is not None],
              config.path)
    _add_keys(w, conv.parameters(), config.path)
    w.add("general.quantization_version", 2, ValueType.UINT32)
    _add_keys(w, conv.vocabulary(), folder / "tokenizer.json")
    for p in planned:
        try:
            w.add_tensor(p.name, encode(p, conv), type=p.type,
                         shape=tuple(reversed(p.shape)))
        except WriteError as e:
            raise ConvertError(e.reason, path=str(p.source.path), tensor=p.source.name) \
                from None
    return w


def _output_path(folder: Path, outfile: str | Path | None, names: Naming, tag: str) -> Path:
    if outfile is not None:
        return Path(str(outfile).replace("{ftype}", tag.lower()).replace("{FTYPE}", tag))
    name = default_filename(names, tag)
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        raise ConvertError(f"the default output name would be over {MAX_NAME_BYTES} bytes: "
                           "give --outfile", path=str(folder))
    return folder / name


def _add_keys(w: GGUFWriter, keys: Keys, source: Path) -> None:
    """The keys, any the writer refuses named with the file their value came from."""
    for key, value, vtype in keys:
        try:
            w.add(key, value, vtype)
        except WriteError as e:
            raise ConvertError(e.reason, path=str(source), key=key) from None


def _converter_class(config: Config) -> type[ModelConverter]:
    archs = config.get("architectures")
    if archs is None:
        raise config.error("missing: no \"architectures\" list", "architectures")
    cls = REGISTRY.get(archs[0])
    if cls is None:
        raise config.error(f"unsupported architecture {archs[0]!r} (supported: "
                           f"{', '.join(sorted(REGISTRY))})", "architectures")
    return cls
