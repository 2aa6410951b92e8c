"""Hostile files and paths for the command line (issue 12): outputs that are not regular
files, metadata of the wrong shape, terminal escapes in names, a huge sparse tensor, a full
disk. Each case must end in one clear ``error:`` line (or a summary that says what is
wrong), with nothing lost (existing files unchanged) and nothing left behind (no partial or
temporary files).

The files are made by our writer; the huge tensor's file is sparse (its 9.7 GB of data
occupy no disk). A full disk is a real one where we may mount a small tmpfs (as root), and
otherwise the file-size limit (RLIMIT_FSIZE) of a child process, which fails writes the same
way partway through.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import signal
import socket
import stat
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gguflm.gguf as gguf
from gguflm.cli import main
from gguflm.gguf import ArrayType, GGMLType, GGUFWarning, GGUFWriter, ValueType, WriteError
from gguflm.gguf.summary import _CONTROL, SPECIAL_TOKENS

ESC = "\x1b]0;pwned\x07\x1b[2J"  # retitles the terminal window, then clears the screen


def run(*argv: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def small_model(path: Path, **metadata: object) -> Path:
    w = GGUFWriter(path)
    w.add("general.architecture", "llama")
    for key, value in metadata.items():
        w.add(key.replace("__", "."), value)
    w.add_tensor("token_embd.weight", np.arange(64, dtype=np.float32).reshape(2, 32))
    w.add_tensor("blk.0.attn_q.weight", np.zeros((2, 34), np.uint8), type=GGMLType.Q8_0)
    return w.write()


def leftovers(folder: Path) -> list[str]:
    """Temporary files our atomic writes would leave if they failed to clean up."""
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# -- outputs that exist and are not regular files ------------------------------------------------

def _special_outputs(folder: Path) -> dict[str, tuple[Path, str]]:
    """A FIFO, a socket, a directory, and (as root) a character device like /dev/null."""
    out = {}
    fifo = folder / "fifo"
    os.mkfifo(fifo)
    out["fifo"] = (fifo, "a FIFO")
    sock_path = folder / "sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    sock.close()
    out["socket"] = (sock_path, "a socket")
    (folder / "dir").mkdir()
    out["directory"] = (folder / "dir", "a directory")
    try:
        os.mknod(folder / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null's
        out["device"] = (folder / "null", "a character device")
    except PermissionError:
        pass  # not root: the device case is not possible here (nor is the original bug)
    link = folder / "link-to-fifo"
    link.symlink_to(fifo)
    out["symlink"] = (link, "a FIFO")
    return out


def _snapshot(path: Path) -> tuple[int, int, int]:
    st_ = os.lstat(path)
    return st_.st_mode, st_.st_ino, st_.st_rdev


@pytest.mark.parametrize("command", ["edit", "tensor"])
def test_outputs_that_are_not_regular_files_are_refused(tmp_path: Path, command: str) -> None:
    model = small_model(tmp_path / "m.gguf")
    outs = tmp_path / "outs"
    outs.mkdir()
    cases = _special_outputs(outs)
    for name, (path, kind) in cases.items():
        before = _snapshot(path)
        if command == "edit":
            code, _, err = run("edit", model, "--set", "general.name=x", "-o", path)
        else:
            code, _, err = run("tensor", model, "token_embd.weight", "-o", path)
        assert code == 1, name
        assert err.startswith("error: ") and err.count("\n") == 1, err
        assert f"the output exists and is {kind}, not a regular file" in err, err
        assert _snapshot(path) == before, f"{name} was replaced"
        assert leftovers(outs) == [] and leftovers(path.parent) == []
    if "device" not in cases:
        pytest.skip("the character-device case needs root (mknod); the others passed")


def test_writer_refuses_outputs_that_are_not_regular_files(tmp_path: Path) -> None:
    # the check lives in the shared atomic write: every writer gets it
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    w = GGUFWriter(fifo)
    w.add("general.architecture", "llama")
    with pytest.raises(WriteError, match="exists and is a FIFO"):
        w.write()
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and leftovers(tmp_path) == []
    regular = tmp_path / "regular.gguf"  # a regular file is still replaced, atomically
    regular.write_bytes(b"old")
    GGUFWriter(regular).write()
    assert regular.read_bytes()[:4] == b"GGUF"


# -- metadata of the wrong shape ---------------------------------------------------------------

WRONG_SHAPES = {
    "tokens-scalar": ({"tokenizer.ggml.tokens": ("abc", ValueType.STRING)},
                      "tokenizer.ggml.tokens is string, expected an array of strings"),
    "architecture-array": ({"general.architecture": (["llama", "gemma3"], None)},
                           "general.architecture is array[string], expected a string"),
    "tokens-numeric": ({"tokenizer.ggml.tokens": (np.arange(3, dtype=np.int32), None)},
                       "tokenizer.ggml.tokens is array[int32], expected an array of strings"),
    "head-count-string": ({"llama.attention.head_count": ("nine", None)},
                          "llama.attention.head_count is string, expected an integer or an "
                          "array of integers"),
    "bos-float": ({"tokenizer.ggml.bos_token_id": (1.5, None)},
                  "tokenizer.ggml.bos_token_id is float32, expected an integer"),
}


@pytest.mark.parametrize("case", list(WRONG_SHAPES))
def test_inspect_says_what_is_wrong_with_a_key(tmp_path: Path, case: str) -> None:
    keys, problem = WRONG_SHAPES[case]
    w = GGUFWriter(tmp_path / "m.gguf")
    if "general.architecture" not in keys:
        w.add("general.architecture", "llama")
    w.add("tokenizer.ggml.eos_token_id", 2, ValueType.UINT32)
    for key, (value, mtype) in keys.items():
        w.add(key, value, mtype)
    w.add_tensor("token_embd.weight", np.zeros((3, 32), np.float32))
    path = w.write()

    code, out, err = run("inspect", path, "--tensors")
    assert code == 0 and err == ""
    rows = [ln for ln in out.splitlines() if "problems" in ln]
    assert len(rows) == 1 and rows[0].split("problems", 1)[1].strip() == problem, out

    code, out, err = run("inspect", path, "--json")
    assert code == 0 and err == ""
    d = json.loads(out)  # the whole document, and only it
    assert d["summary"]["problems"] == [problem]
    assert d["summary"]["special_tokens"]["eos"]["id"] == 2
    for key, (value, _) in keys.items():  # the metadata itself is still shown, exactly
        assert d["metadata"][key] == (value.tolist() if isinstance(value, np.ndarray)
                                      else value)


# -- terminal escapes in names and values ------------------------------------------------------

def test_control_characters_are_escaped_for_people_and_exact_in_json(tmp_path: Path) -> None:
    w = GGUFWriter(tmp_path / "m.gguf")
    w.add("general.architecture", "llama")
    w.add("general.name", ESC)
    w.add(f"key{ESC}", f"value{ESC}")
    w.add("tokenizer.ggml.model", "\u202egpt2")  # a bidi override: displays reversed
    w.add_tensor(f"token_embd{ESC}", np.zeros((2, 32), np.float32))
    path = w.write()

    for extra in ([], ["--tensors"], ["--query", "key"]):
        code, out, err = run("inspect", path, *extra)
        assert code == 0
        assert not _CONTROL.search(out.replace("\n", "")), repr(out)
        assert "\\x1b]0;pwned\\x07\\x1b[2J" in out
    code, out, _ = run("inspect", path, "--tensors")
    assert "token_embd\\x1b]0;pwned" in out and "\\u202egpt2" in out

    code, out, _ = run("inspect", path, "--json")
    d = json.loads(out)
    assert d["metadata"][f"key{ESC}"] == f"value{ESC}" and d["summary"]["name"] == ESC
    assert d["tensors"][0]["name"] == f"token_embd{ESC}"
    assert "\x1b" not in out  # JSON escapes it as \u001b: exact, and still terminal-safe

    code, out, err = run("tensor", path, "token_embd", "-o", tmp_path / "x.npy")
    assert code == 1 and "did you mean: token_embd\\x1b]0;pwned\\x07\\x1b[2J?" in err
    assert "\x1b" not in err and not (tmp_path / "x.npy").exists()


# -- a huge sparse tensor ----------------------------------------------------------------------

def _huge_sparse_file(path: Path, n_elements: int) -> Path:
    """A Q4_0 tensor of ``n_elements``: written small, its shape patched in the header, the
    file extended (sparse) to the size the shape needs."""
    w = GGUFWriter(path)
    w.add("general.architecture", "llama")
    w.add_tensor("huge", np.zeros((1, 18), np.uint8), type=GGMLType.Q4_0)  # 32 elements
    w.write()
    data = bytearray(path.read_bytes())
    info = data.index(b"huge") + 4  # then: n_dims u32, dims u64 x n_dims
    assert struct.unpack_from("<I", data, info)[0] == 2
    struct.pack_into("<QQ", data, info + 4, 1 << 17, n_elements >> 17)
    with gguf.open(path) as f:
        start = f.data_offset
    path.write_bytes(bytes(data))
    with open(path, "r+b") as fh:
        fh.truncate(start + n_elements // 32 * 18)
    return path


def _child_limits(address_space: int | None = None, file_size: int | None = None):  # noqa: ANN202
    def apply() -> None:
        if address_space is not None:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
        if file_size is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes fail with EFBIG instead
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
    return apply


def _gguflm(*argv: object, limits=None) -> subprocess.CompletedProcess[str]:  # noqa: ANN001
    return subprocess.run([sys.executable, "-m", "gguflm.cli", *map(str, argv)],
                          capture_output=True, text=True, timeout=600, preexec_fn=limits)


def test_huge_sparse_tensor_is_refused_before_decoding(tmp_path: Path) -> None:
    path = _huge_sparse_file(tmp_path / "huge.gguf", 1 << 34)
    with gguf.open(path) as f:
        assert f.tensors["huge"].n_elements == 1 << 34  # 69 GB as float32
    code, out, _ = run("inspect", path, "--json")
    assert code == 0 and json.loads(out)["summary"]["n_params"] == 1 << 34
    # a child limited to 24 GiB of address space, so that the outcome does not depend on
    # this machine's memory (it must also hold the 9.7 GB mapping of the file)
    res = _gguflm("tensor", path, "huge", "-o", tmp_path / "huge.npy",
                  limits=_child_limits(address_space=24 << 30))
    assert res.returncode == 1, res.stderr
    assert res.stderr.startswith("error: tensor huge has 17,179,869,184 elements: decoding "
                                 "it takes 68.7 GB, more than the "), res.stderr
    assert "--raw" in res.stderr and "Traceback" not in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge.gguf"]


# -- a full disk ---------------------------------------------------------------------------------

def test_tensor_output_on_a_full_disk_leaves_nothing_partial(tmp_path: Path) -> None:
    model = small_model(tmp_path / "m.gguf")
    w = GGUFWriter(tmp_path / "big.gguf")
    w.add("general.architecture", "llama")
    w.add_tensor("big", np.ones((64, 1024), np.float32))  # 256 KiB
    big = w.write()
    out = tmp_path / "out.npy"
    out.write_bytes(b"the previous contents")
    res = _gguflm("tensor", big, "big", "-o", out, limits=_child_limits(file_size=64 << 10))
    assert res.returncode == 1
    assert res.stderr == f"error: cannot write {out}: File too large\n"
    assert out.read_bytes() == b"the previous contents"  # nothing lost
    assert leftovers(tmp_path) == []  # nothing left behind
    # and without the limit the same command works, replacing the old file
    res = _gguflm("tensor", big, "big", "-o", out)
    assert res.returncode == 0, res.stderr
    assert np.array_equal(np.load(out), np.ones((64, 1024), np.float32))
    assert model.exists()


@pytest.fixture
def tiny_disk(tmp_path: Path):  # noqa: ANN201 - a Path
    """A real 256 KiB filesystem (tmpfs), where this process may mount one."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    try:
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                             capture_output=True)
        why = res.stderr.decode().strip() if res.returncode else ""
    except OSError as e:  # no mount command
        why = str(e)
    if why:
        pytest.skip(f"cannot mount a tmpfs here ({why}); the file-size limit test covers the "
                    "same failure")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_edit_on_a_full_disk_leaves_nothing_partial(tmp_path: Path, tiny_disk: Path) -> None:
    w = GGUFWriter(tmp_path / "m.gguf")
    w.add("general.architecture", "llama")
    w.add_tensor("big", np.ones((128, 1024), np.float32))  # 512 KiB: more than the disk
    model = w.write()
    out = tiny_disk / "edited.gguf"
    out.write_bytes(b"the previous contents")
    code, _, err = run("edit", model, "--set", "general.name=x", "-o", out)
    assert code == 1
    assert err == f"error: cannot write {out}: No space left on device\n"
    assert out.read_bytes() == b"the previous contents"
    assert sorted(p.name for p in tiny_disk.iterdir()) == ["edited.gguf"]


