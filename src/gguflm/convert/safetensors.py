"""The safetensors format read directly with numpy: a bounded JSON header, then raw tensors.

Layout: u64 little-endian header length N, N bytes of JSON ``{name: {dtype, shape,
data_offsets: [begin, end]}, "__metadata__": {...}}``, then the data; offsets are relative
to the end of the header. Every length, shape and offset is checked against the file before
anything is mapped, so a truncated file or a header that lies fails with the file's name.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ConvertError

MAX_HEADER_BYTES = 100 << 20  # the Rust reference implementation's own limit
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
        arr = np.memmap(self.path, dtype=DTYPES[self.dtype], mode="r", offset=self.start,
                        shape=self.shape) if self.nbytes else np.zeros(self.shape,
                                                                        DTYPES[self.dtype])
        if self.dtype == "BF16":
            return (arr.astype(np.uint32) << 16).view(np.float32)
        return arr


def read_header(path: Path) -> list[STensor]:
    """The tensors of one safetensors file, in the header's order (checked, nothing loaded)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
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
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ConvertError(f"the safetensors header is not valid JSON ({e})",
                           path=str(path)) from None
    if not isinstance(header, dict):
        raise ConvertError("the safetensors header is not a JSON object", path=str(path))
    data_start, data_size = 8 + n, size - 8 - n
    return [_entry(path, name, info, data_start, data_size)
            for name, info in header.items() if name != "__metadata__"]


def _entry(path: Path, name: str, info: object, data_start: int, data_size: int) -> STensor:
    def bad(why: str) -> ConvertError:
        return ConvertError(why, path=str(path), tensor=name)

    if not isinstance(info, dict):
        raise bad("expected an object with dtype, shape and data_offsets")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in DTYPES:
        raise bad(f"unsupported dtype {dtype!r} (supported: {', '.join(DTYPES)})")
    if (not isinstance(shape, list) or len(shape) > 8
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                       for d in shape)):
        raise bad(f"invalid shape {shape!r}")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
        raise bad(f"invalid data_offsets {offsets!r}")
    begin, end = offsets
    want = math.prod(shape) * np.dtype(DTYPES[dtype]).itemsize
    if not 0 <= begin <= end <= data_size:
        raise bad(f"data_offsets [{begin}, {end}] lie outside the {data_size} data bytes "
                  "(truncated file or a lying header)")
    if end - begin != want:
        raise bad(f"data_offsets hold {end - begin} bytes; {dtype} {shape} needs {want}")
    return STensor(name, dtype, tuple(shape), path, data_start + begin, want)
