"""The README's Python examples run as written (against the pulled models; the OpenAI
client example needs a server on port 8080 and is left out)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_python_example_runs(index: int, smollm2_path: Path, tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    code = BLOCKS[index]
    if "OpenAI(" in code:
        pytest.skip("needs `gguflm serve` on port 8080")
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    namespace: dict = {"__name__": "readme"}
    try:
        exec(compile(code, f"README.md python block {index}", "exec"), namespace)
    finally:
        for name in ("llm", "engine"):  # stop their engine threads
            if hasattr(namespace.get(name), "close"):
                namespace[name].close()
