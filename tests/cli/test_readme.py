"""Every code block of the README runs exactly as printed, in order, in an empty folder,
and prints what the README shows after it.

- ```console blocks: each ``$ COMMAND`` line runs in bash (with this venv's ``gguflm`` on
  PATH); the lines after it, up to the next ``$``, are its expected output (stdout, and
  stderr where the command sends it there with ``2>&1``). A command ending in ``&`` is
  started in the background and waited for (a server: until its port answers /health);
  it is stopped at the end.
- ```python blocks run in this process; a ```text block right after one is its expected
  output.
- ```sh blocks are the two commands: ``make run`` runs in the repository (it needs the
  Makefile); ``make test`` is what runs this test, so it is not run again.

In expected output, ``...`` stands for any text (timings); trailing spaces are ignored.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

# the examples run in order, each on what the earlier ones made: all or none (slow)
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
TIMEOUT = 900  # a first run of a command may compile kernels


def _steps() -> list[tuple[str, str, str | None]]:
    """(kind, code, expected output or None) in README order."""
    blocks = BLOCK.findall(README.read_text(encoding="utf-8"))
    steps: list[tuple[str, str, str | None]] = []
    for i, (lang, body) in enumerate(blocks):
        if lang == "python":
            nxt = blocks[i + 1] if i + 1 < len(blocks) else ("", "")
            steps.append(("python", body, nxt[1] if nxt[0] == "text" else None))
        elif lang == "console":
            for chunk in re.split(r"^\$ ", body, flags=re.M)[1:]:
                command, _, out = chunk.partition("\n")
                steps.append(("console", command, out))
        elif lang == "sh":
            for line in body.splitlines():
                command = line.split("#")[0].strip()
                if command:
                    steps.append(("sh", command, None))
        elif lang != "text":
            raise AssertionError(f"README: a ```{lang} block the test does not know how to run")
    return steps


STEPS = _steps()


def _matches(expected: str, got: str) -> bool:
    def norm(text: str) -> str:
        return "\n".join(line.rstrip() for line in text.rstrip().splitlines())
    pattern = re.escape(norm(expected)).replace(re.escape("..."), r"[\s\S]*?")
    return re.fullmatch(pattern, norm(got)) is not None


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The empty folder the examples run in, and the background processes they start."""
    state: dict = {"cwd": tmp_path_factory.mktemp("readme"), "background": []}
    yield state
    for proc in state["background"]:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _background(command: str, state: dict) -> None:
    port = int(m.group(1)) if (m := re.search(r"--port (\d+)", command)) else None
    if port is not None and _port_in_use(port):
        pytest.skip(f"port {port} is taken by another program")
    proc = subprocess.Popen(["bash", "-c", command], cwd=state["cwd"], env=_env(),
                            start_new_session=True, stdout=subprocess.DEVNULL)
    state["background"].append(proc)
    if port is None:
        return
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{command!r} exited with status {proc.returncode}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                state[port] = True
                return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{command!r} did not answer on port {port}")


def _needs_server(code: str, state: dict) -> None:
    for port in re.findall(r"127\.0\.0\.1:(\d+)", code):
        if not state.get(int(port)):
            pytest.skip(f"the README's server on port {port} did not start")


@pytest.mark.parametrize("index", range(len(STEPS)))
def test_readme_example(index: int, folder: dict, smollm2_path: Path) -> None:
    kind, code, expected = STEPS[index]
    if kind == "sh":
        if code == "make test":
            pytest.skip("make test is what runs this test")
        proc = subprocess.run(code, shell=True, cwd=ROOT, env=_env(), capture_output=True,
                              text=True, timeout=TIMEOUT)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return
    if kind == "console" and code.rstrip().endswith("&"):
        _background(code.rstrip()[:-1], folder)
        return
    _needs_server(code, folder)
    if kind == "console":
        proc = subprocess.run(["bash", "-c", code], cwd=folder["cwd"], env=_env(),
                              capture_output=True, text=True, timeout=TIMEOUT)
        assert proc.returncode == 0, f"{code}\n{proc.stderr[-2000:]}"
        got = proc.stdout
    else:
        out = io.StringIO()
        cwd = os.getcwd()
        os.chdir(folder["cwd"])  # files an example writes go to the folder
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(code, f"README.md python block (step {index})", "exec"),
                     {"__name__": "readme"})
        finally:
            os.chdir(cwd)
        got = out.getvalue()
    if expected is not None:
        assert _matches(expected, got), f"{code}\n--- README shows:\n{expected}\n--- got:\n{got}"