# -- the summary on random value types (benchmarks/fuzz_long.py --mode summary, briefly) ---------

_SCALARS = [t for t in ValueType if t != ValueType.ARRAY]
_INT_RANGES = {t: (int(np.iinfo(t.name.lower()).min), int(np.iinfo(t.name.lower()).max))
               for t in _SCALARS if t.name.startswith(("UINT", "INT"))}
_RIGHT: dict[str, object] = {
    "general.architecture": ValueType.STRING, "general.name": ValueType.STRING,
    "general.file_type": ValueType.UINT32, "tokenizer.ggml.tokens": ArrayType(ValueType.STRING),
    "tokenizer.ggml.model": ValueType.STRING, "tokenizer.ggml.add_bos_token": ValueType.BOOL,
    "tokenizer.chat_template": ValueType.STRING,
    **{f"tokenizer.ggml.{n}_token_id": ValueType.UINT32 for n in SPECIAL_TOKENS[:6]},
    "llama.vocab_size": ValueType.UINT32, "llama.block_count": ValueType.UINT32,
    "llama.embedding_length": ValueType.UINT32, "llama.attention.head_count": ValueType.UINT32,
    "llama.attention.head_count_kv": ValueType.UINT32,
    "llama.attention.key_length": ValueType.UINT32,
    "llama.attention.sliding_window_pattern": ArrayType(ValueType.BOOL),
    "llama.final_logit_softcapping": ValueType.FLOAT32,
}
_STRINGS = st.one_of(st.text(max_size=12), st.sampled_from(["llama", ESC, "\u202e", "a\x00b"]),
                     st.binary(max_size=6))


