"""Model references that name a Hugging Face repository: ``hf.co/ORG/REPO[:QUANT]``
(ollama's; also ``huggingface.co/...`` and ``https://`` before either),
``hf.co/ORG/REPO/path/file.gguf`` (one file), and llama.cpp's ``-hf ORG/REPO[:QUANT]``
with ``-hff FILE``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..gguf.errors import GGUFError

_PREFIX = re.compile(r"^(?:https?://)?(?:hf\.co|huggingface\.co)/", re.IGNORECASE)
# the Hub's repository names: letters, digits, '-', '_', '.'; no '--' or '..' (they would
# break the cache folder name), at most 96 characters each
_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?$")


class HFError(GGUFError):
    """A Hugging Face model cannot be found, fetched or read from the cache (the message
    says which and what to do)."""


@dataclass(frozen=True)
class HFRef:
    """A repository, the ``:QUANT`` tag or the file wanted in it, and the revision."""

    repo: str
    tag: str = ""
    file: str = ""
    revision: str = "main"

    def __str__(self) -> str:
        rev = f"@{self.revision}" if self.revision != "main" else ""
        what = f"/{self.file}" if self.file else f":{self.tag}" if self.tag else ""
        return f"hf.co/{self.repo}{rev}{what}"


def is_ref(text: str) -> bool:
    """True for ``hf.co/...`` and ``huggingface.co/...`` (a reference, not a path)."""
    return bool(_PREFIX.match(text))


def parse_ref(text: str) -> HFRef:
    """``hf.co/ORG/REPO[@REVISION][:QUANT]`` or ``hf.co/ORG/REPO[@REVISION]/FILE``; an
    HFError saying the accepted forms for anything else."""
    rest = _PREFIX.sub("", text, count=1)
    parts = rest.split("/", 2)
    if len(parts) < 2:
        raise HFError(f"{text!r}: expected hf.co/ORG/REPO[:QUANT] or hf.co/ORG/REPO/FILE.gguf")
    org, name = parts[0], parts[1]
    file = parts[2] if len(parts) == 3 else ""
    tag = ""
    if not file:
        name, _, tag = name.partition(":")
        tag = "" if tag.lower() == "latest" else tag  # ollama's name for "the default"
    name, _, revision = name.partition("@")
    return make_ref(f"{org}/{name}", tag=tag, file=file, revision=revision or "main",
                    given=text)


def repo_ref(repo_with_tag: str, file: str = "") -> HFRef:
    """llama.cpp's ``-hf ORG/REPO[:QUANT]`` (and ``-hff FILE``, which overrides the tag)."""
    repo, _, tag = repo_with_tag.partition(":")
    return make_ref(repo, tag="" if file else tag, file=file, given=repo_with_tag)


def make_ref(repo: str, tag: str = "", file: str = "", revision: str = "main",
             given: str = "") -> HFRef:
    """An HFRef after checking each part (an HFError naming the bad one)."""
    shown = given or repo
    names = repo.split("/")
    if len(names) != 2 or not all(_NAME.match(n) and "--" not in n and ".." not in n
                                  for n in names):
        raise HFError(f"{shown!r}: not a Hugging Face repository (expected ORG/REPO)")
    if tag and not re.fullmatch(r"[A-Za-z0-9_.-]+", tag):
        raise HFError(f"{shown!r}: the quantization tag {tag!r} is not a tag (e.g. Q4_K_M)")
    if not revision or revision.startswith("/") or ".." in revision:
        raise HFError(f"{shown!r}: bad revision {revision!r}")
    return HFRef(repo, tag, file.strip("/"), revision)
