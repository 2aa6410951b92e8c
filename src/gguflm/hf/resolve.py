"""A Hugging Face model reference -> local GGUF file(s) in the shared cache.

Online, the repository's file list and commit come from ``/api/models/ORG/REPO`` (through
``huggingface_hub``'s ``HfApi``), the file is picked (``tags``), and each of its shards
that the cache lacks is fetched (``download``) after a ``HEAD`` on ``/resolve/`` gives its
size, sha256 and CDN location. A file already in the snapshot is used as it is: a second
run downloads nothing. Offline (``HF_HUB_OFFLINE=1``, or ``--offline``) the same choice is
made from the cached snapshot the revision last pointed at; when the Hub cannot be reached
the cache is used too, with a note.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

from . import cache, tags
from .download import DownloadError, fetch
from .refs import HFError, HFRef

ProgressFn = Callable[[str, int, int], None]
_TRUE = ("1", "on", "yes", "true")


def endpoint() -> str:
    """``$HF_ENDPOINT`` (a mirror, or a test server), else https://huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def offline() -> bool:
    """``HF_HUB_OFFLINE`` (read now, not at import): use the cache, never the network."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def token() -> str | None:
    """``$HF_TOKEN``, else the token ``hf auth login`` stored, else None."""
    if value := os.environ.get("HF_TOKEN"):
        return value
    from huggingface_hub import get_token

    return get_token()


def resolve(ref: HFRef, *, progress: ProgressFn | None = None,
            pattern: str | None = None) -> Path:
    """The local path of the model ``ref`` names, downloading what the cache lacks (every
    shard of a split model). ``pattern``: a file name glob instead of ``ref``'s file/tag
    (``LLM.from_pretrained``'s ``filename``)."""
    files, commit, online = _listing(ref, progress)
    primary = _pick(ref, files, pattern)
    shards = tags.split_files(files, primary)
    _check_shards(ref, primary, shards)
    for path in shards:
        if not cache.valid_subpath(path):
            raise HFError(f"{ref.repo}: unsafe file path {path!r} in the repository")
        link = cache.snapshot_path(ref.repo, commit, path)
        if link.is_file():
            continue
        if not online:
            raise HFError(f"{ref.repo}/{path} is not in the cache ({cache.hub_cache()}) and "
                          f"{_why_offline()}")
        try:
            _download(ref.repo, commit, path, progress)
        except _Unreachable as e:
            raise HFError(f"{ref.repo}/{path}: {endpoint()} cannot be reached ({e})") from None
    return cache.snapshot_path(ref.repo, commit, primary)


def _check_shards(ref: HFRef, primary: str, shards: list[str]) -> None:
    """Every shard of a split model is in the repository (else the download would be a
    model that cannot load)."""
    name = tags.split_name(primary)
    if name is None or name.count <= 1:
        return
    count = name.count
    have = {s.index for s in map(tags.split_name, shards) if s is not None}
    missing = [i for i in range(1, count + 1) if i not in have]
    if missing:
        raise HFError(f"{ref.repo}: {primary} is shard 1 of {count}, but the repository "
                      f"lacks shard(s) {', '.join(map(str, missing))}")


def _why_offline() -> str:
    return ("HF_HUB_OFFLINE is set, so nothing is downloaded" if offline()
            else "the Hub could not be reached")


def _listing(ref: HFRef, progress: ProgressFn | None) -> tuple[list[str], str, bool]:
    """(the repository's files, the commit, whether the Hub answered)."""
    if not offline():
        try:
            files, commit = _remote_listing(ref)
            cache.write_ref(ref.repo, ref.revision, commit)
            return files, commit, True
        except _Unreachable as e:
            if progress:
                progress(f"note: {endpoint()} cannot be reached ({e}); using the cache", 0, 0)
    commit = cache.cached_commit(ref.repo, ref.revision)
    files = cache.snapshot_files(ref.repo, commit) if commit else []
    if not files:
        raise HFError(f"{ref.repo} (revision {ref.revision}) is not in the cache "
                      f"({cache.hub_cache()}) and {_why_offline()}")
    return files, commit, False


class _Unreachable(Exception):
    """The Hub did not answer (no connection, a timeout): the cache may serve."""


def _remote_listing(ref: HFRef) -> tuple[list[str], str]:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint(), token=token())
    with hub_errors(ref.repo, ref.revision):
        info = api.model_info(ref.repo, revision=ref.revision)
    if not info.sha or not cache.is_commit(info.sha):
        raise HFError(f"{endpoint()}: no commit for {ref.repo} at {ref.revision}")
    return [s.rfilename for s in info.siblings or []], info.sha