def _values(t: object) -> st.SearchStrategy:
    if isinstance(t, ArrayType):
        items = st.lists(_values(t.elem), max_size=6)
        if t.elem in _INT_RANGES or t.elem in (ValueType.FLOAT32, ValueType.FLOAT64):
            return items.map(lambda xs: np.array(xs, dtype=t.elem.name.lower()))
        return items
    if t == ValueType.STRING:
        return _STRINGS
    if t == ValueType.BOOL:
        return st.booleans()
    if t in (ValueType.FLOAT32, ValueType.FLOAT64):
        return st.floats(width=32)
    lo, hi = _INT_RANGES[t]  # type: ignore[index]
    return st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi, 0, 1, 2]))


_TYPES = st.one_of(st.sampled_from(_SCALARS), st.sampled_from(_SCALARS).map(ArrayType))


@st.composite
def _metadata(draw: st.DrawFn) -> dict[str, tuple[object, object]]:
    out = {}
    for key, right in _RIGHT.items():
        if draw(st.booleans()):
            t = right if draw(st.booleans()) else draw(_TYPES)
            out[key] = (draw(_values(t)), t)
    return out


@settings(max_examples=40, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(metadata=_metadata(), output=st.booleans())
def test_fuzz_summary_of_random_value_types(tmp_path: Path, metadata: dict, output: bool) -> None:
    path = tmp_path / "f.gguf"
    w = GGUFWriter(path)
    for key, (value, mtype) in metadata.items():
        w.add(key, value, mtype)
    w.add_tensor("token_embd.weight", np.zeros((2, 32), np.float32))
    if output:
        w.add_tensor("output.weight", np.zeros((2, 34), np.uint8), type=GGMLType.Q8_0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GGUFWarning)
        w.write()
        for extra in ([], ["--tensors"], ["--json"]):
            code, out, err = run("inspect", path, *extra)
            assert code == 0, err
            if extra == ["--json"]:
                assert out.count("\n") == 1
                summary = json.loads(out)["summary"]
                assert isinstance(summary["problems"], list)
            else:
                assert not _CONTROL.search(out.replace("\n", "")), repr(out)
