"""The one table of sampling parameters, and what is derived from it.

Each row names a parameter once: its API keyword (also the OpenAI / server JSON field), the
``SamplerParams`` field it sets, its type and its command-line flags. The defaults live in
``SamplerParams`` (llama.cpp's). The CLI options (``add_cli_options``), the API's keyword
checks (``sampler_params``) and the server's type checks (``SAMPLING_FIELDS``) are all
built from this table, so a parameter is added in one place.
"""

from __future__ import annotations

import argparse
import dataclasses
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .sampling import SamplerParams, SamplingError

__all__ = ["PARAMS", "SAMPLING_FIELDS", "Param", "add_cli_options", "cli_sampler_params",
           "cli_stops", "cli_values", "sampler_params"]


@dataclass(frozen=True)
class Param:
    """One sampling parameter: ``name`` (API keyword and JSON field), ``field`` (of
    SamplerParams), ``type`` (int, float or str), ``flags`` (command line), ``help`` and,
    for numbers, the range ``lo``..``hi`` (inclusive) a value must lie in."""

    name: str
    field: str
    type: type
    flags: tuple[str, ...]
    help: str
    lo: float = -(2**31)
    hi: float = 2**31 - 1

    @property
    def default(self) -> Any:
        return _DEFAULTS[self.field]


PARAMS: tuple[Param, ...] = (
    Param("temperature", "temp", float, ("--temp", "--temperature"),
          "temperature; 0 or less: greedy", -100, 100),
    Param("top_k", "top_k", int, ("--top-k",), "keep the K most likely tokens; 0: off"),
    Param("top_p", "top_p", float, ("--top-p",),
          "nucleus sampling: keep probability mass P; 1: off", 0, 1),
    Param("min_p", "min_p", float, ("--min-p",),
          "keep tokens at least P times as likely as the best; 0: off", 0, 1),
    Param("typical_p", "typical_p", float, ("--typical", "--typical-p"),
          "locally typical sampling; 1: off", 0, 1),
    Param("repeat_penalty", "repeat_penalty", float, ("--repeat-penalty",),
          "penalize repeated tokens; 1: off", 1e-3, 1e3),
    Param("repeat_last_n", "repeat_last_n", int, ("--repeat-last-n",),
          "tokens of history the penalties look at; 0: off, -1: all", -1),
    Param("presence_penalty", "presence_penalty", float, ("--presence-penalty",),
          "subtract this from tokens already present", -100, 100),
    Param("frequency_penalty", "frequency_penalty", float, ("--frequency-penalty",),
          "subtract this times a token's count", -100, 100),
    Param("seed", "seed", int, ("-s", "--seed"),
          "random seed, 0..4294967295; -1: a random one (the same seed gives the same text)",
          -1, 2**32 - 1),
    Param("samplers", "samplers", str, ("--samplers", "--sampler-seq", "--sampling-seq"),
          "the chain's steps in order, names separated by ';' (penalties, top_k, typ_p, "
          "top_p, min_p, temperature; dry, top_n_sigma, xtc do nothing here) or "
          "--sampler-seq's letters (ekypmt)"),
    Param("mirostat", "mirostat", int, ("--mirostat",),
          "Mirostat sampling instead of the chain: 1 Mirostat, 2 Mirostat 2.0, 0 off "
          "(temperature still applies first)", 0, 2),
    Param("mirostat_tau", "mirostat_tau", float, ("--mirostat-ent",),
          "Mirostat's target entropy (surprise, in bits)", 0, 100),
    Param("mirostat_eta", "mirostat_eta", float, ("--mirostat-lr",),
          "Mirostat's learning rate", 0, 100),
)

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SamplerParams)}
_DEFAULTS["seed"] = -1
BY_NAME = {p.name: p for p in PARAMS}

# JSON field -> (allowed Python types, description) for the server's request checks
_JSON_TYPES = {int: ((int,), "an integer"), float: ((int, float), "a number"),
               str: ((str, list), "a string or a list of strings")}
