"""Tensors by GGUF name, checked against the shapes an architecture declares.

2-D weights stay in their ggml encoding as ``QMatrix`` (memory-mapped, never a float32 copy
of the whole model); 1-D tensors (norm weights, biases) become small float32 arrays.
Architectures describe a layer's tensors as ``{suffix: numpy shape}`` and get back a
``Layer`` whose attributes mirror the GGUF names (``blk.3.attn_q.weight`` -> ``layer.attn_q``,
``blk.3.attn_q.bias`` -> ``layer.attn_q_bias``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..gguf.errors import TensorInfoError
from ..gguf.reader import GGUFFile, TensorInfo
from ..gguf.types import GGMLType
from ..quant.matrix import QMatrix
from .config import ModelConfig

Shape = tuple[int, ...]


class Layer(SimpleNamespace):
    """One block's tensors as attributes named after their GGUF suffixes (the
    architecture builds its ``layer.Block`` spec from them)."""

    def __repr__(self) -> str:
        names = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"Layer({names})"


def _ggml_order(shape: Shape) -> str:
    return "[" + ", ".join(str(d) for d in reversed(shape)) + "]"


def attr_name(suffix: str) -> str:
    """``attn_q.weight`` -> ``attn_q``; ``attn_q.bias`` -> ``attn_q_bias``."""
    base = suffix.removesuffix(".weight")
    return base.replace(".", "_")


class Weights:
    """Hands out a file's tensors by name, checking shapes; remembers which were used."""

    def __init__(self, gguf: GGUFFile, arch: str) -> None:
        self.gguf = gguf
        self.arch = arch
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.gguf.tensors

    def info(self, name: str, shape: Shape) -> TensorInfo:
        """The tensor ``name``, checked to have numpy shape ``shape``."""
        t = self.gguf.tensors.get(name)
        if t is None:
            raise TensorInfoError(
                f"missing: the {self.arch!r} architecture needs it with shape "
                f"{_ggml_order(shape)} (ggml order)", tensor=name)
        if _squeezed(t.np_shape) != _squeezed(shape):
            raise TensorInfoError(
                f"has shape {_ggml_order(t.np_shape)}, the {self.arch!r} architecture expects "
                f"{_ggml_order(shape)} (ggml order: row length first)", tensor=name)
        self.used.add(name)
        return t

    def get(self, name: str, shape: Shape, *, optional: bool = False) -> Any:
        """A 2-D tensor as a ``QMatrix``, a 1-D one as float32, a 3-D one (experts: (n,
        rows, cols)) as a tuple of n ``QMatrix`` row views of its bytes; None if optional
        and absent."""
        if optional and not self.has(name):
            return None
        t = self.info(name, shape)
        if len(shape) == 2 and name.endswith(".bias"):  # experts' biases: a row each
            return vector(t).reshape(shape)
        if len(shape) == 2:  # (a row vector that llama.cpp wrote 1-D: the same tensor)
            return QMatrix(t.type, t.data, tuple(shape), name=t.name)
        if len(shape) == 3:
            return expert_matrices(t)
        if len(shape) == 1:
            return vector(t)
        raise TensorInfoError(f"{len(shape)}-D tensors are not supported here", tensor=name)

    def get_or(self, name: str, shape: Shape, fallback: Any) -> Any:
        """The tensor ``name`` if the file has it, else ``fallback``: an output projection
        tied to the token embedding when ``output.weight`` is absent."""
        t = self.get(name, shape, optional=True)
        return fallback if t is None else t

    def layer(self, i: int, required: Mapping[str, Shape],
              optional: Mapping[str, Shape] | None = None, *,
              qkv: ModelConfig | None = None) -> Layer:
        """Block i's tensors: ``{suffix: shape}``, suffix like ``attn_q.weight`` or
        ``attn_q.bias`` (a bare name means ``.weight``). Absent optional ones are None.

        With ``qkv`` (the model's config), also the attention input projections, as
        llama.cpp's create_tensor_qkv: one fused ``attn_qkv`` (rows [q | k | v]) when the
        file has it, else ``attn_q``/``attn_k``/``attn_v``; biases optional either way.
        ``layer.qkv`` makes the spec's Q, K and V of whichever was loaded."""
        if qkv is not None:
            qkv_required, qkv_optional = self.qkv_specs(i, qkv)
            required = {**qkv_required, **required}
            optional = {**qkv_optional, **(optional or {})}
        out = Layer()
        for specs, opt in ((required, False), (optional or {}, True)):
            for suffix, shape in specs.items():
                if "." not in suffix:
                    suffix += ".weight"
                setattr(out, attr_name(suffix), self.get(f"blk.{i}.{suffix}", shape,
                                                         optional=opt))
        return out

    def experts(self, n_expert: int, n_embd: int, n_ff: int,
                fused_at: int | None = None) -> dict[str, Shape]:
        """A layer's expert FFN tensors (llama.cpp's layout) as ``layer`` specs: the router
        ``ffn_gate_inp`` and the 3-D ``ffn_gate_exps``/``ffn_up_exps``/``ffn_down_exps``.
        ``fused_at`` (a layer index, for the architectures whose llama.cpp loader calls
        create_tensor_gate_up_exps): that layer's one ``ffn_gate_up_exps`` (each expert's
        rows [gate | up]) when the file has it, instead of the two."""
        gate_up: dict[str, Shape] = {"ffn_gate_exps": (n_expert, n_ff, n_embd),
                                     "ffn_up_exps": (n_expert, n_ff, n_embd)}
        if fused_at is not None and self.has(f"blk.{fused_at}.ffn_gate_up_exps.weight"):
            gate_up = {"ffn_gate_up_exps": (n_expert, 2 * n_ff, n_embd)}
        return {"ffn_gate_inp": (n_expert, n_embd), **gate_up,
                "ffn_down_exps": (n_expert, n_embd, n_ff)}

    def qkv_specs(self, i: int, c: ModelConfig) -> tuple[dict[str, Shape], dict[str, Shape]]:
        """Block i's fused or separate Q/K/V projections as (required, optional) specs."""
        if self.has(f"blk.{i}.attn_qkv.weight"):
            n = c.n_embd_q + c.n_embd_k + c.n_embd_v
            return {"attn_qkv": (n, c.n_embd)}, {"attn_qkv.bias": (n,)}
        return ({"attn_q": (c.n_embd_q, c.n_embd), "attn_k": (c.n_embd_k, c.n_embd),
                 "attn_v": (c.n_embd_v, c.n_embd)},
                {"attn_q.bias": (c.n_embd_q,), "attn_k.bias": (c.n_embd_k,),
                 "attn_v.bias": (c.n_embd_v,)})

    def check_all_used(self) -> None:
        """A tensor nobody asked for means a file this architecture does not understand
        (llama.cpp refuses such files too); name the first one."""
        unused = [n for n in self.gguf.tensors if n not in self.used]
        if unused:
            more = f" (and {len(unused) - 1} more)" if len(unused) > 1 else ""
            raise TensorInfoError(
                f"not used by the {self.arch!r} architecture{more}: the file is not the "
                f"architecture it declares, or it has parts this implementation lacks",
                tensor=unused[0])


