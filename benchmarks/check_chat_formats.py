"""Check gguflm's chat formats against llama.cpp's own results on its templates.

Reads /work/shared/reference/chat/ (or the folder given as the first argument): every
``<name>.jinja`` with its ``<name>.json`` of renders and parses made by llama.cpp. Prints
the render and parse rates and the cases that differ, by template. ``-v`` shows diffs.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gguflm.chatformat import ChatFormat

# ../shared/reference beside the repository, or GGUFLM_REFERENCE (as the tests read it)
REFERENCE = Path(os.environ.get("GGUFLM_REFERENCE", Path(__file__).resolve().parents[2]
                                / "shared" / "reference")) / "chat"
CLOCK = datetime(2026, 1, 15, 12, 0, 0, tzinfo=UTC)


def _kwargs(case: dict[str, Any]) -> dict[str, Any]:
    kwargs = dict(case.get("kwargs") or {})
    if case["case"] == "reasoning_effort_none":  # sent as the request's reasoning_effort
        kwargs["reasoning_effort"] = "none"
    return kwargs


def render_case(fmt: ChatFormat, case: dict[str, Any]) -> str:
    try:
        return fmt.render(case["messages"], tools=case.get("tools"),
                          chat_template_kwargs=_kwargs(case), now=CLOCK)
    except Exception as e:  # noqa: BLE001 - a failure is a mismatch to report
        return f"ERROR {type(e).__name__}: {e}"


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text


def _normal(reply: dict[str, Any], ours: bool) -> dict[str, Any]:
    calls = []
    for c in reply.get("tool_calls") or []:
        f = c["function"] if ours else c
        calls.append((f["name"], _arguments(f["arguments"])))
    return {"content": reply.get("content") or "",
            "reasoning_content": reply.get("reasoning_content") or "", "tool_calls": calls}


def parse_case(fmt: ChatFormat, case: dict[str, Any]) -> tuple[bool, Any]:
    req = case["request"]
    try:
        got = fmt.parse(case["input"], messages=req.get("messages"), tools=req.get("tools"),
                        chat_template_kwargs=req.get("kwargs") or {},
                        partial=case["is_partial"])
    except Exception as e:  # noqa: BLE001 - a failure is a mismatch to report
        return False, f"ERROR {type(e).__name__}: {e}"
    ours = _normal(got, True)
    return ours == _normal(case["expected"], False), ours


def check(folder: Path, verbose: bool = False) -> dict[str, Any]:
    """Counts and failures over every template in ``folder``."""
    stats: dict[str, Any] = {"renders": [0, 0], "parses": [0, 0], "failed": {}}
    for path in sorted(folder.glob("*.jinja")):
        ref = json.loads(path.with_suffix(".json").read_text())
        fmt = ChatFormat(path.read_text())
        bad: list[str] = []
        for case in ref["renders"]:
            if "error" in case:
                continue
            stats["renders"][1] += 1
            out = render_case(fmt, case)
            if out == case["prompt"]:
                stats["renders"][0] += 1
            else:
                bad.append("render:" + case["case"])
                if verbose:
                    print(path.stem, case["case"], _diff(case["prompt"], out))
        for case in ref["parses"]:
            if "error" in case["expected"]:
                continue
            stats["parses"][1] += 1
            ok, ours = parse_case(fmt, case)
            if ok:
                stats["parses"][0] += 1
            else:
                bad.append("parse:" + case["name"])
                if verbose:
                    print(path.stem, case["name"], repr(case["input"][:300]), "\n  want",
                          _normal(case["expected"], False), "\n  got ", ours)
        if bad:
            stats["failed"][f"{path.stem} [{fmt.name}]"] = bad
    return stats


def _diff(want: str, got: str) -> str:
    n = 0
    while n < min(len(want), len(got)) and want[n] == got[n]:
        n += 1
    return f"\n  want {want[max(0, n - 80):n + 120]!r}\n  got  {got[max(0, n - 80):n + 120]!r}"


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "-v"]
    folder = Path(args[0]) if args else REFERENCE
    stats = check(folder, verbose="-v" in sys.argv)
    for name, bad in stats["failed"].items():
        print(f"{name}: {', '.join(bad)}")
    for kind in ("renders", "parses"):
        ok, total = stats[kind]
        print(f"{kind}: {ok}/{total} = {100 * ok / max(total, 1):.1f}%")


if __name__ == "__main__":
    main()