SAMPLING_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    p.name: _JSON_TYPES[p.type] for p in PARAMS
}


def sampler_params(values: Mapping[str, Any]) -> SamplerParams:
    """SamplerParams from API keywords (``temperature=...``; None: the default; seed -1:
    random). Unknown names raise TypeError; bad values SamplingError naming the keyword."""
    unknown = set(values) - set(BY_NAME)
    if unknown:
        raise TypeError(f"unexpected argument(s): {', '.join(sorted(unknown))}")
    given = {}
    for name, value in values.items():
        if value is None or (name == "seed" and _is_int(value) and value == -1):
            continue
        given[BY_NAME[name].field] = value
    try:
        params = SamplerParams(**given)
    except SamplingError as e:  # name the keyword the caller used, not the field
        field = e.field or ""
        name = next((p.name for p in PARAMS if p.field == field), field)
        err = SamplingError(str(e).replace(field, name, 1) if field else str(e), name)
        err.param = name or None  # type: ignore[attr-defined]
        raise err from None
    for name, value in values.items():
        if value is not None and BY_NAME[name].type is not str:
            _check_range(BY_NAME[name], value)
    return params


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_range(prm: Param, value: Any) -> None:
    """``value`` is a number of ``prm``'s type within its range (SamplingError naming the
    keyword otherwise): no value reaches the sampler that overflows its arithmetic (a
    history of 2**63 tokens, a penalty that is 0 or infinite as a float32)."""
    ok = not isinstance(value, bool) and isinstance(
        value, numbers.Integral if prm.type is int else numbers.Real)
    if not ok or not prm.lo <= value <= prm.hi:  # NaN fails both comparisons
        what = "an integer" if prm.type is int else "a number"
        err = SamplingError(f"{prm.name} must be {what} in {_num(prm.lo)}..{_num(prm.hi)}, "
                            f"got {value!r}"[:200])
        err.param = prm.name  # type: ignore[attr-defined]
        raise err


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def add_cli_options(p: argparse.ArgumentParser,
                    title: str = "sampling (defaults: llama.cpp's)", stops: bool = True) -> None:
    """Every sampling option (``--temp``, ``--top-k``, ...), in a group of their own, and
    (``stops``) the stop strings (``--stop``, llama.cpp's ``-r/--reverse-prompt``: see
    ``cli_stops``)."""
    g = p.add_argument_group(title)
    for prm in PARAMS:
        g.add_argument(*prm.flags, dest=f"sampling_{prm.name}", type=prm.type, default=None,
                       metavar=_metavar(prm), help=f"{prm.help} (default: {_shown(prm)})")
    if not stops:
        return
    g.add_argument("--stop", "-r", "--reverse-prompt", dest="stop", action="append",
                   default=[], metavar="TEXT",
                   help="end the text where TEXT appears (not included); repeat for more")


def _metavar(prm: Param) -> str:
    word = prm.name.split("_")[-1].upper()
    return {int: word if len(word) <= 4 else "N", float: "X", str: "LIST"}[prm.type]


def _shown(prm: Param) -> str:
    return ";".join(prm.default) if isinstance(prm.default, tuple) else str(prm.default)


def cli_stops(args: argparse.Namespace) -> list[str]:
    """The stop strings ``add_cli_options`` collected (the API's ``stop``)."""
    return list(getattr(args, "stop", None) or [])


def cli_values(args: argparse.Namespace) -> dict[str, Any]:
    """API keywords from the options ``add_cli_options`` added (None: not given)."""
    return {prm.name: getattr(args, f"sampling_{prm.name}") for prm in PARAMS}


def cli_sampler_params(args: argparse.Namespace) -> SamplerParams:
    """SamplerParams from the options ``add_cli_options`` added (SamplingError if bad)."""
    return sampler_params(cli_values(args))


def cli_flag(name: str) -> str:
    """The long command-line flag of API keyword ``name`` (for error messages)."""
    return BY_NAME[name].flags[-1]