def expert_matrices(t: TensorInfo) -> tuple[QMatrix, ...]:
    """A 3-D tensor (n, rows, cols) as n (rows, cols) matrices over its bytes (no copy)."""
    n, rows, cols = (int(d) for d in t.np_shape)
    whole = QMatrix(t.type, t.data, (n * rows, cols), name=t.name)
    return tuple(QMatrix(whole.type, whole.raw[e * rows:(e + 1) * rows], (rows, cols),
                         name=f"{t.name}[{e}]") for e in range(n))


def vector(t: TensorInfo) -> np.ndarray:
    """A 1-D tensor as float32: F32 stays a zero-copy view, others are converted (small)."""
    if t.type == GGMLType.F32:
        return t.data
    if t.type == GGMLType.F16:
        return t.data.astype(np.float32)
    if t.type == GGMLType.BF16:
        return (t.data.astype(np.uint32) << 16).view(np.float32)
    from ..quant import dequantize

    return dequantize(t).reshape(-1).astype(np.float32, copy=False)


def _squeezed(np_shape: Any) -> tuple[int, ...]:
    """A numpy shape less its leading 1s: ggml's trailing dimensions of 1, which llama.cpp's
    writer leaves out (llama-quantize writes a [768, 1] head as [768]), as its loader
    reads them."""
    dims = [int(d) for d in np_shape]
    while len(dims) > 1 and dims[0] == 1:
        dims.pop(0)
    return tuple(dims)
