"""Zero-copy GGUF reader: ``open(path) -> GGUFFile``.

The whole file is memory-mapped once. Metadata is parsed into plain Python values
(numeric arrays as numpy views, string arrays as a lazy sequence); tensor bytes are
never touched until a tensor's ``data`` is asked for. Every length, count and product
is bounds-checked against the bytes left before anything is allocated, and every
problem raises a ``GGUFError`` subclass naming the offset, key or tensor.
"""

from __future__ import annotations

import math
import mmap
import operator
import os
import struct
import warnings
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import (
    GGUFError,
    GGUFWarning,
    MagicError,
    MetadataError,
    TensorDataError,
    TensorInfoError,
    TruncatedError,
    VersionError,
)
from .types import (
    DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    LEGACY_MAGICS,
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
)

INT64_MAX = (1 << 63) - 1
SIZE_MAX = (1 << 64) - 1
MAX_ARRAY_ELEMENTS = 1 << 30  # GGUF_MAX_ARRAY_ELEMENTS in ggml
MAX_NESTING = 64  # arrays of arrays: deeper is surely corrupt (and would exhaust the stack)
# smallest possible encodings, used to bound counts before allocating anything
_MIN_KV_BYTES = {1: 4 + 4 + 1, 2: 8 + 4 + 1, 3: 8 + 4 + 1}
_MIN_TENSOR_BYTES = {1: 4 + 4 + 4 + 8, 2: 8 + 4 + 4 + 8, 3: 8 + 4 + 4 + 8}


_DECODE_CHUNK = 4096  # strings per chunk in StringArray.tolist


class StringArray(Sequence[str]):
    """A metadata array of strings, decoded on access (vocabularies hold 262k of them).

    Strings decode as UTF-8 with ``surrogateescape`` so that any bytes survive a round trip.
    The array holds a view of its own span of the file, so like numeric arrays it stays
    usable (and keeps the mapping alive) after the file is closed. ``width`` is the byte
    width of each length prefix and ``byte_order`` its byte order: a writer using the same
    encoding copies ``encoded()`` verbatim instead of re-encoding every string.
    """

    def __init__(self, span: memoryview, offsets: np.ndarray, width: int = 8,
                 byte_order: str = "<") -> None:
        # offsets[i] is where string i's length prefix starts in span, offsets[-1] the end:
        # one int64 per string is all the index costs (2 MB for a 262k vocabulary)
        self._span = span
        self._offs = offsets
        self.width = width
        self.byte_order = byte_order

    def __len__(self) -> int:
        return len(self._offs) - 1

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = operator.index(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("string array index out of range")
        return str(self._span[int(self._offs[i]) + self.width:int(self._offs[i + 1])],
                   "utf-8", "surrogateescape")

    def __iter__(self) -> Iterator[str]:
        return iter(self.tolist())

    def tolist(self) -> list[str]:
        """Every element decoded: the span copied a chunk at a time, then one slice+decode
        per string. Chunks keep the temporaries small: one copy of a 262k vocabulary's
        span left ~4 MB of freed heap the process kept; speed is the same."""
        w, out = self.width, []
        for c in range(0, len(self), _DECODE_CHUNK):
            offs = self._offs[c:c + _DECODE_CHUNK + 1].tolist()
            base = offs[0]
            raw = self._span[base:offs[-1]].tobytes()
            out += [raw[s + w - base:e - base].decode("utf-8", "surrogateescape")
                    for s, e in zip(offs, offs[1:])]
        return out

    def raw_bytes(self, i: int) -> bytes:
        """Element ``i`` as the exact bytes in the file."""
        return bytes(self._span[int(self._offs[i]) + self.width:int(self._offs[i + 1])])

    def encoded(self) -> memoryview:
        """The elements exactly as encoded in the file (length prefixes included)."""
        return self._span

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-equality semantics, like list

    def __repr__(self) -> str:
        head = ", ".join(repr(s) for s in self[:5])
        more = f", ... +{len(self) - 5} more" if len(self) > 5 else ""
        return f"StringArray([{head}{more}])"


@dataclass
class TensorInfo:
    """One tensor: name, ggml type, shape and where its bytes are.

    ``shape`` is in ggml order (``shape[0]`` is the row length); ``np_shape`` is the
    numpy order (reversed). ``offset`` is relative to the data section, as in the file;
    ``file_offset`` is absolute. ``data`` is a zero-copy numpy view: typed for plain
    types, ``uint8`` of shape ``(*np_shape[:-1], row_bytes)`` for block-quantized types.
    """

    name: str
    type: GGMLType
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    file_offset: int
    info_offset: int = 0  # where the tensor info starts in the file (for error messages)
    _file: GGUFFile | None = field(default=None, repr=False, compare=False)

    @property
    def np_shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.shape))

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def n_rows(self) -> int:
        return self.n_elements // self.shape[0] if self.shape and self.shape[0] else 0

    @property
    def row_bytes(self) -> int:
        return self.type.row_bytes(self.shape[0]) if self.shape else self.type.type_size

    @property
    def data(self) -> np.ndarray:
        if self._file is None:
            raise TensorDataError("file is closed", tensor=self.name)
        return self._file._tensor_view(self)