def _pick(ref: HFRef, files: Sequence[str], pattern: str | None) -> str:
    """The file the reference (or ``pattern``) names; an HFError listing what there is."""
    ggufs = [f for f in files if f.endswith(".gguf")]
    listed = ", ".join(ggufs[:20]) + (f", ... ({len(ggufs)} in all)" if len(ggufs) > 20
                                      else "") if ggufs else "none"
    if pattern is not None:
        found = [f for f in files if fnmatch.fnmatchcase(f, pattern)
                 or fnmatch.fnmatchcase(f.rsplit("/", 1)[-1], pattern)]
        found = [f for f in found if not _later_shard(f)]
        if len(found) != 1:
            how = "no file matches" if not found else f"{len(found)} files match"
            raise HFError(f"{ref.repo}: {how} {pattern!r} (GGUF files: {listed})")
        return found[0]
    if ref.file:
        if ref.file not in files:
            raise HFError(f"{ref.repo} has no file {ref.file!r} (GGUF files: {listed})")
        return ref.file
    picked = tags.pick_model_file(files, ref.tag)
    if picked is None:
        have = ", ".join(tags.available_tags(files)) or "none"
        wanted = (f"the tag {ref.tag!r}" if ref.tag
                  else "any GGUF model file")
        raise HFError(f"{ref.repo} has no file for {wanted} (tags in the repository: "
                      f"{have}; GGUF files: {listed})")
    return picked


def _later_shard(path: str) -> bool:
    s = tags.split_name(path)
    return s is not None and s.count > 1 and s.index != 1


def _download(repo: str, commit: str, path: str, progress: ProgressFn | None) -> None:
    """Fetch ``path`` into its blob (unless another file of the cache has the same blob)
    and link it into the snapshot."""
    from filelock import FileLock
    from huggingface_hub import get_hf_file_metadata
    from huggingface_hub.utils import build_hf_headers

    url = f"{endpoint()}/{repo}/resolve/{commit}/{quote(path)}"
    with hub_errors(repo, commit, path):
        meta = get_hf_file_metadata(url, token=token(), endpoint=endpoint())
    etag = (meta.etag or "").lower()
    if len(etag) not in (40, 64) or any(c not in "0123456789abcdef" for c in etag):
        raise HFError(f"{repo}/{path}: the Hub gave no sha256 or git hash for the file "
                      f"(etag {meta.etag!r}); cannot check the download")
    blob = cache.blob_path(repo, etag)
    lock = cache.lock_path(repo, etag)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock)):
        if not blob.is_file():
            same_host = urlparse(meta.location).netloc == urlparse(url).netloc
            headers = build_hf_headers(token=token() if same_host else False)
            with hub_errors(repo, commit, path):
                fetch(meta.location, headers, blob, etag, meta.size, progress,
                      f"download {repo}/{path}")
    cache.link_snapshot(repo, commit, path, etag)


@contextmanager
def hub_errors(repo: str, revision: str, path: str = "") -> Iterator[None]:
    """``huggingface_hub``'s errors as HFErrors that say what to do; a network failure as
    ``_Unreachable``."""
    from huggingface_hub import errors

    what = f"{repo}/{path}" if path else repo
    try:
        yield
    except DownloadError as e:
        raise HFError(str(e)) from None
    except errors.GatedRepoError:
        given = ("the token given (HF_TOKEN or -hft) has no access to it: accept the "
                 "model's terms on its Hub page with that account" if token() else
                 "set HF_TOKEN (or -hft TOKEN) to a token of an account that accepted the "
                 "model's terms on its Hub page")
        raise HFError(f"{what} is a gated model: {given}") from None
    except errors.RepositoryNotFoundError:
        private = "" if token() else " (a private one needs HF_TOKEN)"
        raise HFError(f"repository {repo} not found on {endpoint()}{private}") from None
    except errors.RevisionNotFoundError:
        raise HFError(f"{repo} has no revision {revision!r}") from None
    except errors.EntryNotFoundError:
        raise HFError(f"{what} not found at revision {revision}") from None
    except errors.HfHubHTTPError as e:
        raise HFError(f"{endpoint()} refused {what}: {_first_line(e)}") from None
    except Exception as e:
        if _is_network_error(e):
            raise _Unreachable(_first_line(e)) from None
        raise


def _is_network_error(e: BaseException) -> bool:
    return any(c.__name__ in ("TransportError", "ConnectionError", "OfflineModeIsEnabled")
               for c in type(e).__mro__)


def _first_line(e: Any) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
