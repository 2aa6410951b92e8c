"""Split GGUF files, as llama.cpp's ``gguf-split`` writes them: ``NAME-00001-of-00003.gguf``
holds all the metadata and the first tensors, the other shards only the three split keys
and their tensors. Every shard carries ``split.no`` (u16, from 0), ``split.count`` (u16)
and ``split.tensors.count`` (i32, the tensors of all shards).

``attach_shards`` (called by ``reader.open``) makes the first shard a whole model: the
other shards are opened (each memory-mapped on its own, nothing copied) and their tensors
join the first shard's ``tensors``. ``split_file``/``merge_files`` write what
``llama-gguf-split --split``/``--merge`` write, byte for byte: the same key order (ggml
re-appends a key it sets, so ``split.count``, set last, ends the list), version 3, the
same shard boundaries.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import GGUFError
from .types import DEFAULT_ALIGNMENT, ValueType, align_up

if TYPE_CHECKING:
    from .reader import GGUFFile, TensorInfo
    from .writer import GGUFWriter

SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"
SPLIT_KEYS = (SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS)
MAX_SHARDS = 99999  # five digits in the name
_SHARD_NAME = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")


class SplitError(GGUFError):
    """A split model is incomplete or inconsistent (a shard missing, misnumbered, from
    another model), or a split cannot be made as asked."""


def shard_path(prefix: str | os.PathLike[str], index: int, count: int) -> Path:
    """``PREFIX-0000i-of-0000n.gguf`` for shard ``index`` (from 0), as llama.cpp names it."""
    return Path(f"{os.fspath(prefix)}-{index + 1:05d}-of-{count:05d}.gguf")


def shard_prefix(path: str | os.PathLike[str], index: int, count: int) -> str | None:
    """The prefix of shard ``index`` of ``count``'s file name, or None when the name does
    not end in that shard's ``-0000i-of-0000n.gguf``."""
    text = os.fspath(path)
    suffix = f"-{index + 1:05d}-of-{count:05d}.gguf"
    return text[: -len(suffix)] if text.endswith(suffix) and len(text) > len(suffix) else None


def split_info(f: GGUFFile) -> tuple[int, int] | None:
    """(shard number from 0, shard count) of a shard of a split model, else None (a file
    with no split keys, or a merged one: count 0)."""
    count = f.metadata.get(SPLIT_COUNT)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        return None
    no = f.metadata.get(SPLIT_NO)
    if not isinstance(no, int) or isinstance(no, bool) or not 0 <= no < count:
        raise SplitError(f"{SPLIT_NO} is {no!r}; a shard of {count} needs 0 to {count - 1}",
                         key=SPLIT_NO)
    return no, count


def attach_shards(first: GGUFFile) -> GGUFFile:
    """``first`` with the tensors of the other shards of its model (a file that is not
    split is returned as it is); a SplitError naming the shard that is missing or wrong."""
    info = split_info(first)
    if info is None or info[1] == 1:
        return first
    no, count = info
    try:
        if no != 0:
            first_name = _first_name(first.path, no, count)
            raise SplitError(f"this is shard {no + 1} of {count} of a split model: load the "
                             f"first shard ({first_name})", path=first.path)
        prefix = shard_prefix(first.path, 0, count)
        if prefix is None:
            raise SplitError(f"shard 1 of a {count}-shard model, but the file name does not "
                             f"end in -00001-of-{count:05d}.gguf, so the other shards cannot "
                             "be found (rename it as gguf-split named it)", path=first.path)
        for index in range(1, count):
            first.shards.append(_open_shard(first, shard_path(prefix, index, count), index,
                                            count))
        _check_total(first)
    except BaseException:
        first.close()
        raise
    return first


def _first_name(path: str, no: int, count: int) -> str:
    prefix = shard_prefix(path, no, count)
    return os.fspath(shard_path(prefix, 0, count)) if prefix else "its -00001-of- file"


def _open_shard(first: GGUFFile, path: Path, index: int, count: int) -> GGUFFile:
    from .reader import GGUFFile

    if not path.is_file():
        raise SplitError(f"shard {index + 1} of {count} is missing: {path}", path=first.path)
    shard = GGUFFile(path)
    try:
        info = split_info(shard)
        if info != (index, count):
            got = "no split keys" if info is None else f"shard {info[0] + 1} of {info[1]}"
            raise SplitError(f"expected shard {index + 1} of {count}, the file says {got}",
                             path=path)
        total = first.metadata.get(SPLIT_TENSORS)
        if shard.metadata.get(SPLIT_TENSORS) != total:
            raise SplitError(f"{SPLIT_TENSORS} is {shard.metadata.get(SPLIT_TENSORS)!r}, the "
                             f"first shard says {total!r}: a shard of another model?",
                             path=path, key=SPLIT_TENSORS)
        for name, t in shard.tensors.items():
            if name in first.tensors:
                raise SplitError("tensor also in an earlier shard", path=path, tensor=name)
            first.tensors[name] = t
    except BaseException:
        shard.close()
        raise
    return shard


