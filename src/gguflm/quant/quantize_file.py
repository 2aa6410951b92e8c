"""``quantize_file``: a GGUF model quantized to one of llama-quantize's file types, making
the file llama-quantize makes (without an importance matrix), byte for byte.

What llama.cpp's ``llama_model_quantize`` does, in the same order:

- tensors in the loader's order (by layer, then name), each of a type chosen by the file
  type's mixture rules (``mixture.py``), quantized from float32: F32 as is, F16/BF16 widened,
  quantized tensors dequantized first (only with ``allow_requantize``);
- metadata copied key by key in the input's order, then ``general.quantization_version``
  (2) and ``general.file_type`` moved to the end, and split keys dropped;
- a GGUF v3 file, each tensor aligned to 32 bytes, dimensions after the last one above 1
  dropped (``ggml_n_dims``).

Every check runs before anything is written, and the file is written to a temporary name
and renamed: an error or Ctrl-C leaves no output. One deliberate difference: an input whose
``general.alignment`` is not 32 keeps its alignment (llama-quantize writes 32-byte offsets
under the old key, a file its own reader refuses).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..gguf.errors import GGUFError, TensorDataError
from ..gguf.reader import GGUFFile, TensorInfo
from ..gguf.reader import open as open_gguf
from ..gguf.types import GGMLType, ValueType
from ..gguf.writer import GGUFWriter
from .dequant import block_dequantizer, dequantize_rows
from .mixture import FileType, Mixture, Model, Options, file_type, n_dims, requires_imatrix
from .mixture import tensor_order as ordered
from .quantize import NEEDS_IMATRIX, quantize, supported_types

T = GGMLType
QUANTIZATION_VERSION = 2  # GGML_QNT_VERSION
_SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")
_SLAB_VALUES = 1 << 24  # rows are converted in slabs of about this many values (64 MB f32)

# the loader's guess of general.file_type from the most common tensor type
_GUESSED_FTYPE = {
    T.F32: 0, T.F16: 1, T.BF16: 32, T.Q4_0: 2, T.Q4_1: 3, T.Q5_0: 8, T.Q5_1: 9, T.Q8_0: 7,
    T.Q2_K: 10, T.Q3_K: 12, T.Q4_K: 15, T.Q5_K: 17, T.Q6_K: 18, T.TQ1_0: 36, T.TQ2_0: 37,
    T.IQ2_XXS: 19, T.IQ2_XS: 20, T.IQ2_S: 28, T.IQ3_XXS: 23, T.IQ1_S: 24, T.IQ1_M: 31,
    T.IQ4_NL: 25, T.IQ4_XS: 30, T.IQ3_S: 26, T.NVFP4: 39, T.Q1_0: 40, T.Q2_0: 41,
}
_FTYPE_GUESSED = 1024  # LLAMA_FTYPE_GUESSED


@dataclass(frozen=True)
class TensorPlan:
    """One output tensor: its shape as written (ggml order) and its type before and after."""

    name: str
    shape: tuple[int, ...]
    source: GGMLType
    target: GGMLType

    @property
    def converted(self) -> bool:
        return self.source != self.target


@dataclass(frozen=True)
class QuantizeReport:
    """What ``quantize_file`` wrote."""

    path: Path
    file_type: FileType
    ftype: int               # the general.file_type written
    tensors: list[TensorPlan]
    n_fallback: int          # tensors whose rows fit no block of their type: a smaller one
    bytes_in: int            # tensor bytes read and written
    bytes_out: int
    seconds: float


# (tensors finished, total, the tensor starting now or None at the end)
Progress = Callable[[int, int, "TensorPlan | None"], None]


def plan(f: GGUFFile, ftype: str | int | FileType, *, options: Options | None = None,
         allow_requantize: bool = False) -> tuple[list[TensorPlan], int]:
    """Each tensor's type, in output order, and how many fell back to a smaller block.

    Raises ``GGUFError`` for whatever llama-quantize refuses (or gguflm cannot make yet)
    before anything is written.
    """
    ft = file_type(ftype)
    options = options or Options()
    if f.byte_order != "<":
        raise GGUFError("big-endian GGUF files cannot be quantized (llama.cpp reads "
                        "little-endian files only)", path=f.path)
    count = f.metadata.get("split.count", 1)
    if isinstance(count, int) and count > 1:
        raise GGUFError(f"this is part of a split model ({count} files); merge it first",
                        key="split.count", path=f.path)
    names = ordered(f.tensors)
    mixture = Mixture.for_tensors(ft, Model.from_metadata(f.metadata), names, options)
    plans = []
    for name in names:
        t = f.tensors[name]
        shape = tuple(t.shape[:n_dims(t.shape)]) if t.shape else (1,)
        target = mixture.choose(name, shape, t.type)
        p = TensorPlan(name, shape, t.type, target)
        _check(p, ft, allow_requantize)
        plans.append(p)
    return plans, mixture.n_fallback


def _check(p: TensorPlan, ft: FileType, allow_requantize: bool) -> None:
    if requires_imatrix(p.name, p.target, ft):
        raise GGUFError(f"{ft.name} makes this tensor {p.target.ggml_name}, which llama-quantize "
                        "makes only with an importance matrix (not supported yet)",
                        tensor=p.name)
    if not p.converted:
        return
    src, dst = p.source, p.target
    if src.quantized and not allow_requantize:
        raise GGUFError(f"already quantized ({src.ggml_name}): requantizing to "
                        f"{dst.ggml_name} loses quality; allow it with --allow-requantize "
                        "(allow_requantize=True)", tensor=p.name)
    if src.quantized and block_dequantizer(src) is None or \
            not src.quantized and src not in (T.F32, T.F16, T.BF16):
        raise GGUFError(f"cannot convert a {src.ggml_name} tensor", tensor=p.name)
    if dst not in supported_types():
        why = "it needs an importance matrix" if dst in NEEDS_IMATRIX else "no quantizer"
        raise GGUFError(f"cannot make {dst.ggml_name} ({why}; not supported yet)",
                        tensor=p.name)
    if p.shape[0] % dst.block_size:
        raise TensorDataError(f"row length {p.shape[0]} is not a multiple of the "
                              f"{dst.ggml_name} block size {dst.block_size}", tensor=p.name)


def output_ftype(f: GGUFFile, ft: FileType) -> int:
    """``general.file_type`` as llama-quantize writes it: the file type's number, or for
    COPY the input's (its ``general.file_type``, else guessed from the most common tensor
    type and marked as guessed, as llama.cpp's loader does)."""
    if ft.default is not None:
        return ft.ftype
    given = f.metadata.get("general.file_type")
    if isinstance(given, int) and not isinstance(given, bool) and 0 <= given < 1 << 32:
        return given
    counts: dict[GGMLType, int] = {}
    best, most = T.F32, 0
    for name in ordered(f.tensors):
        t = f.tensors[name].type
        counts[t] = counts.get(t, 0) + 1
        if counts[t] > most:
            best, most = t, counts[t]
    return _GUESSED_FTYPE.get(best, 0) | _FTYPE_GUESSED


