"""``general.*`` naming keys, as llama.cpp's gguf-py ``Metadata`` derives them.

From ``config.json``'s ``_name_or_path`` (``org/Model-Name-7B-Instruct-v0.2``) and then the
checkpoint folder's name: name (title-cased), organization, basename, finetune, version and
size label; a size label from the parameter count when none was found. (Model cards,
``README.md`` front matter, are not read: gguflm has no YAML parser.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

_VERSION = re.compile(r"(v|iter)?\d+([.]\d+)*", re.IGNORECASE)
_QTYPE = re.compile(r"i?q\d(_\w)*|b?fp?(16|32)", re.IGNORECASE)
_SIZE = re.compile(r"(([A]|\d+[x])?\d+([._]\d+)?[KMBT][\d]?|small|mini|medium|large|x?xl)",
                   re.IGNORECASE)
_FINETUNE = re.compile(r"chat|instruct|vision|lora", re.IGNORECASE)


@dataclass
class Naming:
    name: str | None = None
    organization: str | None = None
    basename: str | None = None
    finetune: str | None = None
    version: str | None = None
    size_label: str | None = None

    def fill(self, other: Naming) -> None:
        for f in fields(self):
            if getattr(self, f.name) is None:
                setattr(self, f.name, getattr(other, f.name))


def id_to_title(s: str) -> str:
    return " ".join(w.title() if w.islower() and not re.match(r"^(v\d+(?:\.\d+)*|\d.*)$", w)
                    else w for w in s.strip().replace("-", " ").split())


def _size_part(part: str, total_params: int, types: set[str]) -> str:
    part = part.replace("_", ".")
    if part[-1].isdecimal():  # bloom-7b1 -> 7.1B
        part = part[:-2] + "." + part[-1] + part[-2]
    if len(part) > 1 and part[-2].isdecimal() and part[-1] in "kmbt":
        part = part[:-1] + part[-1].upper()
    if total_params:
        try:
            label = float(part[:-1]) * pow(1000, " KMBT".find(part[-1]))
            if abs(label - total_params) > 7 * total_params // 8:
                types.add("finetune")  # likely a context length
                part = part[:-1] + part[-1].lower()
        except ValueError:
            pass
    if not types:
        types.add("size_label")
    return part


def _annotate(parts: list[str], total_params: int) -> list[set[str]]:
    types: list[set[str]] = [set() for _ in parts]
    for i, part in enumerate(parts):
        if _VERSION.fullmatch(part):
            types[i].add("version")
        elif _QTYPE.fullmatch(part):
            types[i].add("type")
            parts[i] = part.upper()
        elif i > 0 and _SIZE.fullmatch(part):
            parts[i] = _size_part(part, total_params, types[i])
        elif i > 0 and _FINETUNE.fullmatch(part):
            types[i].add("finetune")
    if any(c.isdecimal() for n, t in zip(parts, types) if "size_label" in t for c in n):
        for n, t in zip(parts, types):
            if "size_label" in t and n.isalpha():
                t.remove("size_label")
    at_start = True
    for part, t in zip(parts, types):
        if at_start and ((not t and part[0].isalpha()) or "version" in t):
            t.add("basename")
        else:
            at_start = False
            if not t:
                t.add("finetune")
    for t in reversed(types):  # a trailing version is not part of the basename
        if "basename" in t and len(t) > 1:
            t.remove("basename")
        else:
            break
    return types


def from_model_id(model_id: str | None, total_params: int) -> Naming:
    """gguf-py's ``get_model_id_components``, as a ``Naming``."""
    if not model_id:
        return Naming()
    if " " in model_id:
        return Naming(name=model_id)
    org, full = model_id.split("/", 1) if "/" in model_id else (None, model_id)
    org_part = None if not org or org.startswith(".") else id_to_title(org)
    parts = [p for p in full.split("-") if p]
    if not parts:
        return Naming(name=id_to_title(full) or None, organization=org_part)
    types = _annotate(parts, total_params)

    def join(kind: str, exclude: str | None = None) -> str | None:
        picked = [p for p, t in zip(parts, types) if kind in t and exclude not in t]
        return "-".join(dict.fromkeys(picked) if kind == "size_label" else picked) or None

    size, finetune, version = join("size_label"), join("finetune"), join("version", "basename")
    basename = join("basename") if (size or finetune or version) else None
    return Naming(name=id_to_title(full), organization=org_part, basename=basename,
                  finetune=finetune, version=version, size_label=size)


def size_label(total_params: int) -> str:
    """gguf-py's ``model_weight_count_rounded_notation`` (dense models)."""
    n = abs(total_params)
    scale, suffix = next(((s, x) for limit, s, x in ((1e12, 1e-12, "T"), (1e9, 1e-9, "B"),
                                                      (1e6, 1e-6, "M")) if n > limit),
                         (1e-3, "K"))
    scaled = n * scale
    fix = max(2 - len(str(round(scaled)).lstrip("0")), 0)
    return f"{scaled:.{fix}f}{suffix}"


def naming(name_or_path: object, dir_name: str, total_params: int) -> Naming:
    """The naming keys for a checkpoint (``_name_or_path`` with at most one ``/`` first)."""
    out = Naming()
    if isinstance(name_or_path, str) and name_or_path.count("/") <= 1:
        out.fill(from_model_id(name_or_path, total_params))
    out.fill(from_model_id(dir_name, total_params))
    if out.size_label is None and total_params > 0:
        out.size_label = size_label(total_params)
    return out
