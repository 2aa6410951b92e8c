"""Tensor-level dequantization: checks the bytes against the shape, then runs a block
dequantizer over cache-sized chunks of blocks.

Public entry points are re-exported by ``gguflm.quant``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import cache

import numpy as np

from ..gguf.errors import TensorDataError
from ..gguf.reader import TensorInfo
from ..gguf.types import PLAIN_DTYPES, GGMLType
from . import kquants, simple
from .formats import f16_to_f32

BlockFn = Callable[[np.ndarray, np.ndarray], None]

# Blocks per chunk: ~64k values keeps a chunk's temporaries in L2 (and a small tensor in
# one numpy pass per step).
_CHUNK_VALUES = 1 << 20


@cache
def _dequantizers() -> dict[GGMLType, BlockFn]:
    from . import iquants  # loads the grid tables, on first use only

    return {**simple.DEQUANTIZERS, **kquants.DEQUANTIZERS, **iquants.DEQUANTIZERS}


def block_dequantizer(gtype: GGMLType) -> BlockFn | None:
    """The block function of a quantized type (None if ggml has no ``to_float`` for it)."""
    return _dequantizers().get(gtype)


def supported_types() -> list[GGMLType]:
    """Every type ``dequantize`` accepts."""
    return sorted(set(PLAIN_DTYPES) | set(_dequantizers()))


def _plain(gtype: GGMLType, raw: np.ndarray) -> np.ndarray:
    """Reinterpret ``raw`` as the plain type's little-endian dtype unless already typed."""
    target = np.dtype(PLAIN_DTYPES[gtype])
    if raw.dtype.newbyteorder("=") == target:
        return raw.reshape(-1)  # typed already (possibly big-endian, from the reader)
    return np.ascontiguousarray(raw).reshape(-1).view(np.uint8).view(target.newbyteorder("<"))


def _to_f32_plain(gtype: GGMLType, vals: np.ndarray, out: np.ndarray) -> None:
    if gtype == GGMLType.BF16:
        # bfloat16 is the top half of a float32
        bits = out.view(np.uint32)
        bits[:] = vals
        bits <<= 16
    elif gtype == GGMLType.F16 and vals.dtype.isnative:
        f16_to_f32(vals, out)
    else:
        np.copyto(out, vals, casting="unsafe")


def dequantize_raw(gtype: GGMLType, raw: np.ndarray, shape: Sequence[int], *,
                   name: str | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Decode ``raw`` bytes (uint8 array, bytes, or for plain types a typed array) of ``gtype``.

    ``shape`` is the numpy-order shape of the result (its last axis is the row length);
    ``name`` only labels errors. Returns float32 of ``shape`` (written into ``out`` when
    given: C-contiguous float32 of that shape). Bit-identical to ggml's ``to_float``.
    """
    gtype = GGMLType(gtype)
    if not isinstance(raw, np.ndarray):
        raw = np.frombuffer(raw, dtype=np.uint8)  # bytes, memoryview
    shape = tuple(int(s) for s in shape)
    n = math.prod(shape)
    if gtype.removed or gtype.block_size == 0:
        raise TensorDataError(f"type {gtype.name} was removed from ggml and cannot be decoded",
                              tensor=name)
    ncols = shape[-1] if shape else 1
    bs, ts = gtype.block_size, gtype.type_size
    if ncols % bs:
        raise TensorDataError(f"row length {ncols} is not a multiple of the {gtype.ggml_name} "
                              f"block size {bs}", tensor=name)
    want = n // bs * ts
    if raw.nbytes != want:
        raise TensorDataError(f"{raw.nbytes} bytes of data for {gtype.ggml_name} shape "
                              f"{list(shape)} (wants {want})", tensor=name)
    if out is None:
        out = np.empty(shape, dtype=np.float32)
    elif out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float32 of shape {shape}")
    flat = out.reshape(-1)
    if gtype in PLAIN_DTYPES:
        _to_f32_plain(gtype, _plain(gtype, raw), flat)
        return out
    fn = block_dequantizer(gtype)
    if fn is None:
        raise TensorDataError(f"ggml cannot convert {gtype.ggml_name} to float", tensor=name)
    blocks = np.ascontiguousarray(raw).reshape(-1).view(np.uint8).reshape(-1, ts)
    vals = flat.reshape(-1, bs)
    step = max(1, _CHUNK_VALUES // bs)
    # inf/NaN scales decode to inf/NaN, as in ggml, without numpy's warnings
    with np.errstate(all="ignore"):
        for i in range(0, len(blocks), step):
            fn(blocks[i:i + step], vals[i:i + step])
    return out


def dequantize(tensor: TensorInfo) -> np.ndarray:
    """The whole tensor as float32 in numpy order (``tensor.np_shape``)."""
    _check_type(tensor)  # before ``tensor.data`` is touched: a bad shape is the error to give
    return dequantize_raw(tensor.type, tensor.data, tensor.np_shape, name=tensor.name)


def _check_type(tensor: TensorInfo) -> None:
    t = tensor.type
    if t.removed or t.block_size == 0:
        raise TensorDataError(f"type {t.name} was removed from ggml and cannot be decoded",
                              tensor=tensor.name)
    if tensor.shape and tensor.shape[0] % t.block_size:
        raise TensorDataError(f"row length {tensor.shape[0]} is not a multiple of the "
                              f"{t.ggml_name} block size {t.block_size}", tensor=tensor.name)


def dequantize_rows(tensor: TensorInfo, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of the tensor viewed as ``(n_rows, row_length)``, as float32.

    Only those rows' bytes are read (the embedding-lookup path).
    """
    _check_type(tensor)
    n_rows, ncols = tensor.n_rows, (tensor.shape[0] if tensor.shape else 1)
    if not (0 <= start <= stop <= n_rows):
        raise TensorDataError(f"rows {start}:{stop} out of range (tensor has {n_rows} rows)",
                              tensor=tensor.name)
    data = tensor.data
    if tensor.type in PLAIN_DTYPES:
        raw = data.reshape(n_rows, ncols)[start:stop]
    else:
        raw = data.reshape(n_rows, tensor.row_bytes)[start:stop]
    return dequantize_raw(tensor.type, raw, (stop - start, ncols), name=tensor.name)
