"""`gguflm inspect`: --query filters the tensors listed by --tensors; --layers shows each
layer's tensor types (text grid and JSON)."""

from __future__ import annotations

import json
from pathlib import Path

from gguflm import gguf
from gguflm.cli import main


def test_query_filters_tensors(capsys, gemma3_path: Path) -> None:
    assert main(["inspect", str(gemma3_path), "--tensors", "--query", "attn_q_norm"]) == 0
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.split("\ntensors (", 1)[1].splitlines()[2:]]
    assert listed == [f"blk.{i}.attn_q_norm.weight" for i in range(18)]
    assert "tensors (18 of " in out and "metadata (0 of" in out
    # no metadata key matches, but tensors do: not an error any more
    assert main(["inspect", str(gemma3_path), "--tensors", "--query", "ffn_down", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["metadata"] == {} and len(data["tensors"]) == 18
    assert main(["inspect", str(gemma3_path), "--tensors", "--query", "no-such-thing"]) == 1
    assert "no metadata key or tensor name contains" in capsys.readouterr().err


def test_layers_grid_and_json(capsys, gemma3_path: Path) -> None:
    with gguf.open(gemma3_path) as f:
        types = {t.name: t.type.ggml_name for t in f.tensors.values()}
    assert main(["inspect", str(gemma3_path), "--layers"]) == 0
    out = capsys.readouterr().out
    grid = out.split("layers (tensor types; rows: blk.N)\n", 1)[1].splitlines()
    header = grid[0].split()
    assert header[0] == "layer" and "ffn_down" in header and "attn_norm" not in header
    for row in grid[1:19]:
        cells = row.split()
        il = int(cells[0])
        for kind, t in zip(header[1:], cells[1:], strict=True):
            assert types[f"blk.{il}.{kind}.weight"] == t
    assert "\033[" not in out  # no colour off a terminal
    assert "1-D tensors" in out and "token_embd.weight Q8_0" in out
    # the Q4_K_M mix: ffn_down alternates Q6_K and Q4_K
    downs = {types[f"blk.{i}.ffn_down.weight"] for i in range(18)}
    assert downs == {"Q6_K", "Q4_K"}
    assert main(["inspect", str(gemma3_path), "--layers", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["layers"]
    assert len(data["layers"]) == 18
    assert data["layers"][3]["ffn_down"] == types["blk.3.ffn_down.weight"]
    assert data["other"]["token_embd.weight"] == types["token_embd.weight"]
