"""One file from the Hub into its blob: resumed with ``Range``, checked before it is named.

The bytes go to ``blobs/<etag>.incomplete``. A dropped connection is retried from where it
stopped (``Range: bytes=N-``) a few times; a download interrupted outright (Ctrl-C, a
killed process) leaves the ``.incomplete`` file, and the next download of the same file
continues it. The whole file is hashed while it arrives (the kept part first): only when
its size and hash are the ones the Hub announced (``X-Linked-Size``, ``X-Linked-Etag``: the
sha256 of an LFS file, else the git blob sha1) is it renamed to ``blobs/<etag>``; a
mismatch deletes it, so nothing unchecked is ever under a name that tools read.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..gguf.errors import GGUFError

ProgressFn = Callable[[str, int, int], None]

_CHUNK = 1 << 20
_RETRIES = 5  # tries in a row that bring no new byte before giving up


class DownloadError(GGUFError):
    """A file could not be fetched, or its bytes are not the ones the Hub announced."""


def new_hash(etag: str, size: int) -> Any:
    """The hash the Hub's etag is: sha256 of the bytes (64 hex digits, LFS files) or git's
    blob sha1 (40 hex digits: ``sha1(b"blob <size>\\0" + bytes)``)."""
    if len(etag) == 64:
        return hashlib.sha256()
    h = hashlib.sha1()
    h.update(b"blob %d\0" % size)
    return h


class _Partial:
    """The ``.incomplete`` file being written, how many bytes it holds and their hash so
    far (kept in step as chunks arrive, so that a dropped connection resumes exactly)."""

    def __init__(self, path: Path, etag: str, size: int | None) -> None:
        self.path, self.etag, self.size = path, etag, size
        self.digest = new_hash(etag, size or 0)
        self.have = _hash_existing(path, self.digest, size)
        if self.have == 0:
            self.digest = new_hash(etag, size or 0)
        self.out = open(path, "ab")  # noqa: SIM115 - closed by fetch

    def restart(self) -> None:
        self.out.seek(0)
        self.out.truncate(0)
        self.have, self.digest = 0, new_hash(self.etag, self.size or 0)

    def add(self, chunk: bytes) -> None:
        self.out.write(chunk)
        self.digest.update(chunk)
        self.have += len(chunk)

    def done(self) -> bool:
        return self.size is not None and self.have >= self.size


def fetch(url: str, headers: dict[str, str], dest: Path, etag: str, size: int | None,
          progress: ProgressFn | None = None, label: str = "") -> None:
    """Download ``url`` into ``dest`` (a blob path), resuming ``dest.incomplete``, and
    check it against ``etag``/``size``; a DownloadError when it cannot be fetched or its
    bytes are wrong (the partial file is then deleted)."""
    from huggingface_hub.utils import get_session

    dest.parent.mkdir(parents=True, exist_ok=True)
    part = _Partial(dest.with_name(dest.name + ".incomplete"), etag, size)
    session = get_session()
    transport_error = _transport_error(session)
    tries = 0
    try:
        while not part.done():
            before = part.have
            try:
                _stream(session, url, headers, part, progress, label)
                if size is None:
                    break
                failure = f"the server closed the file after {part.have} of {size} bytes"
            except transport_error as e:
                failure = str(e) or type(e).__name__
            tries = 0 if part.have > before else tries + 1
            if tries >= _RETRIES:
                raise DownloadError(f"{label}: {failure} ({_RETRIES} tries); run again to "
                                    f"continue from {part.have} bytes")
            time.sleep(min(2.0, 0.25 * (tries + 1)))
        part.out.flush()
        os.fsync(part.out.fileno())
    finally:
        part.out.close()
    _check(part, label)
    os.replace(part.path, dest)


def _transport_error(session: Any) -> type[BaseException]:
    """The session library's network error class (httpx and its successors name it so)."""
    module = importlib.import_module(type(session).__module__.split(".")[0])
    return getattr(module, "TransportError", OSError)


def _hash_existing(partial: Path, digest: Any, size: int | None) -> int:
    """Feed the kept bytes of an earlier try to ``digest``; their count (0: start over)."""
    try:
        have = partial.stat().st_size
    except FileNotFoundError:
        return 0
    if have == 0 or (size is not None and have > size):
        partial.unlink()
        return 0
    with open(partial, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return have


def _stream(session: Any, url: str, headers: dict[str, str], part: _Partial,
            progress: ProgressFn | None, label: str) -> None:
    """One GET from ``part.have`` on, appending to ``part``."""
    from huggingface_hub.utils import hf_raise_for_status

    request = dict(headers)
    request["Accept-Encoding"] = "identity"
    if part.have:
        request["Range"] = f"bytes={part.have}-"
    with session.stream("GET", url, headers=request, follow_redirects=True,
                        timeout=60) as response:
        if part.have and response.status_code == 416:  # the kept part is no part of it
            part.restart()
            return
        hf_raise_for_status(response)
        if part.have and response.status_code != 206:  # the server ignored Range
            part.restart()
        elif part.have and not response.headers.get("Content-Range", "").startswith(
                f"bytes {part.have}-"):
            raise DownloadError(f"{label}: asked for bytes {part.have}- and the server sent "
                                f"{response.headers.get('Content-Range')!r}")
        if progress:
            progress(label, part.have, part.size or 0)
        for chunk in response.iter_bytes(_CHUNK):
            if part.size is not None and part.have + len(chunk) > part.size:
                raise DownloadError(f"{label}: the server sent more than the {part.size} "
                                    "bytes the Hub announced")
            part.add(chunk)
            if progress:
                progress(label, part.have, part.size or 0)


def _check(part: _Partial, label: str) -> None:
    """Size and hash as announced, else the partial file is deleted and a DownloadError."""
    got = part.digest.hexdigest()
    if (part.size is not None and part.have != part.size) or got != part.etag:
        part.path.unlink(missing_ok=True)
        what = "sha256" if len(part.etag) == 64 else "git sha1"
        size = part.size if part.size is not None else "?"
        raise DownloadError(f"{label}: the downloaded bytes are not the file the Hub "
                            f"announced ({part.have} bytes, {what} {got}; expected {size} "
                            f"bytes, {part.etag}); the download was discarded")
