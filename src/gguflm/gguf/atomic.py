"""Writing a file whole or not at all: a temporary file beside it, renamed over it when done.

Every writer in gguflm goes through ``atomic_write`` (the GGUF writer, ``tensor -o``): a
crash, a full disk or an error midway leaves the old file (or no file) and no temporary
one. Renaming replaces whatever the name pointed to, so a name that exists and is not a
regular file (``/dev/null``, a FIFO, a socket, a directory) is refused up front: running
``gguflm edit MODEL -o /dev/null`` as root would otherwise replace the device node.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from .errors import WriteError

__all__ = ["atomic_write", "check_output_path"]

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"))


def check_output_path(path: str | os.PathLike[str]) -> None:
    """Raise WriteError if ``path`` exists and is not a regular file (through symlinks)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as e:  # a dangling symlink loop, a permission problem: say so now
        raise WriteError(f"cannot use {os.fspath(path)} as the output: {e.strerror or e}",
                         path=os.fspath(path)) from None
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    raise WriteError(f"the output exists and is {kind}, not a regular file: refusing to "
                     "replace it", path=os.fspath(path))


@contextmanager
def atomic_write(path: str | os.PathLike[str], buffering: int = 1 << 20) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s new contents to. On a clean exit it is flushed,
    fsynced, given the mode a new file would get (0666 less the umask) and renamed over
    ``path``; on any exception it is removed and ``path`` is untouched."""
    path = Path(path)
    check_output_path(path)
    folder = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb", buffering=buffering) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _umask() -> int:
    """The process's umask, read without setting it where Linux allows (os.umask is the only
    portable way to read it, and briefly changes it for every thread)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o22)
    os.umask(mask)
    return mask
