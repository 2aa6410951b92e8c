"""Opening a checkpoint's files: regular files only, each remembered by identity.

A name in the folder may be a FIFO (opening it for reading would wait for a writer
forever), a device (``/dev/zero`` never ends), a folder or a symlink to any of these: each
is refused by what ``stat`` says it is, before it is opened. Every file a
conversion opens is recorded (device and inode) while ``reading()`` is active, so that the
output can be refused when it is one of them, however it is spelled (a symlink, a hard
link, ``ckpt/./model.safetensors``): the rename that finishes the output would otherwise
replace the checkpoint.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, BinaryIO

from .errors import ConvertError
from .schema import Invalid, Kind

MAX_JSON_BYTES = 64 << 20  # the largest real tokenizer.json files are about 35 MB
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"))
_READ: ContextVar[set[tuple[int, int]] | None] = ContextVar("gguflm_convert_read",
                                                            default=None)


@contextmanager
def reading() -> Iterator[set[tuple[int, int]]]:
    """Record the (device, inode) of every file opened by ``open_input`` in this context."""
    token = _READ.set(set())
    try:
        yield _READ.get()  # type: ignore[misc]
    finally:
        _READ.reset(token)


def kind_of(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_input(path: Path) -> BinaryIO | None:
    """``path`` opened for reading, or None when it does not exist. Anything but a regular
    file (through symlinks) is a ConvertError that says what it is, found by ``stat``
    before opening; the open does not block either (``O_NONBLOCK``), and ``fstat`` checks
    again, in case the name was replaced by a FIFO in between."""
    try:
        _require_regular(os.stat(path), path)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise ConvertError(f"cannot read: {e.strerror or e}", path=str(path)) from None
    except ValueError:  # a NUL in the name
        raise ConvertError("not a file name", path=repr(str(path))) from None
    try:
        st = os.fstat(fd)
        _require_regular(st, path)
    except BaseException:
        os.close(fd)
        raise
    if (read := _READ.get()) is not None:
        read.add((st.st_dev, st.st_ino))
    return os.fdopen(fd, "rb")


def _require_regular(st: os.stat_result, path: Path) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise ConvertError(f"not a regular file: {kind_of(st.st_mode)}", path=str(path))


def read_json(path: Path, required: bool = True, schema: Kind | None = None) -> Any:
    """A JSON file of the checkpoint, or None when it is absent and not ``required``;
    checked against ``schema`` (an error names the file and the field)."""
    f = open_input(path)
    if f is None:
        if required:
            raise ConvertError("missing: the checkpoint has no such file", path=str(path))
        return None
    try:
        with f:
            raw = f.read(MAX_JSON_BYTES + 1)
        if len(raw) > MAX_JSON_BYTES:
            raise ConvertError(f"over {MAX_JSON_BYTES >> 20} MiB of JSON", path=str(path))
        value = json.loads(raw.decode("utf-8"))
    except OSError as e:
        raise ConvertError(f"cannot read: {e.strerror or e}", path=str(path)) from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, and
        # ValueError for integers over 4300 digits
        raise ConvertError(f"cannot read as JSON: {e}", path=str(path)) from None
    if schema is not None:
        check(value, schema, path)
    return value


def check(value: Any, schema: Kind, path: Path, key: str | None = None) -> None:
    """``value`` (read from ``path``, at ``key`` in it) is of kind ``schema``, else a
    ConvertError naming the file and the field."""
    try:
        schema.check(value)
    except Invalid as e:
        if key is not None:
            e.inside(key)
        raise ConvertError(e.reason, path=str(path), key=e.field or None) from None


def same_file_as_input(path: Path, inputs: set[tuple[int, int]]) -> bool:
    """Whether ``path`` (through symlinks) is one of the files recorded by ``reading()``."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return False
    return (st.st_dev, st.st_ino) in inputs
