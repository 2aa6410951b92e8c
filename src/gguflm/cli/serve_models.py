"""``gguflm serve`` with several models: ``-m`` repeated, ``--models-dir DIR`` or
``--models-config FILE`` give the models, ``--ttl``, ``--max-loaded`` and ``--mem-budget``
how many stay loaded (``gguflm.model_pool``). docs/server.md, "Several models", has the
config file's format."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from . import CLIError, UsageError

__all__ = ["add_pool_options", "model_names", "parse_size", "pool_for", "read_config"]

# a split model's shards: only the first is served (it loads the others)
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
# a config file's per-model keys: LLM keyword (or the spec's own field), value type
CONFIG_KEYS: dict[str, tuple[str, tuple[type, ...]]] = {
    "model": ("model", (str,)), "aliases": ("aliases", (list,)), "ttl": ("ttl", (int, float)),
    "n_ctx": ("n_ctx", (int,)), "ctx_size": ("n_ctx", (int,)),
    "parallel": ("parallel", (int,)), "threads": ("threads", (int,)),
    "chat_template": ("chat_template", (str,)), "kv_cache_type": ("kv_cache_type", (str,)),
    "n_batch": ("n_batch", (int,)), "pooling": ("pooling", (str,)),
    "lookup": ("lookup", (int,)), "max_queue": ("max_queue", (int,)),
}
_SIZE = re.compile(r"(\d+(?:\.\d*)?)\s*([kmgt]?)(i?b?)", re.IGNORECASE)


def add_pool_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "several models", "serve several models (the request's 'model' picks one): each is "
        "loaded on first use and unloaded when idle or when another needs its room")
    g.add_argument("--models-dir", metavar="DIR",
                   help="serve every .gguf file in DIR (of a split model, its first shard)")
    g.add_argument("--models-config", metavar="FILE",
                   help="serve the models a JSON or TOML file names, each with its own "
                        "options and aliases (docs/server.md)")
    g.add_argument("--ttl", type=float, default=300.0, metavar="SECONDS",
                   help="unload a model idle this long (default: 300; negative: never); "
                        "Ollama's keep_alive sets it per request")
    g.add_argument("--max-loaded", "--models-max", type=int, default=None, metavar="N",
                   help="models loaded at once at most (default, and 0: as many as "
                        "--mem-budget holds)")
    g.add_argument("--mem-budget", metavar="BYTES",
                   help="memory the loaded models may take, estimated as each file plus its "
                        "full KV cache (suffixes K, M, G, T: powers of 1024; default: the "
                        "memory available when the server starts)")


def several_models(args: argparse.Namespace) -> bool:
    return bool(len(model_names(args)) > 1 or args.models_dir or args.models_config)


def model_names(args: argparse.Namespace) -> list[str]:
    """The models given by MODEL and ``-m`` (in that order)."""
    return [*([args.model] if args.model else []), *args.model_flags]


def parse_size(text: str) -> int:
    """Bytes from ``"8G"``, ``"512MiB"``, ``"1.5g"`` or ``"1000000"`` (powers of 1024);
    a UsageError otherwise."""
    m = _SIZE.fullmatch(text.strip())
    if not m:
        raise UsageError(f"--mem-budget must be a size such as 8G or 512M, got {text!r}")
    power = " kmgt".index(m.group(2).lower() or " ")
    return int(float(m.group(1)) * 1024**power)


def read_config(path: str) -> list[tuple[str, dict[str, Any]]]:
    """(name, settings) of each model a config file names: ``{"models": {NAME: {...}}}`` in
    JSON, or ``[models.NAME]`` tables in TOML (by the file's suffix: .toml, else JSON).
    Relative paths are the file's directory's. A CLIError names the file and the key at
    fault."""
    import tomllib

    from ..textfile import TEMPLATE_FILES, TextFileError, read_limited

    try:  # a regular UTF-8 file within a chat template's cap
        text = read_limited(path, *TEMPLATE_FILES)
    except TextFileError as e:
        raise CLIError(e.say(f"--models-config {e.path}")) from None
    try:
        data = tomllib.loads(text) if path.endswith(".toml") else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as e:
        raise CLIError(f"--models-config {path}: not valid "
                       f"{'TOML' if path.endswith('.toml') else 'JSON'}: {e}") from None
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, dict) or not models:
        raise CLIError(f"--models-config {path}: expected a 'models' table of models by name")
    base = Path(path).parent
    out = []
    for name, settings in models.items():
        where = f"--models-config {path}: models.{name}"
        if not isinstance(settings, dict):
            raise CLIError(f"{where}: expected a table of settings")
        for key, value in settings.items():
            if key not in CONFIG_KEYS:
                raise CLIError(f"{where}: unknown key '{key}' (known: "
                               f"{', '.join(CONFIG_KEYS)})")
            types = CONFIG_KEYS[key][1]
            if isinstance(value, bool) or not isinstance(value, types):
                raise CLIError(f"{where}.{key}: expected {types[0].__name__}, got {value!r}")
        if "model" not in settings:
            raise CLIError(f"{where}: 'model' (a GGUF file or a known model name) is required")
        settings = {CONFIG_KEYS[k][0]: v for k, v in settings.items()}
        for key in ("model", "chat_template"):
            if key in settings and (base / settings[key]).exists():
                settings[key] = str(base / settings[key])
        if not all(isinstance(a, str) for a in settings.get("aliases", [])):
            raise CLIError(f"{where}.aliases: expected a list of names")
        out.append((name, settings))
    return out


def _dir_models(directory: str) -> list[Path]:
    d = Path(directory)
    if not d.is_dir():
        raise CLIError(f"--models-dir {directory}: not a directory")
    files = [p for p in sorted(d.glob("*.gguf"))
             if p.is_file() and ((m := _SHARD.search(p.name)) is None or int(m.group(1)) == 1)]
    if not files:
        raise CLIError(f"--models-dir {directory}: no .gguf files in it")
    return files


def _specs(args: argparse.Namespace, base: dict[str, Any]) -> list[Any]:
    """The ModelSpecs of MODEL/-m, --models-dir and --models-config, in that order."""
    from ..hub import KNOWN_MODELS
    from ..model_pool import ModelSpec
    from .pull import resolve

    specs = []
    for name in model_names(args):
        path = resolve(name)
        specs.append(ModelSpec(name if name in KNOWN_MODELS else path.name, path, base))
    if args.models_dir:
        specs += [ModelSpec(p.name, p, base) for p in _dir_models(args.models_dir)]
    if args.models_config:
        for name, settings in read_config(args.models_config):
            path = resolve(settings.pop("model"))
            aliases = tuple(settings.pop("aliases", ()))
            ttl = settings.pop("ttl", None)
            specs.append(ModelSpec(name, path, base | settings, aliases, ttl))
    return specs


def pool_for(args: argparse.Namespace, base: dict[str, Any], setup: Any) -> Any:
    """The ModelPool ``args`` ask for; each model loads as ``LLM(path, **base, **its
    own options)`` and then ``setup(llm)`` (sampling defaults, warm-up). CLIError for a
    model that cannot be read or a name given twice."""
    from ..api import LLM, InvalidRequestError
    from ..gguf.errors import GGUFError
    from ..model_pool import ModelPool, PoolError
    from .serve import check_chat_template

    if getattr(args, "alias", None):
        raise UsageError("-a/--alias names one model; with several, give aliases in "
                         "--models-config")
    if getattr(args, "hf_repo", None):
        raise UsageError("-hf serves one model; with several, name hf.co/ORG/REPO:QUANT "
                         "with -m or in --models-config")
    if args.max_loaded is not None and args.max_loaded < 0:
        raise UsageError(f"--max-loaded must be 0 (no limit) or more, got {args.max_loaded}")
    budget = parse_size(args.mem_budget) if args.mem_budget else None
    check_chat_template(args)

    def load(spec: Any) -> Any:
        llm = LLM(spec.path, **spec.options)
        llm.model_id = spec.name
        setup(llm)
        return llm

    def log(message: str) -> None:
        if not args.log_disable:
            print(f"gguflm serve: {message}", file=sys.stderr, flush=True)

    specs = _specs(args, base)
    try:
        return ModelPool(specs, load, budget=budget, max_loaded=args.max_loaded or None,
                         ttl=args.ttl, log=log)
    except (GGUFError, InvalidRequestError, PoolError, ValueError, OSError) as e:
        raise CLIError(str(e)) from None