class GGUFFile(Mapping[str, Any]):
    """An open GGUF file. A mapping of metadata key -> value, plus tensors.

    Use as a context manager, or call ``close()``; views handed out keep the
    mapping alive until they are dropped.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.version = 0
        self.byte_order = "<"
        self.alignment = DEFAULT_ALIGNMENT
        self.data_offset = 0
        self.metadata: dict[str, Any] = {}
        self.types: dict[str, MetaType] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self.warnings: list[str] = []
        self.file_size = 0
        self.shards: list[GGUFFile] = []  # a split model's other shards (split.py)
        self._mm: mmap.mmap | None = None
        self._buf: memoryview | None = None
        try:
            with builtin_open(self.path, "rb") as f:
                self.file_size = os.fstat(f.fileno()).st_size
                if self.file_size == 0:
                    raise TruncatedError("empty file: wanted 4 bytes of magic, 0 left", offset=0)
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._buf = memoryview(self._mm)
            _Parser(self).parse()
        except GGUFError as e:
            self.close()
            raise e.with_path(self.path) from None
        except OSError as e:
            self.close()
            raise GGUFError(f"cannot read file: {e.strerror or e}", path=self.path) from None

    # -- Mapping protocol over metadata --------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        return self.metadata[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.metadata)

    def __len__(self) -> int:
        return len(self.metadata)

    def get_arch_value(self, name: str, default: Any = None) -> Any:
        """``{general.architecture}.name`` or ``default``."""
        arch = self.metadata.get("general.architecture", "")
        return self.metadata.get(f"{arch}.{name}", default)

    # -- tensors ---------------------------------------------------------------------------
    def _tensor_view(self, t: TensorInfo) -> np.ndarray:
        if self._mm is None:
            raise TensorDataError("file is closed", tensor=t.name)
        if t.type in PLAIN_DTYPES:
            dt = np.dtype(PLAIN_DTYPES[t.type]).newbyteorder(self.byte_order)
            arr = np.frombuffer(self._mm, dtype=dt, count=t.n_elements, offset=t.file_offset)
            return arr.reshape(t.np_shape)
        arr = np.frombuffer(self._mm, dtype=np.uint8, count=t.nbytes, offset=t.file_offset)
        return arr.reshape(*t.np_shape[:-1], t.row_bytes)

    def raw_bytes(self, start: int, end: int) -> memoryview:
        """A zero-copy view of file bytes ``[start, end)``."""
        if self._buf is None:
            raise GGUFError("file is closed", path=self.path)
        return self._buf[start:end]

    # -- lifetime --------------------------------------------------------------------------
    def close(self) -> None:
        """Release the mapping. Views handed out (tensor data, numeric arrays) keep it
        mapped until they are dropped; everything else is released now."""
        if self._buf is not None:
            try:
                self._buf.release()
            except BufferError:
                pass  # numpy views of metadata still use it
            self._buf = None
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass  # live numpy views still reference it; unmapped when they go
            self._mm = None
        for t in self.tensors.values():
            t._file = None
        for shard in self.shards:
            shard.close()

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GGUFFile({self.path!r}, version={self.version}, "
                f"{len(self.metadata)} keys, {len(self.tensors)} tensors)")


builtin_open = open


def open(path: str | os.PathLike[str]) -> GGUFFile:  # noqa: A001 - the natural name here
    """Open and validate a GGUF file; raises a ``GGUFError`` subclass if it is malformed.
    The first shard of a split model opens the whole model (``split.attach_shards``)."""
    from .split import attach_shards

    return attach_shards(GGUFFile(path))


class _Parser:
    """Walks the header once, filling a GGUFFile. Every read is bounds-checked."""

    def __init__(self, f: GGUFFile) -> None:
        self.f = f
        self.buf = f._buf
        self.size = f.file_size
        self.pos = 0
        self.bo = "<"
        self.v1 = False
        self.key: str | None = None
        self.tensor: str | None = None

    # -- primitives ------------------------------------------------------------------------
    def need(self, n: int, what: str) -> None:
        left = self.size - self.pos
        if n > left:
            raise TruncatedError(f"{what}: wanted {n} bytes, {max(left, 0)} left",
                                 offset=self.pos, key=self.key, tensor=self.tensor)

    def scalar(self, fmt: str, size: int, what: str) -> Any:
        self.need(size, what)
        (v,) = struct.unpack_from(self.bo + fmt, self.buf, self.pos)
        self.pos += size
        return v

    def u32(self, what: str) -> int:
        return self.scalar("I", 4, what)

    def count(self, what: str) -> int:
        """A u64 count (u32 in v1)."""
        return self.scalar("I", 4, what) if self.v1 else self.scalar("Q", 8, what)

    def string_bytes(self, what: str, cls: type[GGUFError] = MetadataError) -> bytes:
        start = self.pos
        n = self.count(f"{what} length")
        if n > MAX_STRING_BYTES:
            raise cls(f"{what} length {n} exceeds the 1 GiB limit",
                      offset=start, key=self.key, tensor=self.tensor)
        self.need(n, f"{what} bytes")
        b = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return b

    def string(self, what: str) -> str:
        return self.string_bytes(what).decode("utf-8", "surrogateescape")

    def error(self, cls: type[GGUFError], reason: str, offset: int | None = None) -> GGUFError:
        return cls(reason, offset=self.pos if offset is None else offset,
                   key=self.key, tensor=self.tensor)

    # -- header ----------------------------------------------------------------------------
    def parse(self) -> None:
        f = self.f
        self.need(4, "magic")
        magic = bytes(self.buf[0:4])
        if magic != GGUF_MAGIC:
            if magic in LEGACY_MAGICS:
                raise MagicError(f"this is an old {LEGACY_MAGICS[magic]} model file, not GGUF; "
                                 "convert it with llama.cpp's conversion scripts", offset=0)
            raise MagicError(f"bad magic {magic!r}: expected b'GGUF'", offset=0)
        self.pos = 4
        self.need(4, "version")
        version = struct.unpack_from("<I", self.buf, 4)[0]
        if version & 0xFFFF == 0 and version != 0:
            self.bo = ">"  # a big-endian file: the version reads byte-swapped
            version = struct.unpack_from(">I", self.buf, 4)[0]
        self.pos = 8
        if version not in (1, 2, 3):
            raise VersionError(f"unsupported GGUF version {version} (supported: 1, 2, 3)",
                               offset=4)
        f.version = version
        f.byte_order = self.bo
        self.v1 = version == 1

        n_tensors = self.count("tensor count")
        n_kv = self.count("metadata kv count")
        left = self.size - self.pos
        if n_kv * _MIN_KV_BYTES[version] > left:
            raise self.error(TruncatedError, f"metadata kv count {n_kv} cannot fit in the "
                             f"{left} bytes left", offset=self.pos - (4 if self.v1 else 8))
        for _ in range(n_kv):
            self.read_kv()
        self.key = None

        left = self.size - self.pos
        if n_tensors * _MIN_TENSOR_BYTES[version] > left:
            raise TruncatedError(f"tensor count {n_tensors} cannot fit in the {left} bytes left",
                                 offset=8)
        self.read_alignment()
        infos = [self.read_tensor_info() for _ in range(n_tensors)]
        self.tensor = None
        self.layout_tensors(infos)

    def read_kv(self) -> None:
        start = self.pos
        key_b = self.string_bytes("key")
        try:
            key = key_b.decode("utf-8")
        except UnicodeDecodeError:
            raise MetadataError(f"key is not valid UTF-8: {key_b[:64]!r}", offset=start) from None
        if not key:
            raise MetadataError("empty key", offset=start)
        if key in self.f.metadata:
            raise MetadataError("duplicate key", offset=start, key=key)
        self.key = key
        vtype = self.value_type("value type")
        value, mtype = self.read_value(vtype, depth=0)
        self.f.metadata[key] = value
        self.f.types[key] = mtype

    def value_type(self, what: str) -> ValueType:
        at = self.pos
        t = self.u32(what)
        try:
            return ValueType(t)
        except ValueError:
            raise self.error(MetadataError, f"unknown {what} {t} (valid: 0-12)", at) from None

    def read_value(self, vtype: ValueType, depth: int) -> tuple[Any, MetaType]:
        if vtype == ValueType.STRING:
            return self.string("string value"), vtype
        if vtype != ValueType.ARRAY:
            fmt, size = SCALAR_FORMATS[vtype]
            v = self.scalar(fmt, size, f"{vtype.name.lower()} value")
            return (v != 0 if vtype == ValueType.BOOL else v), vtype
        return self.read_array(depth)

    def read_array(self, depth: int) -> tuple[Any, MetaType]:
        """An array value: u32 element type, count, then ``count`` values of that type.

        Elements carry no type tag of their own, also when they are arrays themselves.
        """
        at = self.pos
        etype = self.value_type("array element type")
        n = self.count("array length")
        if n > MAX_ARRAY_ELEMENTS:
            raise self.error(MetadataError, f"array length {n} exceeds ggml's limit of "
                             f"{MAX_ARRAY_ELEMENTS} elements", at)
        left = self.size - self.pos
        if etype in SCALAR_FORMATS:
            size = SCALAR_FORMATS[etype][1]
            if n * size > left:
                raise self.error(TruncatedError, f"array of {n} {etype.name.lower()} needs "
                                 f"{n * size} bytes, {left} left", at)
            dt = np.dtype(SCALAR_DTYPES[etype]).newbyteorder(self.bo)
            arr = np.frombuffer(self.buf, dtype=dt, count=n, offset=self.pos)
            self.pos += n * size
            if etype == ValueType.BOOL:
                arr = arr != 0
            return arr, ArrayType(etype)
        width = 4 if self.v1 else 8
        # the smallest element: a string's length, or a nested array's type and count
        min_elem = width if etype == ValueType.STRING else 4 + width
        if n * min_elem > left:
            raise self.error(TruncatedError, f"array of {n} {etype.name.lower()} needs at least "
                             f"{n * min_elem} bytes, {left} left", at)
        if etype == ValueType.STRING:
            return self.read_string_array(n), ArrayType(etype)
        # arrays of arrays: allowed by the spec, refused by ggml; read them and warn
        if depth == 0:
            msg = (f"key {self.key!r} holds an array of arrays: valid GGUF, but llama.cpp "
                   "will refuse this file")
            self.f.warnings.append(msg)
            warnings.warn(msg, GGUFWarning, stacklevel=5)
        if depth >= MAX_NESTING:
            raise self.error(MetadataError, f"arrays nested more than {MAX_NESTING} deep", at)
        items = []
        # the declared type names the first element's type (each element has its own)
        inner: MetaType = ArrayType(ValueType.UINT8)
        for i in range(n):
            v, t = self.read_array(depth + 1)
            if i == 0:
                inner = t
            items.append(v)
        return items, ArrayType(inner)

    def read_string_array(self, n: int) -> StringArray:
        """Walk n length-prefixed strings, recording where each starts; decode nothing.

        This is the hot loop of opening a model (262k strings for Gemma's vocabulary), so
        the fast path does no per-string checks: lengths are unsigned, so positions only
        grow and ``unpack_from`` fails past the end. Anything odd is re-walked slowly by
        ``_string_array_error`` to name the failing string.
        """
        buf, pos0 = self.buf, self.pos
        width = 4 if self.v1 else 8
        unpack = struct.Struct(self.bo + ("I" if self.v1 else "Q")).unpack_from
        offs = array("q")  # where each length prefix starts, plus the end
        push = offs.append
        pos = pos0
        try:
            for _ in range(n):
                push(pos)
                pos += unpack(buf, pos)[0] + width
        except (struct.error, OverflowError):  # read past the end / a position past int64
            pos = self.size + 1
        if pos > self.size:
            raise self._string_array_error(pos0, n, width, unpack)
        push(pos)
        o = np.frombuffer(offs, dtype=np.int64)
        if n and int(np.diff(o).max()) > MAX_STRING_BYTES + width:
            raise self._string_array_error(pos0, n, width, unpack)
        o -= pos0  # relative to the array's own span
        self.pos = pos
        return StringArray(buf[pos0:pos], o, width, self.bo)

    def _string_array_error(self, pos: int, n: int, width: int, unpack: Any) -> GGUFError:
        """The precise error for a string array the fast walk found to be malformed."""
        size = self.size
        for i in range(n):
            if pos + width > size:
                self.pos = pos
                return self.error(TruncatedError, f"string {i} of {n}: wanted {width} bytes of "
                                  f"length, {size - pos} left")
            (ln,) = unpack(self.buf, pos)
            if ln > MAX_STRING_BYTES:
                self.pos = pos
                return self.error(MetadataError, f"string {i} of {n}: length {ln} exceeds the "
                                  "1 GiB limit")
            if ln > size - pos - width:
                self.pos = pos
                return self.error(TruncatedError, f"string {i} of {n}: wanted {ln} bytes, "
                                  f"{size - pos - width} left")
            pos += width + ln
        return self.error(GGUFError, f"string array of {n} is malformed")  # not reached

    def read_alignment(self) -> None:
        md, types = self.f.metadata, self.f.types
        if "general.alignment" not in md:
            return
        a, t = md["general.alignment"], types["general.alignment"]
        if t != ValueType.UINT32:
            raise MetadataError(f"general.alignment must be uint32, found {t}",
                                key="general.alignment")
        if a == 0 or a & (a - 1):
            raise MetadataError(f"general.alignment must be a non-zero power of two, found {a}",
                                key="general.alignment")
        self.f.alignment = a

    def read_tensor_info(self) -> TensorInfo:
        start = self.pos
        self.tensor = None
        name_b = self.string_bytes("tensor name", TensorInfoError)
        try:
            name = name_b.decode("utf-8")
        except UnicodeDecodeError:
            raise TensorInfoError(f"tensor name is not valid UTF-8: {name_b[:64]!r}",
                                  offset=start) from None
        self.tensor = name
        if len(name_b) > MAX_NAME_BYTES:
            raise self.error(TensorInfoError, f"name is {len(name_b)} bytes; ggml allows at most "
                             f"{MAX_NAME_BYTES}", start)
        if name in self.f.tensors:
            raise self.error(TensorInfoError, "duplicate tensor name", start)
        at = self.pos
        n_dims = self.u32("n_dims")
        if n_dims > MAX_DIMS:
            raise self.error(TensorInfoError, f"n_dims {n_dims} exceeds {MAX_DIMS}", at)
        shape = []
        for d in range(n_dims):
            at = self.pos
            ne = self.scalar("I", 4, f"ne[{d}]") if self.v1 else self.scalar("q", 8, f"ne[{d}]")
            if ne < 0:
                raise self.error(TensorInfoError, f"ne[{d}] = {ne} is negative", at)
            shape.append(ne)
        full = shape + [1] * (MAX_DIMS - len(shape))
        # ggml's check: the running element count must stay representable in int64
        count = full[0]
        for ne in full[1:]:
            if ne > 1 and INT64_MAX // ne < count:
                raise self.error(TensorInfoError, f"element count of shape {shape} overflows "
                                 "int64", at)
            count *= ne
        at = self.pos
        tid = self.u32("tensor type")
        try:
            gtype = GGMLType(tid)
        except ValueError:
            raise self.error(TensorInfoError, f"unknown ggml type id {tid}", at) from None
        if gtype.removed:
            raise self.error(TensorInfoError, f"ggml type id {tid} ({gtype.ggml_name}) was "
                             "removed from ggml and cannot be loaded", at)
        if full[0] % gtype.block_size:
            raise self.error(TensorInfoError, f"row length ne[0] = {full[0]} is not a multiple "
                             f"of {gtype.ggml_name}'s block size {gtype.block_size}", at)
        nbytes = gtype.nbytes(full)
        if nbytes > SIZE_MAX - (self.f.alignment - 1):
            raise self.error(TensorInfoError, f"size of shape {shape} in bytes ({nbytes}) "
                             "overflows size_t", at)
        offset = self.scalar("Q", 8, "tensor data offset")
        t = TensorInfo(name=name, type=gtype, shape=tuple(shape), offset=offset, nbytes=nbytes,
                       file_offset=0, info_offset=start)
        self.f.tensors[name] = t
        return t

    def layout_tensors(self, infos: list[TensorInfo]) -> None:
        f = self.f
        align = f.alignment
        f.data_offset = self.pos
        if infos:
            f.data_offset = align_up(self.pos, align)
            if f.data_offset > self.size:
                raise TruncatedError(f"the data section would start at {f.data_offset}, past "
                                     f"the end of the file ({self.size} bytes)", offset=self.pos)
        expected = 0
        for t in infos:
            if t.offset != expected:
                raise TensorInfoError(f"data offset {t.offset} is not the expected {expected} "
                                      "(offsets must be the aligned running sum of tensor sizes)",
                                      offset=t.info_offset, tensor=t.name)
            expected += align_up(t.nbytes, align)
            t.file_offset = f.data_offset + t.offset
            end = t.file_offset + t.nbytes
            if end > self.size:
                raise TensorDataError(f"data [{t.file_offset}, {end}) runs past the end of the "
                                      f"file ({self.size} bytes): {end - self.size} bytes missing",
                                      offset=t.file_offset, tensor=t.name)
            t._file = f
