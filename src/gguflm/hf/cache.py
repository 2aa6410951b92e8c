"""The Hugging Face cache layout, shared with ``huggingface_hub`` and llama.cpp, so that a
file one of them fetched is not fetched again by another:

    $HF_HUB_CACHE (else $HF_HOME/hub, else ~/.cache/huggingface/hub)
      models--ORG--REPO/
        blobs/<etag>                  the file's bytes, named by its sha256 (git sha1 for a
                                      file not stored in LFS)
        blobs/<etag>.incomplete       a download in progress (resumed from where it stopped)
        snapshots/<commit>/<path>     a relative symlink to ../../blobs/<etag>
        refs/<revision>               the commit a branch or tag pointed at when last seen
      .locks/models--ORG--REPO/<etag>.lock

The paths are read from the environment on each call (not at import), so a process (or a
test) that sets ``HF_HOME`` sees it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def hub_cache() -> Path:
    """The hub cache folder, as ``huggingface_hub`` finds it."""
    if cache := os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE"):
        return Path(cache).expanduser()
    if home := os.environ.get("HF_HOME"):
        return Path(home).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def repo_folder(repo_id: str) -> Path:
    """``models--ORG--REPO`` in the hub cache."""
    return hub_cache() / ("models--" + repo_id.replace("/", "--"))


def lock_path(repo_id: str, etag: str) -> Path:
    return hub_cache() / ".locks" / ("models--" + repo_id.replace("/", "--")) / f"{etag}.lock"


def is_commit(revision: str) -> bool:
    return bool(_COMMIT.match(revision))


def cached_commit(repo_id: str, revision: str) -> str | None:
    """The commit ``revision`` pointed at when last seen online (a commit hash names
    itself), or None when the cache has never seen it."""
    if is_commit(revision):
        return revision
    try:
        commit = (repo_folder(repo_id) / "refs" / revision).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return commit if is_commit(commit) else None


def write_ref(repo_id: str, revision: str, commit: str) -> None:
    """Remember that ``revision`` points at ``commit`` (for offline use)."""
    if revision == commit:
        return
    ref = repo_folder(repo_id) / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
    tmp.write_text(commit)
    os.replace(tmp, ref)


def snapshot_path(repo_id: str, commit: str, path: str) -> Path:
    return repo_folder(repo_id) / "snapshots" / commit / path


def snapshot_files(repo_id: str, commit: str) -> list[str]:
    """The files of a cached snapshot whose blobs are present, as repository paths."""
    root = repo_folder(repo_id) / "snapshots" / commit
    if not root.is_dir():
        return []
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def blob_path(repo_id: str, etag: str) -> Path:
    return repo_folder(repo_id) / "blobs" / etag


def link_snapshot(repo_id: str, commit: str, path: str, etag: str) -> Path:
    """Point ``snapshots/<commit>/<path>`` at the blob (a relative symlink, as
    ``huggingface_hub`` makes it); the snapshot path."""
    link = snapshot_path(repo_id, commit, path)
    link.parent.mkdir(parents=True, exist_ok=True)
    target = os.path.relpath(blob_path(repo_id, etag), link.parent)
    tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, link)
    return link


def valid_subpath(path: str) -> bool:
    """A repository path that stays inside its snapshot folder (no ``..``, not absolute)."""
    parts = path.split("/")
    return bool(path) and not path.startswith("/") and "\\" not in path and all(
        p not in ("", ".", "..") for p in parts)
