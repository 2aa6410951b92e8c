"""Which file of a Hugging Face repository a ``:QUANT`` tag names, as llama.cpp picks it
(common/download.cpp: ``find_best_model``, ``get_split_files``).

A tag matches a file whose path contains the tag followed by ``.`` or ``-``, ignoring
case (``:q4_k_m`` finds ``Model-Q4_K_M.gguf`` and ``Model-Q4_K_M-00001-of-00002.gguf``).
Without a tag, Q4_K_M is tried, then Q8_0, then the first model file of the repository.
Only model files count: ``.gguf`` files that are not projectors, importance matrices or
draft heads. Of a split model only the first shard is picked; ``split_files`` then lists
every shard, so a download fetches all of them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

#: tried in this order when the reference names no tag (llama.cpp's default)
DEFAULT_TAGS = ("Q4_K_M", "Q8_0")
# words in a file name that mark a GGUF which is not a model to run on its own
_NOT_MODEL = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)


@dataclass(frozen=True)
class SplitName:
    """What a GGUF file name says: the name without ``-0000i-of-0000n`` and ``.gguf``
    (the tag included), its quantization tag (upper case, '' if none), shard i of n."""

    prefix: str
    tag: str
    index: int
    count: int


def split_name(path: str) -> SplitName | None:
    """The parts of a ``.gguf`` file name, or None for a file that is not one."""
    if not path.endswith(".gguf"):
        return None
    prefix = path[: -len(".gguf")]
    index = count = 1
    if m := _SPLIT.match(prefix):
        prefix, index, count = m.group(1), int(m.group(2)), int(m.group(3))
    m = _TAG.search(prefix)
    return SplitName(prefix, m.group(1).upper() if m else "", index, count)


def is_model_file(path: str) -> bool:
    """A ``.gguf`` file that is a model (not a projector, imatrix or draft head)."""
    name = path.rsplit("/", 1)[-1]
    return path.endswith(".gguf") and not any(word in name for word in _NOT_MODEL)


def _is_later_shard(path: str) -> bool:
    s = split_name(path)
    return s is not None and s.count > 1 and s.index != 1


def pick_model_file(files: Sequence[str], tag: str = "") -> str | None:
    """The model file ``tag`` names in ``files`` (the repository's paths, in the Hub's
    order), by llama.cpp's rule; None when none matches."""
    for t in [tag] if tag else DEFAULT_TAGS:
        pattern = re.compile(re.escape(t) + r"[.-]", re.IGNORECASE)
        for path in files:
            if is_model_file(path) and pattern.search(path) and not _is_later_shard(path):
                return path
    if not tag:
        for path in files:
            if is_model_file(path) and not _is_later_shard(path):
                return path
    return None


def split_files(files: Sequence[str], primary: str) -> list[str]:
    """Every shard of ``primary``'s model in ``files``, in shard order (just ``primary``
    for a file that is not split)."""
    first = split_name(primary)
    if first is None or first.count <= 1:
        return [primary]
    shards = []
    for path in files:
        s = split_name(path)
        if s is not None and s.count == first.count and s.prefix == first.prefix:
            shards.append((s.index, path))
    return [path for _, path in sorted(shards)]


def available_tags(files: Sequence[str]) -> list[str]:
    """The tags of the repository's model files (for an error naming what there is)."""
    tags: list[str] = []
    for path in files:
        s = split_name(path)
        if s is not None and is_model_file(path) and s.tag and s.tag not in tags:
            tags.append(s.tag)
    return tags
