"""Reading a text file a user named (a chat template, a schema, a prompt) without trusting it.

``read_limited`` refuses, as one ``TextFileError`` naming the path and the problem, what
would otherwise hang or exhaust memory: a path that is not a regular file (a FIFO blocks
its reader until a writer comes, a device such as /dev/zero never ends, a directory),
checked with ``stat`` before anything is opened, also through symbolic links; a file over
the caller's limit, refused from its size before it is read, and read at most one byte past
the limit in case it grew meanwhile; text that is not UTF-8. The command line
(``cli/textfiles.py``) and the library's own readers (chat templates, schema files) share it.
No gguflm import: any layer may use it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import NamedTuple

__all__ = ["GRAMMAR_FILES", "PROMPT_FILES", "TEMPLATE_FILES", "Cap", "MiB", "TextFileError",
           "check_limited", "decode", "over_limit", "read_limited", "size_words"]

MiB = 2**20


class Cap(NamedTuple):
    """The most bytes the files of one kind may hold, and the kind's name in messages."""

    limit: int
    kind: str


PROMPT_FILES = Cap(16 * MiB, "prompt and text files")
GRAMMAR_FILES = Cap(4 * MiB, "grammar and schema files")
TEMPLATE_FILES = Cap(8 * MiB, "chat template files")

# what a path that is not a regular file is, in words
_FILE_TYPES = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
               (stat.S_ISSOCK, "a socket"))


class TextFileError(ValueError):
    """A text file that cannot be used. ``message`` holds ``{where}`` where the file is
    named: its path here, a caller's own words (``--grammar-file PATH``) through ``say``."""

    def __init__(self, path: str | Path, message: str) -> None:
        self.path, self.message = path, message
        super().__init__(self.say(str(path)))

    def say(self, where: str) -> str:
        return self.message.replace("{where}", where)


def size_words(n: int) -> str:
    """A byte count for messages: MiB from a tenth of one, else bytes."""
    return f"{n / MiB:.1f} MiB" if n >= MiB // 10 else f"{n} bytes"


def _limit_words(limit: int) -> str:
    return f"{limit // MiB} MiB" if limit % MiB == 0 else size_words(limit)


def over_limit(path: str | Path, size: str, limit: int, kind: str) -> TextFileError:
    return TextFileError(path, f"{{where}}: {size} is over the {_limit_words(limit)} limit "
                               f"for {kind}")


def _not_regular(path: str | Path, mode: int) -> TextFileError:
    what = next((name for test, name in _FILE_TYPES if test(mode)), "a special file")
    return TextFileError(path, f"{{where}}: not a regular file ({what})")


def check_limited(path: str | Path, limit: int, kind: str) -> os.stat_result:
    """The ``stat`` of ``path`` (symbolic links followed) if it is a regular file of at most
    ``limit`` bytes; a TextFileError otherwise (``kind`` names the files in the message).
    Nothing is opened: a FIFO is refused before any open could wait for its writer."""
    try:
        st = os.stat(path)
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise TextFileError(path, f"cannot read {{where}}: {reason}") from None
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, st.st_mode)
    if st.st_size > limit:
        raise over_limit(path, size_words(st.st_size), limit, kind)
    return st


def read_limited(path: str | Path, limit: int, kind: str, errors: str = "strict") -> str:
    """The UTF-8 text of the regular file ``path``, at most ``limit`` bytes (see the
    module's docstring); ``errors="surrogateescape"`` keeps invalid bytes instead of
    refusing the file. A TextFileError naming the path and the problem."""
    check_limited(path, limit, kind)
    try:
        # O_NONBLOCK: should the path have been swapped for a FIFO since the check, the
        # open does not wait for a writer (and fstat below refuses it)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise _not_regular(path, mode)
            data = f.read(limit + 1)
    except OSError as e:
        raise TextFileError(path, f"cannot read {{where}}: {e.strerror or e}") from None
    if len(data) > limit:
        raise over_limit(path, f"more than {size_words(limit)}", limit, kind)
    return decode(data, path, errors)


def decode(data: bytes, path: str | Path, errors: str = "strict") -> str:
    try:
        return data.decode("utf-8", errors)
    except UnicodeDecodeError as e:
        raise TextFileError(path, f"{{where}} is not UTF-8 text ({e.reason} at byte "
                                  f"{e.start})") from None
