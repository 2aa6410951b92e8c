"""Shared fixtures: where the reference data and the pulled models are.

Reference data lives in ../shared/reference (override with GGUFLM_REFERENCE); models in
the cache ($GGUFLM_HOME, else ~/.cache/gguflm), put there by `gguflm pull` (the test
command pulls them first). Missing data skips the tests that need it, saying why.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
REFERENCE = Path(os.environ.get("GGUFLM_REFERENCE", REPO.parent / "shared" / "reference"))

MODEL_FILES = {
    "smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3-270m": "gemma-3-270m-q4_k_m.gguf",
    "all-minilm-l6-v2": "all-MiniLM-L6-v2-F16.gguf",
}


SLOW_TESTS = frozenset(
    line.strip() for line in (Path(__file__).parent / "slow_tests.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests listed in slow_tests.txt ``slow``: ``pytest -m "not slow"`` runs the
    rest, a loop of about two minutes."""
    for item in items:
        if item.nodeid in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)


def cache_dir() -> Path:
    return Path(os.environ.get("GGUFLM_HOME", Path.home() / ".cache" / "gguflm"))


@pytest.fixture(scope="session")
def reference() -> Path:
    if not REFERENCE.is_dir():
        pytest.skip(f"reference data not found at {REFERENCE} (set GGUFLM_REFERENCE)")
    return REFERENCE


def _model(name: str) -> Path:
    path = cache_dir() / MODEL_FILES[name]
    if not path.is_file():
        pytest.skip(f"model {name} not in the cache ({path}); run `gguflm pull {name}`")
    return path


@pytest.fixture(scope="session")
def tiny_llama(reference: Path) -> str:
    """The reference data's tiny random-weight Llama (fast; its text is gibberish)."""
    return str(reference / "tiny-llama-f16" / "tiny-llama-f16.gguf")


def _tiny_arch(reference: Path, arch: str) -> Path:
    path = reference / "arch" / arch / f"tiny-{arch}-f16.gguf"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    return path


@pytest.fixture(scope="session")
def qwen35_path(reference: Path) -> Path:
    """The reference data's tiny random-weight Qwen3.5 (gated delta nets beside attention)."""
    return _tiny_arch(reference, "qwen35")


@pytest.fixture(scope="session")
def gemma4_path(reference: Path) -> Path:
    """The reference data's tiny random-weight Gemma 4 (shared KV layers, per-layer inputs)."""
    return _tiny_arch(reference, "gemma4")


@pytest.fixture(scope="session")
def lfm2_path(reference: Path) -> Path:
    """The reference data's tiny random-weight LFM2 (short convolutions beside attention)."""
    return _tiny_arch(reference, "lfm2")


@pytest.fixture(scope="session")
def granitehybrid_path(reference: Path) -> Path:
    """The reference data's tiny random-weight Granite 4.0-H (Mamba2 layers beside
    attention, experts)."""
    return _tiny_arch(reference, "granitehybrid")


@pytest.fixture(scope="session")
def deepseek2_path(reference: Path) -> Path:
    """The reference data's tiny random-weight DeepSeek-V3 layout (latent attention: a
    latent row cached per position; grouped expert routing)."""
    return _tiny_arch(reference, "deepseek2")


@pytest.fixture(scope="session")
def qwen3moe_path(reference: Path) -> Path:
    """The reference data's tiny random-weight Qwen3-MoE (experts grouped by row)."""
    return _tiny_arch(reference, "qwen3moe")


@pytest.fixture(scope="session")
def gpt_oss_path(reference: Path) -> Path:
    """The reference data's tiny random-weight gpt-oss (sinks, sliding windows, experts)."""
    return _tiny_arch(reference, "gpt-oss")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return _model("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return _model("gemma3-270m")


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    return _model("all-minilm-l6-v2")
