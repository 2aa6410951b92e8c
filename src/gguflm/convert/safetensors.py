"""The safetensors format read directly with numpy: a bounded JSON header, then raw tensors.

Layout: u64 little-endian header length N, N bytes of JSON ``{name: {dtype, shape,
data_offsets: [begin, end]}, "__metadata__": {...}}``, then the data; offsets are relative
to the end of the header. Every length, shape and offset is checked against the file before
anything is mapped, so a truncated file or a header that lies fails with the file's name:
each field's type first, then each dimension (at most ``MAX_DIM``, and at most
``MAX_ELEMENTS`` for the product of the nonzero ones, so that an empty tensor cannot declare
a shape no array or GGUF file can hold), then the bytes against the shape.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ConvertError
from .files import open_input
from .schema import show

MAX_HEADER_BYTES = 100 << 20  # the Rust reference implementation's own limit
MAX_DIMS = 8
MAX_DIM = 1 << 40  # elements along one dimension (a real one is under 2**20)
MAX_ELEMENTS = 1 << 48  # the product of the nonzero dimensions (numpy's bytes fit int64)
DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
          "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


@dataclass(frozen=True)
class STensor:
    """One tensor of a safetensors file: its dtype name, numpy-order shape, and bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    path: Path
    start: int  # absolute file offset
    nbytes: int

    def load(self) -> np.ndarray:
        """The values as float32 (BF16 widened, F16/F32 kept), memory-mapped where possible."""
        try:
            arr = np.memmap(self.path, dtype=DTYPES[self.dtype], mode="r", offset=self.start,
                            shape=self.shape) if self.nbytes else np.zeros(self.shape,
                                                                            DTYPES[self.dtype])
        except (OSError, ValueError) as e:  # the file changed since its header was read
            raise ConvertError(f"cannot map the tensor's bytes: {e}", path=str(self.path),
                               tensor=self.name) from None
        if self.dtype == "BF16":
            return (arr.astype(np.uint32) << 16).view(np.float32)
        return arr


def read_header(path: Path) -> list[STensor]:
    """The tensors of one safetensors file, in the header's order (checked, nothing loaded)."""
    f = open_input(path)
    if f is None:
        raise ConvertError("missing: no such file", path=str(path))
    try:
        with f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise ConvertError(f"truncated: {len(head)} bytes, no safetensors header",
                                   path=str(path))
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or n > size - 8:
                raise ConvertError(f"header length {n} exceeds the file ({size} bytes) or "
                                   f"the {MAX_HEADER_BYTES >> 20} MiB limit: truncated or "
                                   "not safetensors", path=str(path))
            raw = f.read(n)
    except OSError as e:
        raise ConvertError(f"cannot read: {e.strerror or e}", path=str(path)) from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # also UnicodeDecodeError, 4300-digit ints
        raise ConvertError(f"the safetensors header is not valid JSON ({e})",
                           path=str(path)) from None
    if not isinstance(header, dict):
        raise ConvertError("the safetensors header is not a JSON object", path=str(path))
    data_start, data_size = 8 + n, size - 8 - n
    return [_entry(path, name, info, data_start, data_size)
            for name, info in header.items() if name != "__metadata__"]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shape_problem(shape: object) -> str | None:
    """Why ``shape`` is not a tensor shape this converter takes, or None."""
    if not isinstance(shape, list) or not all(_is_int(d) for d in shape):
        return f"shape {show(shape)} is not a list of integers"
    if len(shape) > MAX_DIMS:
        return f"shape has {len(shape)} dimensions; at most {MAX_DIMS} are supported"
    if not all(0 <= d <= MAX_DIM for d in shape):
        return f"shape {show(shape)}: each dimension must be from 0 to 2**40"
    if math.prod(d for d in shape if d) > MAX_ELEMENTS:
        return f"shape {show(shape)}: the nonzero dimensions multiply to over 2**48"
    return None


def _entry(path: Path, name: str, info: object, data_start: int, data_size: int) -> STensor:
    def bad(why: str) -> ConvertError:
        return ConvertError(why, path=str(path), tensor=name)

    if not isinstance(info, dict):
        raise bad("expected an object with dtype, shape and data_offsets")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise bad(f"unsupported dtype {show(dtype)} (supported: {', '.join(DTYPES)})")
    if (why := _shape_problem(shape)) is not None:
        raise bad(why)
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_int, offsets)):
        raise bad(f"invalid data_offsets {show(offsets)}")
    begin, end = offsets
    want = math.prod(shape) * np.dtype(DTYPES[dtype]).itemsize
    if not 0 <= begin <= end <= data_size:
        raise bad(f"data_offsets [{show(begin)}, {show(end)}] lie outside the {data_size} "
                  "data bytes (truncated file or a lying header)")
    if end - begin != want:
        raise bad(f"data_offsets hold {end - begin} bytes; {dtype} {shape} needs {want}")
    return STensor(name, dtype, tuple(shape), path, data_start + begin, want)
