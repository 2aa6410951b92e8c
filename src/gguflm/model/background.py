"""A first run's compiled layers, built by a second process while this one generates.

Compiling the team (decoding) and the fused layers (prompts) takes a minute or more on a small
machine, once: numba keeps the machine code on disk. A command that would otherwise make a
newcomer wait for it (``gguflm run``) can instead start a background process that compiles
them into that cache (``Compiling.start``) and run this time on the reference path, whose
kernels compile in seconds (``Plan.defer``): the same numbers bit for bit, more slowly.
The plan switches to the compiled layers as soon as they are in the cache, in this process
(``Plan.waiting``), and later runs load them in about a second.

One background compilation runs at a time on the machine: it holds an exclusive lock on a
file for its whole life (``flock``, released by the system when the process ends however
it ends), and "finished" means the lock is free again. The lock file lives in a folder of
this user's alone (mode 0700, checked), never directly in the shared temporary folder: a
predictable name there would let another local user plant a symlink that makes gguflm
create or truncate a file of theirs choosing.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

CHECK_SECONDS = 0.5  # how often a waiting plan looks at the lock (each look: a system call)
NICE = 10  # the background compiler yields the cores to the generation it runs beside


def lock_path() -> str:
    """The lock file of this installation's numba cache (one per package directory), in
    ``private_folder()``. OSError when there is no such folder."""
    where = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tag = hashlib.sha256(where.encode()).hexdigest()[:12]
    return os.path.join(private_folder(), f"gguflm-compiling-{tag}.lock")


def private_folder() -> str:
    """A folder only this user can write to: ``$XDG_RUNTIME_DIR`` (the session's own, made
    0700 by the login manager) or ``<tmp>/gguflm-<uid>``, made 0700 here. Either is used
    only if it is a real folder (not a symlink) owned by this user and closed to others;
    OSError otherwise (someone else made it first: no lock, so no background compiler)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime) and _is_private(runtime):
        return runtime
    path = os.path.join(tempfile.gettempdir(), f"gguflm-{os.geteuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    if not _is_private(path):
        raise OSError(f"{path} is not a folder of this user's alone")
    return path


def _is_private(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def open_lock() -> int:
    """The lock file, opened without following a symlink and checked to be a regular file
    of this user's. OSError when it cannot be (then there is no background compiler)."""
    fd = os.open(lock_path(), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise OSError("the compilation lock is not a regular file of this user's")
    return fd


def python_child(module: str, function: str, arg: str, **popen: object) -> subprocess.Popen:
    """A quiet child Python running ``module.function(arg)`` (its standard streams closed),
    with ``popen`` passed to ``subprocess.Popen``. OSError when it cannot start."""
    code = f"import sys; from {module} import {function}; {function}(sys.argv[1])"
    return subprocess.Popen([sys.executable, "-c", code, arg], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            **popen)  # type: ignore[arg-type]


class Compiling:
    """A background compilation of a model's compiled layers, started here or by another
    process; ``ready()`` tells the caller whether they can be loaded now."""

    def __init__(self, pid: int | None, cached: Callable[[], bool]) -> None:
        self.pid = pid  # None: another process's compilation, found running
        self._cached = cached
        self._next = 0.0

    @classmethod
    def start(cls, model_path: str, cached: Callable[[], bool], join_only: bool = False
              ) -> Compiling | None:
        """Start compiling the layers of the model in ``model_path`` in a niced background
        process that outlives this one (or join the compilation already running); None
        when no process can be started (then the caller compiles them itself).
        ``join_only``: never start one (a script's run, which leaves nothing running
        after it), but join one in progress rather than compile the same code again."""
        try:
            fd = open_lock()
        except OSError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return cls(None, cached)  # another process is compiling them already
            if join_only:
                return None  # nothing running (closing the file frees the lock again)
            # the child inherits the locked file and holds the lock until it exits
            proc = python_child("gguflm.model.background", "compile_layers", model_path,
                                pass_fds=(fd,), start_new_session=True)
            return cls(proc.pid, cached)
        except OSError:
            return None
        finally:
            os.close(fd)  # ours only: the lock stays while the child's copy is open

    def finished(self) -> bool:
        """Whether the compilation has ended (well or not): its lock is free."""
        try:
            fd = open_lock()
        except OSError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True  # closing the file below releases it again
        except BlockingIOError:
            return False
        finally:
            os.close(fd)

    def ready(self) -> bool | None:
        """True: the compiled layers are in the cache; None: still compiling; False: the
        compilation ended without them. Looks at most every CHECK_SECONDS."""
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + CHECK_SECONDS
        if not self.finished():
            return None
        return self._cached()


def compile_layers(model_path: str) -> None:
    """The background process: compile (or load) the decoding and prompt paths of the model
    in ``model_path`` into numba's disk cache, at a low priority."""
    try:
        os.nice(NICE)
    except OSError:
        pass
    from ..quant import matrix
    from . import load_model

    matrix.entry_point_defaults()
    model = load_model(model_path)
    model.warm_up(prompts=True, join=False)  # (its own lock: nothing to join)
