"""GGUFWriter: metadata + tensors -> a GGUF file, written to a temporary file and renamed.

Values keep their exact GGUF types (pass ``GGUFFile.types[key]`` when copying); tensors are
raw bytes of any ggml type, numpy arrays, or ``TensorInfo`` views of an open file, streamed
to disk without holding the file in memory. Layout is ggml's: header, key-values, tensor
infos, zero padding to the alignment, then each tensor at the aligned running offset and
padded to the alignment. ``GGUFWriter.from_file(src, path).write()`` reproduces a
well-formed file byte for byte.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .atomic import atomic_write
from .errors import WriteError
from .reader import MAX_ARRAY_ELEMENTS, GGUFFile, StringArray, TensorInfo
from .types import (
    DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    MAX_DIMS,
    MAX_NAME_BYTES,
    MAX_STRING_BYTES,
    PLAIN_DTYPES,
    SCALAR_DTYPES,
    SCALAR_FORMATS,
    ArrayType,
    GGMLType,
    MetaType,
    ValueType,
    align_up,
    type_name,
)

_CHUNK = 16 << 20  # tensor bytes are streamed in slices of this size

# numpy dtype (kind, itemsize) -> value type, for arrays whose type is not given
_DTYPE_VALUE_TYPES = {
    ("u", 1): ValueType.UINT8, ("i", 1): ValueType.INT8, ("u", 2): ValueType.UINT16,
    ("i", 2): ValueType.INT16, ("u", 4): ValueType.UINT32, ("i", 4): ValueType.INT32,
    ("f", 4): ValueType.FLOAT32, ("b", 1): ValueType.BOOL, ("u", 8): ValueType.UINT64,
    ("i", 8): ValueType.INT64, ("f", 8): ValueType.FLOAT64,
}
# numpy dtype (kind, itemsize) -> tensor type, for arrays whose type is not given
_DTYPE_TENSOR_TYPES = {
    ("f", 4): GGMLType.F32, ("f", 2): GGMLType.F16, ("f", 8): GGMLType.F64,
    ("i", 1): GGMLType.I8, ("i", 2): GGMLType.I16, ("i", 4): GGMLType.I32,
    ("i", 8): GGMLType.I64,
}
_INT_RANGES = {
    t: (int(np.iinfo(SCALAR_DTYPES[t]).min), int(np.iinfo(SCALAR_DTYPES[t]).max))
    for t in (ValueType.UINT8, ValueType.INT8, ValueType.UINT16, ValueType.INT16,
              ValueType.UINT32, ValueType.INT32, ValueType.UINT64, ValueType.INT64)
}


def infer_type(value: Any) -> MetaType:
    """The GGUF type a Python value is written as when no type is given.

    bool -> BOOL, int -> INT32 (INT64/UINT64 when it does not fit), float -> FLOAT32 (the
    convention llama.cpp's converters use), str/bytes -> STRING, numpy arrays by dtype,
    lists by their elements; nested sequences become arrays of arrays.
    """
    if isinstance(value, (bool, np.bool_)):
        return ValueType.BOOL
    if isinstance(value, np.generic):
        key = (value.dtype.kind, value.dtype.itemsize)
        if key in _DTYPE_VALUE_TYPES:
            return _DTYPE_VALUE_TYPES[key]
        raise WriteError(f"no GGUF type for numpy {value.dtype}")
    if isinstance(value, int):
        for t in (ValueType.INT32, ValueType.INT64, ValueType.UINT64):
            lo, hi = _INT_RANGES[t]
            if lo <= value <= hi:
                return t
        raise WriteError(f"integer {value} does not fit in 64 bits")
    if isinstance(value, float):
        return ValueType.FLOAT32
    if isinstance(value, (str, bytes)):
        return ValueType.STRING
    if isinstance(value, StringArray):
        return ArrayType(ValueType.STRING)
    if isinstance(value, np.ndarray):
        key = (value.dtype.kind, value.dtype.itemsize)
        if value.ndim != 1 or key not in _DTYPE_VALUE_TYPES:
            raise WriteError(f"no GGUF array type for a {value.ndim}-d numpy {value.dtype} array")
        return ArrayType(_DTYPE_VALUE_TYPES[key])
    if isinstance(value, (list, tuple)):
        if not value:
            raise WriteError("cannot infer the element type of an empty array; pass type=")
        if all(isinstance(v, (str, bytes)) for v in value):
            return ArrayType(ValueType.STRING)
        if all(isinstance(v, (list, tuple, np.ndarray, StringArray)) for v in value):
            return ArrayType(infer_type(value[0]))
        if all(isinstance(v, (bool, np.bool_)) for v in value):
            return ArrayType(ValueType.BOOL)
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value):
            lo, hi = min(value), max(value)
            for t in (ValueType.INT32, ValueType.INT64, ValueType.UINT64):
                if _INT_RANGES[t][0] <= lo and hi <= _INT_RANGES[t][1]:
                    return ArrayType(t)
            raise WriteError("array integers do not fit in 64 bits")
        if all(isinstance(v, (int, float, np.integer, np.floating)) for v in value):
            return ArrayType(ValueType.FLOAT32)
        raise WriteError("cannot infer one GGUF type for a list of mixed values; pass type=")
    raise WriteError(f"no GGUF type for a value of type {type(value).__name__}")


@dataclass
class _Tensor:
    name: str
    type: GGMLType
    shape: tuple[int, ...]  # ggml order
    nbytes: int
    source: Any  # np.ndarray (converted at write time) or a buffer of exactly nbytes


class GGUFWriter:
    """Collects metadata and tensors, then ``write()`` lays the file out in one pass.

    ``version`` 1, 2 or 3 and ``byte_order`` ``"<"`` or ``">"`` choose the encoding.
    The alignment is ``general.alignment`` if set (a u32 power of two), else 32.
    ``pad_header``: pad the header to the alignment even when there are no tensors
    (ggml and gguf-py do; some vocabulary-only files are not padded).
    """

    def __init__(self, path: str | os.PathLike[str], *, version: int = 3,
                 byte_order: str = "<", pad_header: bool = True) -> None:
        if version not in (1, 2, 3):
            raise WriteError(f"cannot write GGUF version {version} (supported: 1, 2, 3)")
        if byte_order not in ("<", ">"):
            raise WriteError(f"byte order must be '<' or '>', not {byte_order!r}")
        self.path = Path(path)
        self.version = version
        self.byte_order = byte_order
        self.pad_header = pad_header
        self._kv: dict[str, tuple[MetaType, Any]] = {}
        self._tensors: dict[str, _Tensor] = {}
        self._width = 4 if version == 1 else 8  # counts, string and array lengths, dims
        self._count = struct.Struct(byte_order + ("I" if version == 1 else "Q"))
        self._u32 = struct.Struct(byte_order + "I")

    @classmethod
    def from_file(cls, src: GGUFFile, path: str | os.PathLike[str]) -> GGUFWriter:
        """A writer holding all of ``src``'s metadata (exact types) and tensors (raw views),
        in the file's own version and byte order: ``write()`` then reproduces the file."""
        pad = bool(src.tensors) or src.file_size > src.data_offset
        w = cls(path, version=src.version, byte_order=src.byte_order, pad_header=pad)
        for key, value in src.metadata.items():
            w.add(key, value, src.types[key])
        for t in src.tensors.values():
            w.add_tensor(t.name, t)
        return w

    # -- metadata ------------------------------------------------------------------------------
    def add(self, key: str, value: Any, type: MetaType | None = None) -> None:  # noqa: A002
        """Add a key; ``type`` defaults to ``infer_type(value)``. Duplicates are an error."""
        if key in self._kv:
            raise WriteError("duplicate key", key=key)
        self.set(key, value, type)

    def set(self, key: str, value: Any, type: MetaType | None = None) -> None:  # noqa: A002
        """Add or replace a key (a replaced key keeps its place in the file)."""
        if not isinstance(key, str) or not key:
            raise WriteError(f"keys must be non-empty strings, not {key!r}")
        try:
            mtype = infer_type(value) if type is None else type
            value = _check_value(value, mtype)
        except WriteError as e:
            raise e.located(key=key) from None
        if key == "general.alignment":
            if mtype != ValueType.UINT32 or value == 0 or value & (value - 1):
                raise WriteError(f"general.alignment must be a uint32 power of two, not "
                                 f"{value!r} ({type_name(mtype)})", key=key)
        self._kv[key] = (mtype, value)

    def delete(self, key: str) -> None:
        """Remove a key (an error if it is absent)."""
        if key not in self._kv:
            raise WriteError("no such key", key=key)
        del self._kv[key]

    def __contains__(self, key: str) -> bool:
        return key in self._kv

    @property
    def keys(self) -> list[str]:
        return list(self._kv)

    @property
    def alignment(self) -> int:
        entry = self._kv.get("general.alignment")
        return int(entry[1]) if entry else DEFAULT_ALIGNMENT

    # -- tensors -------------------------------------------------------------------------------
    def add_tensor(self, name: str, data: Any, *, type: GGMLType | None = None,  # noqa: A002
                   shape: Sequence[int] | None = None) -> None:
        """Add a tensor.

        ``data`` is a ``TensorInfo`` (copied raw), a numpy array in numpy order (plain
        types inferred from the dtype: F32, F16, F64, I8-I64; pass ``type=GGMLType.BF16``
        for uint16 bits or float32 values to round), or the raw bytes of any ggml type
        (``bytes``/``memoryview``/uint8 array) with ``type`` and ``shape`` in ggml order.
        A uint8 array of shape ``(*rows, row_bytes)``, as ``TensorInfo.data`` gives for block
        types, needs only ``type``. A callable (with ``type`` and ``shape``) is called when
        the tensor is written and returns its raw bytes: a file of computed tensors (such as
        ``quant.quantize_file``'s) is then made one tensor at a time.
        """
        if name in self._tensors:
            raise WriteError("duplicate tensor name", tensor=name)
        if not isinstance(name, str):
            raise WriteError(f"tensor names must be strings, not {name!r}")
        try:
            nb = len(name.encode("utf-8"))
        except UnicodeEncodeError:
            raise WriteError("tensor name is not valid UTF-8", tensor=name) from None
        if nb > MAX_NAME_BYTES:
            raise WriteError(f"name is {nb} bytes; ggml allows at most {MAX_NAME_BYTES}",
                             tensor=name)
        try:
            t = _make_tensor(name, data, type, shape)
        except WriteError as e:
            raise e.located(tensor=name) from None
        self._tensors[name] = t

    # -- output --------------------------------------------------------------------------------
    def write(self, progress: Callable[[int, int], None] | None = None) -> Path:
        """Write the file: a temporary file in the target folder, renamed into place
        (``atomic_write``: refuses a path that exists and is not a regular file).

        ``progress(done, total)`` is called as tensor bytes are written.
        Returns the path written.
        """
        with atomic_write(self.path) as f:
            self._write_to(f, progress)
        return self.path

    def _write_to(self, f: Any, progress: Callable[[int, int], None] | None) -> None:
        align = self.alignment
        count = self._count.pack
        u32 = self._u32.pack
        f.write(GGUF_MAGIC)
        f.write(u32(self.version))
        f.write(count(len(self._tensors)))
        f.write(count(len(self._kv)))
        for key, (mtype, value) in self._kv.items():
            self._write_string(f, key.encode("utf-8"))
            self._write_typed(f, mtype, value)
        offset = 0
        for t in self._tensors.values():
            self._write_string(f, t.name.encode("utf-8"))
            f.write(u32(len(t.shape)))
            for ne in t.shape:
                if self.version == 1 and ne > 0xFFFFFFFF:
                    raise WriteError(f"dimension {ne} does not fit GGUF v1's u32", tensor=t.name)
                f.write(count(ne) if self.version == 1 else struct.pack(self.byte_order + "q", ne))
            f.write(u32(int(t.type)))
            f.write(struct.pack(self.byte_order + "Q", offset))
            offset += align_up(t.nbytes, align)
        if self._tensors or self.pad_header:
            _pad(f, align)
        total = sum(t.nbytes for t in self._tensors.values())
        done = 0
        for t in self._tensors.values():
            for chunk in _tensor_chunks(t, self.byte_order):
                f.write(chunk)
                done += len(chunk)
                if progress is not None:
                    progress(done, total)
            _pad(f, align)

    # -- value encoding ------------------------------------------------------------------------
    def _write_string(self, f: Any, b: bytes) -> None:
        f.write(self._count.pack(len(b)))
        f.write(b)

    def _write_typed(self, f: Any, mtype: MetaType, value: Any) -> None:
        """A value with its type tag (a key's value)."""
        if isinstance(mtype, ArrayType):
            f.write(self._u32.pack(int(ValueType.ARRAY)))
            self._write_array(f, mtype, value)
            return
        f.write(self._u32.pack(int(mtype)))
        self._write_scalar(f, mtype, value)

    def _write_scalar(self, f: Any, vtype: ValueType, value: Any) -> None:
        if vtype == ValueType.STRING:
            self._write_string(f, value)
            return
        fmt, _ = SCALAR_FORMATS[vtype]
        f.write(struct.pack(self.byte_order + fmt, value))

    def _write_array(self, f: Any, mtype: ArrayType, value: Any) -> None:
        """An array body (element type, count, elements): also the encoding of an element
        of an array of arrays, which carries no tag of its own."""
        elem = mtype.elem
        u32, count = self._u32.pack, self._count.pack
        if isinstance(elem, ArrayType):
            f.write(u32(int(ValueType.ARRAY)))
            f.write(count(len(value)))
            for item_type, item in value:  # as resolved by _check_array
                self._write_array(f, item_type, item)
            return
        f.write(u32(int(elem)))
        f.write(count(len(value)))
        if elem == ValueType.STRING:
            if isinstance(value, StringArray) and value.width == self._width and \
                    value.byte_order == self.byte_order:
                f.write(value.encoded())  # copied verbatim: no decode/encode of 262k strings
                return
            pack = self._count.pack
            f.write(b"".join(pack(len(b)) + b for b in _string_items(value)))
            return
        dt = np.dtype(SCALAR_DTYPES[elem]).newbyteorder(self.byte_order)
        f.write(memoryview(np.ascontiguousarray(value.astype(dt, copy=False))).cast("B"))


# -- helpers -----------------------------------------------------------------------------------

def _pad(f: Any, align: int) -> None:
    pos = f.tell()
    f.write(b"\0" * (align_up(pos, align) - pos))


def _string_items(value: Iterable[Any]) -> Iterable[bytes]:
    for s in value:
        yield s if isinstance(s, bytes) else s.encode("utf-8", "surrogateescape")


def _check_nested_item(item: Any, declared: ArrayType) -> tuple[ArrayType, Any]:
    """One element of an array of arrays, with its own type: every element carries its
    element type in the file, so they may differ. A numpy array or StringArray keeps the
    type it has; a list takes the declared type, or its own if it does not fit that."""
    if isinstance(item, (np.ndarray, StringArray)):
        t = infer_type(item)
        return t, _check_array(item, t)  # type: ignore[arg-type]
    try:
        return declared, _check_array(item, declared)
    except WriteError:
        if not item:
            raise
        t = infer_type(item)
        return t, _check_array(item, t)  # type: ignore[arg-type]


def _check_value(value: Any, mtype: MetaType) -> Any:
    """Validate ``value`` against ``mtype``; returns it in the form the encoder writes."""
    if isinstance(mtype, ArrayType):
        return _check_array(value, mtype)
    if not isinstance(mtype, ValueType) or mtype == ValueType.ARRAY:
        raise WriteError(f"not a value type: {mtype!r}")
    if mtype == ValueType.STRING:
        if isinstance(value, bytes):
            b = value
        elif isinstance(value, str):
            b = _encode_string(value)
        else:
            raise WriteError(f"string value expected, got {type(value).__name__}")
        if len(b) > MAX_STRING_BYTES:
            raise WriteError(f"string of {len(b)} bytes exceeds the 1 GiB limit")
        return b
    if mtype == ValueType.BOOL:
        if isinstance(value, (bool, np.bool_)) or value in (0, 1):
            return bool(value)
        raise WriteError(f"bool value expected, got {value!r}")
    if mtype in (ValueType.FLOAT32, ValueType.FLOAT64):
        if isinstance(value, (int, float, np.integer, np.floating)) and \
                not isinstance(value, (bool, np.bool_)):
            return _checked_float(value, mtype)
        raise WriteError(f"{mtype.name.lower()} value expected, got {value!r}")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise WriteError(f"{mtype.name.lower()} value expected, got {value!r}")
    lo, hi = _INT_RANGES[mtype]
    if not lo <= int(value) <= hi:
        raise WriteError(f"{value} does not fit in {mtype.name.lower()} [{lo}, {hi}]")
    return int(value)


def _encode_string(value: str) -> bytes:
    """UTF-8 (surrogate escapes, as os.fsdecode makes them, back to their bytes)."""
    try:
        return value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as e:
        raise WriteError(f"string is not valid UTF-8 (a lone surrogate at {e.start}: "
                         f"{value[max(0, e.start - 10):e.start + 10]!r})") from None


def _checked_float(value: Any, mtype: ValueType) -> float:
    """``value`` as the float the encoder packs, refused now if it cannot be packed: the
    packing at write time would raise OverflowError (inf and nan are packable)."""
    try:
        x = float(value)
        struct.pack("<" + SCALAR_FORMATS[mtype][0], x)
    except OverflowError:
        shown = f"an integer of {value.bit_length()} bits" if isinstance(value, int) else \
            repr(value)  # (repr fails past 4300 digits)
        raise WriteError(f"{shown} does not fit in {mtype.name.lower()}") from None
    return x


def _check_array(value: Any, mtype: ArrayType) -> Any:
    elem = mtype.elem
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise WriteError(f"{mtype} value expected, got {type(value).__name__}")
    if len(value) > MAX_ARRAY_ELEMENTS:
        raise WriteError(f"array of {len(value)} elements exceeds ggml's limit")
    if isinstance(elem, ArrayType):
        return [_check_nested_item(v, elem) for v in value]
    if elem == ValueType.ARRAY:
        raise WriteError("an array's element type cannot be a bare ARRAY; use ArrayType")
    if elem == ValueType.STRING:
        if isinstance(value, StringArray):
            return value
        items = list(value)
        for i, s in enumerate(items):
            if not isinstance(s, (str, bytes)):
                raise WriteError(f"array[string] holds a {type(s).__name__}")
            if isinstance(s, str) and not s.isascii():
                try:
                    _encode_string(s)
                except WriteError as e:
                    raise WriteError(f"element {i}: {e.reason}") from None
        return items
    target = np.dtype(SCALAR_DTYPES[elem])
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as e:
        raise WriteError(f"cannot make a {mtype} from the value: {e}") from None
    if arr.ndim != 1:
        if arr.size == 0:
            return np.zeros(0, dtype=target)
        raise WriteError(f"{mtype} value must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=target)
    kind = arr.dtype.kind
    if elem == ValueType.BOOL:
        if kind == "b" or (kind in "iu" and bool(np.isin(arr, (0, 1)).all())):
            return arr.astype(np.uint8)
        raise WriteError(f"{mtype} values must be bools")
    if target.kind == "f":
        if kind not in "biuf":
            raise WriteError(f"{mtype} values must be numbers, got {arr.dtype}")
        if kind == "f" and arr.dtype.itemsize > target.itemsize:
            big = np.abs(arr[np.isfinite(arr)]) > np.finfo(target).max
            if big.any():  # the cast at write time would make them inf
                raise WriteError(f"{mtype} values must fit in {target}: "
                                 f"{arr[np.isfinite(arr)][big][0]!r} does not")
        return arr
    if kind not in "iu":
        raise WriteError(f"{mtype} values must be integers, got {arr.dtype}")
    lo, hi = _INT_RANGES[elem]
    if int(arr.min()) < lo or int(arr.max()) > hi:
        raise WriteError(f"{mtype} values must lie in [{lo}, {hi}]")
    return arr


def _make_tensor(name: str, data: Any, gtype: GGMLType | None,
                 shape: Sequence[int] | None) -> _Tensor:
    if isinstance(data, TensorInfo):
        if data._file is None:
            raise WriteError("the source file is closed")
        src = data._file.raw_bytes(data.file_offset, data.file_offset + data.nbytes)
        return _Tensor(name, data.type, tuple(data.shape), data.nbytes, src)
    if callable(data):
        if gtype is None or shape is None:
            raise WriteError("a tensor made at write time needs type= and shape=")
        gtype = GGMLType(gtype)
        gshape = _check_shape(shape, gtype)
        return _Tensor(name, gtype, gshape, gtype.nbytes(gshape), data)
    if isinstance(data, np.generic):
        data = np.asarray(data)  # a numpy scalar: a 0-d tensor
    if gtype is not None:
        gtype = GGMLType(gtype)
        if gtype.removed:
            raise WriteError(f"ggml type {gtype.ggml_name} was removed from ggml")
    if isinstance(data, np.ndarray) and data.dtype != np.uint8 or \
            isinstance(data, np.ndarray) and gtype in (None, GGMLType.I8):
        return _array_tensor(name, data, gtype, shape)
    # raw encoded bytes of a tensor of type gtype
    if gtype is None:
        raise WriteError("raw tensor bytes need type=")
    raw = memoryview(np.ascontiguousarray(data) if isinstance(data, np.ndarray) else data)
    raw = raw.cast("B") if raw.format != "B" or raw.ndim != 1 else raw
    if shape is None:
        if not (isinstance(data, np.ndarray) and data.ndim >= 1):
            raise WriteError("raw tensor bytes need shape= (ggml order)")
        row = data.shape[-1]
        if row % gtype.type_size:
            raise WriteError(f"row of {row} bytes is not a whole number of {gtype.ggml_name} "
                             f"blocks ({gtype.type_size} bytes)")
        shape = (row // gtype.type_size * gtype.block_size, *reversed(data.shape[:-1]))
    gshape = _check_shape(shape, gtype)
    nbytes = gtype.nbytes(gshape)
    if raw.nbytes != nbytes:
        raise WriteError(f"{gtype.ggml_name} tensor of shape {list(shape)} needs {nbytes} "
                         f"bytes, got {raw.nbytes}")
    return _Tensor(name, gtype, gshape, nbytes, raw)


def _array_tensor(name: str, arr: np.ndarray, gtype: GGMLType | None,
                  shape: Sequence[int] | None) -> _Tensor:
    key = (arr.dtype.kind, arr.dtype.itemsize)
    if gtype is None:
        if key not in _DTYPE_TENSOR_TYPES:
            raise WriteError(f"no ggml type for numpy {arr.dtype}; pass type=")
        gtype = _DTYPE_TENSOR_TYPES[key]
    if gtype == GGMLType.BF16:
        if arr.dtype.kind == "f":
            arr = to_bf16_bits(arr)
        elif key != ("u", 2):
            raise WriteError(f"BF16 needs uint16 bits or float values, got {arr.dtype}")
    elif gtype in PLAIN_DTYPES:
        want = np.dtype(PLAIN_DTYPES[gtype])
        if want.kind == "f" and arr.dtype.kind not in "iuf" or \
                want.kind == "i" and arr.dtype.kind not in "iu":
            raise WriteError(f"cannot write numpy {arr.dtype} as {gtype.ggml_name}")
        if want.kind == "i" and arr.size and arr.dtype != want:
            info = np.iinfo(want)
            if int(arr.min()) < info.min or int(arr.max()) > info.max:
                raise WriteError(f"values do not fit {gtype.ggml_name}")
    else:
        raise WriteError(f"{gtype.ggml_name} is a block type: pass its raw bytes as uint8")
    gshape = tuple(int(d) for d in reversed(arr.shape))
    if shape is not None and tuple(shape) != gshape:
        if int(np.prod(shape)) != arr.size:
            raise WriteError(f"shape {list(shape)} does not match the array's {list(gshape)}")
        gshape = tuple(int(d) for d in shape)
    gshape = _check_shape(gshape, gtype)
    return _Tensor(name, gtype, gshape, gtype.nbytes(gshape), arr)


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float -> bfloat16 bits, rounding to nearest even; NaNs stay (quiet) NaNs, as ggml."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    return np.where(nan, ((u >> 16) | 64).astype(np.uint16), r)


def _check_shape(shape: Sequence[int], gtype: GGMLType) -> tuple[int, ...]:
    shape = tuple(int(d) for d in shape)
    if len(shape) > MAX_DIMS:
        raise WriteError(f"{len(shape)} dimensions; ggml allows at most {MAX_DIMS}")
    if any(d < 0 for d in shape):
        raise WriteError(f"negative dimension in {list(shape)}")
    if shape and shape[0] % gtype.block_size:
        raise WriteError(f"row length {shape[0]} is not a multiple of {gtype.ggml_name}'s "
                         f"block size {gtype.block_size}")
    return shape


def _tensor_chunks(t: _Tensor, bo: str) -> Iterable[memoryview]:
    src = t.source
    if callable(src):  # made now: raw bytes of exactly the declared size
        made = src()
        src = memoryview(np.ascontiguousarray(made).reshape(-1).view(np.uint8)
                         if isinstance(made, np.ndarray) else made).cast("B")
        if src.nbytes != t.nbytes:
            raise WriteError(f"made {src.nbytes} bytes, expected {t.nbytes}", tensor=t.name)
    elif isinstance(src, np.ndarray):
        if t.type in PLAIN_DTYPES:
            dt = np.dtype(PLAIN_DTYPES[t.type]).newbyteorder(bo)
            src = np.ascontiguousarray(src.astype(dt, copy=False))
        src = memoryview(src.reshape(-1)).cast("B")
    for start in range(0, t.nbytes, _CHUNK):
        yield src[start:start + _CHUNK]
