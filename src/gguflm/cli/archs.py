"""``gguflm archs [--json]``: the model architectures gguflm can run.

The list is the architecture registry itself (``gguflm.model.archs``), so it is always the
set ``load_model`` accepts: a file whose ``general.architecture`` is not listed fails at
load with an error naming it and this list.
"""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "archs", help="list the model architectures gguflm can run",
        description="List the model architectures gguflm can run (GGUF "
                    "general.architecture values), each with a one-line description.")
    p.add_argument("--json", action="store_true",
                   help="one JSON object: {architecture: description}")
    p.set_defaults(func=run)


def describe() -> dict[str, str]:
    """{architecture: first line of its Model class's docstring}, sorted by name."""
    from ..model import archs

    out = {}
    for name in archs.supported():
        doc = (archs.get(name).__doc__ or "").strip().splitlines()
        out[name] = doc[0].replace("``", "") if doc else ""
    return out


def run(args: argparse.Namespace) -> int:
    table = describe()
    if args.json:
        json.dump(table, sys.stdout)
        sys.stdout.write("\n")
        return 0
    width = max(len(k) for k in table)
    sys.stdout.write("".join(f"{k:<{width}}  {v}\n" for k, v in table.items()))
    return 0
