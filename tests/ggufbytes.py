"""A field-by-field GGUF byte builder for tests: it writes exactly what it is told, so that
malformed files (bad counts, types, lengths, offsets) can be made one field at a time.

Independent of gguflm's writer on purpose: a writer bug cannot hide a reader bug here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field


@dataclass
class Enc:
    """Encoders for one GGUF version and byte order."""

    version: int = 3
    bo: str = "<"

    def u32(self, v: int) -> bytes:
        return struct.pack(self.bo + "I", v)

    def u64(self, v: int) -> bytes:
        return struct.pack(self.bo + "Q", v)

    def i64(self, v: int) -> bytes:
        return struct.pack(self.bo + "q", v)

    def count(self, v: int) -> bytes:
        """Counts and lengths: u32 in v1, u64 after."""
        return self.u32(v) if self.version == 1 else self.u64(v)

    def string(self, s: str | bytes, length: int | None = None) -> bytes:
        b = s.encode() if isinstance(s, str) else s
        return self.count(len(b) if length is None else length) + b

    def kv(self, key: str | bytes, vtype: int, payload: bytes) -> bytes:
        return self.string(key) + self.u32(vtype) + payload

    def arr(self, etype: int, n: int, payload: bytes) -> bytes:
        """An array body (no leading ARRAY tag): element type, count, elements."""
        return self.u32(etype) + self.count(n) + payload

    def kv_arr(self, key: str | bytes, etype: int, n: int, payload: bytes) -> bytes:
        return self.kv(key, 9, self.arr(etype, n, payload))

    def tensor_info(self, name: str | bytes, shape: list[int], gtype: int, offset: int,
                    n_dims: int | None = None) -> bytes:
        dims = b"".join(self.u32(d) if self.version == 1 else self.i64(d) for d in shape)
        nd = len(shape) if n_dims is None else n_dims
        return self.string(name) + self.u32(nd) + dims + self.u32(gtype) + self.u64(offset)


@dataclass
class File:
    """A whole file: header fields, then padding and data. Counts default to the lists'."""

    enc: Enc = field(default_factory=Enc)
    kvs: list[bytes] = field(default_factory=list)
    tensors: list[bytes] = field(default_factory=list)
    data: bytes = b""
    magic: bytes = b"GGUF"
    version: int | None = None  # the version field, if not enc.version
    n_kv: int | None = None
    n_tensors: int | None = None
    alignment: int = 32
    pad: bool = True

    def header(self) -> bytes:
        e = self.enc
        v = e.version if self.version is None else self.version
        out = self.magic + e.u32(v)
        out += e.count(len(self.tensors) if self.n_tensors is None else self.n_tensors)
        out += e.count(len(self.kvs) if self.n_kv is None else self.n_kv)
        return out + b"".join(self.kvs) + b"".join(self.tensors)

    def bytes(self) -> bytes:
        h = self.header()
        if self.pad and self.tensors:
            h += b"\0" * (-len(h) % self.alignment)
        return h + self.data