def _check_total(first: GGUFFile) -> None:
    total = first.metadata.get(SPLIT_TENSORS)
    if total is not None and total != len(first.tensors):
        raise SplitError(f"the shards hold {len(first.tensors)} tensors; {SPLIT_TENSORS} "
                         f"says {total}", path=first.path, key=SPLIT_TENSORS)


# -- writing ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class SplitPlan:
    """Which tensors go to each shard (an empty first shard: ``--no-tensor-first-split``)."""

    shards: list[list[str]]


def plan_split(src: GGUFFile, max_tensors: int = 128, max_size: int | None = None,
               no_tensor_first_split: bool = False) -> SplitPlan:
    """gguf-split's boundaries: a new shard every ``max_tensors`` tensors, or (``max_size``)
    before the tensor that would take the shard's padded tensor bytes past it."""
    shards: list[list[str]] = [[]]
    if no_tensor_first_split:
        shards.append([])
    current = 0
    for i, t in enumerate(src.tensors.values()):
        n = align_up(t.nbytes, DEFAULT_ALIGNMENT)
        if max_size is not None:
            cut = current + n > max_size
        else:
            cut = i > 0 and i % max_tensors == 0
        if cut:
            if not shards[-1]:
                raise SplitError("a shard would hold no tensor: the size or tensor limit is "
                                 f"too small (tensor {t.name} is {t.nbytes} bytes)")
            shards.append([])
            current = n
        else:
            current += n
        shards[-1].append(t.name)
    if len(shards) > MAX_SHARDS:
        raise SplitError(f"{len(shards)} shards; at most {MAX_SHARDS}")
    return SplitPlan(shards)


def _set_last(w: GGUFWriter, key: str, value: Any, vtype: ValueType) -> None:
    """Set ``key`` as ggml does: removed, then appended (it moves to the end)."""
    if key in w:
        w.delete(key)
    w.add(key, value, vtype)


def split_file(src: GGUFFile, prefix: str | os.PathLike[str], plan: SplitPlan,
               progress: Callable[[int, int, Path], None] | None = None) -> list[Path]:
    """Write ``src`` as the shards of ``plan`` (``PREFIX-0000i-of-0000n.gguf``); the paths.
    ``progress(i, n, path)`` before each shard."""
    from .writer import GGUFWriter

    count = len(plan.shards)
    total = len(src.tensors)
    paths = []
    for index, names in enumerate(plan.shards):
        path = shard_path(prefix, index, count)
        if progress:
            progress(index, count, path)
        w = GGUFWriter(path, version=3)
        if index == 0:
            for key, value in src.metadata.items():
                _set_last(w, key, value, src.types[key])
        _set_last(w, SPLIT_NO, index, ValueType.UINT16)
        _set_last(w, SPLIT_COUNT, 0, ValueType.UINT16)
        _set_last(w, SPLIT_TENSORS, total, ValueType.INT32)
        _set_last(w, SPLIT_COUNT, count, ValueType.UINT16)
        for name in names:
            w.add_tensor(name, src.tensors[name])
        paths.append(w.write())
    return paths


def merge_files(first: GGUFFile, out: str | os.PathLike[str]) -> Path:
    """Write the split model ``first`` (opened whole by ``reader.open``) as one file, as
    ``llama-gguf-split --merge`` does: the first shard's metadata with ``split.count`` 0
    (so that the result is not taken for a shard), then every shard's tensors in order."""
    from .writer import GGUFWriter

    if split_info(first) is None:
        raise SplitError(f"not a shard of a split model (no {SPLIT_COUNT})", path=first.path)
    w = GGUFWriter(out, version=3)
    for key, value in first.metadata.items():
        _set_last(w, key, value, first.types[key])
    _set_last(w, SPLIT_COUNT, 0, ValueType.UINT16)
    t: TensorInfo
    for t in first.tensors.values():
        w.add_tensor(t.name, t)
    return w.write()