def quantize_file(src: str | os.PathLike[str], dst: str | os.PathLike[str],
                  ftype: str | int | FileType, *, allow_requantize: bool = False,
                  output_tensor_type: GGMLType | str | None = None,
                  token_embedding_type: GGMLType | str | None = None, pure: bool = False,
                  leave_output_tensor: bool = False, threads: int | None = None,
                  progress: Progress | None = None) -> QuantizeReport:
    """Quantize the GGUF model ``src`` to ``dst`` as llama-quantize's ``ftype`` does.

    ``ftype``: a file type name (``Q4_K_M``, ``Q8_0``, ``COPY``, ...; see
    ``mixture.FILE_TYPES``) or its number. The keyword arguments are llama-quantize's
    options of the same names; ``threads`` defaults to the cores available. ``progress``
    is called before each tensor and once at the end. Raises ``GGUFError`` (with nothing
    written) for anything llama-quantize refuses or gguflm cannot make.
    """
    t0 = time.perf_counter()
    ft = file_type(ftype)
    options = Options(_ggml_type(output_tensor_type), _ggml_type(token_embedding_type), pure,
                      not leave_output_tensor)
    src, dst = Path(src), Path(dst)
    check_output(src, dst)
    threads = threads if threads and threads > 0 else _cores()
    with open_gguf(src) as f:
        plans, n_fallback = plan(f, ft, options=options, allow_requantize=allow_requantize)
        ftype_value = output_ftype(f, ft)
        w = GGUFWriter(dst, version=3, byte_order="<")
        for key, value in f.metadata.items():
            if key not in _SPLIT_KEYS and key not in ("general.quantization_version",
                                                      "general.file_type"):
                w.add(key, value, f.types[key])
        w.add("general.quantization_version", QUANTIZATION_VERSION, ValueType.UINT32)
        w.add("general.file_type", ftype_value, ValueType.UINT32)
        for i, p in enumerate(plans):
            w.add_tensor(p.name, _maker(f, f.tensors[p.name], p, i, len(plans), threads,
                                        progress), type=p.target, shape=p.shape)
        w.write()
        if progress is not None:
            progress(len(plans), len(plans), None)
        bytes_in = sum(t.nbytes for t in f.tensors.values())
    bytes_out = sum(p.target.nbytes(p.shape) for p in plans)
    return QuantizeReport(dst, ft, ftype_value, plans, n_fallback, bytes_in, bytes_out,
                          time.perf_counter() - t0)


def check_output(src: Path, dst: Path) -> None:
    """Refuse an output that is the input (or a folder) before any work is done."""
    if dst.exists() and src.exists() and os.path.samefile(src, dst) or \
            dst.resolve() == src.resolve():
        raise GGUFError("the output file is the input file; name a new file", path=str(dst))
    if dst.is_dir():
        raise GGUFError("the output is a directory", path=str(dst))


def _maker(f: GGUFFile, t: TensorInfo, p: TensorPlan, index: int, total: int, threads: int,
           progress: Progress | None) -> Callable[[], Any]:
    """The tensor's output bytes, computed when the writer reaches it."""
    def make() -> Any:
        if progress is not None:
            progress(index, total, p)
        if not p.converted:
            return f.raw_bytes(t.file_offset, t.file_offset + t.nbytes)
        ncols, n_rows = p.shape[0], t.n_rows
        out = np.empty((n_rows, p.target.row_bytes(ncols)), np.uint8)
        step = max(1, _SLAB_VALUES // max(ncols, 1))
        for start in range(0, n_rows, step):
            stop = min(n_rows, start + step)
            x = dequantize_rows(t, start, stop)
            out[start:stop] = quantize(x, p.target, name=p.name, threads=threads)
        return out
    return make


def _ggml_type(t: GGMLType | str | None) -> GGMLType | None:
    if t is None or isinstance(t, GGMLType):
        return t
    try:
        return GGMLType.from_name(t)
    except ValueError:
        raise GGUFError(f"unknown ggml type {t!r}") from None


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1
