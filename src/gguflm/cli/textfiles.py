"""Files the command line reads as text: prompts, system messages, grammars, JSON schemas,
chat templates (the options in ``TEXT_FILE_OPTIONS``, each with its kind's cap).

Each is read by ``read_text_file``: ``textfile.read_limited``'s checks (a regular file,
within the cap, UTF-8), its errors as one CLIError naming the option and the path.
Standard input (``-``) is read up to the same cap.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..textfile import (
    GRAMMAR_FILES,
    PROMPT_FILES,
    TEMPLATE_FILES,
    Cap,
    TextFileError,
    check_limited,
    decode,
    over_limit,
    read_limited,
    size_words,
)
from . import CLIError

# every option that names a file the CLI reads as text, with its cap (the option as the
# messages name it)
TEXT_FILE_OPTIONS: dict[str, Cap] = {
    "-f": PROMPT_FILES,                          # run, tokenize, embed, perplexity
    "--system-prompt-file": PROMPT_FILES,        # run -sysf
    "--grammar": GRAMMAR_FILES,                  # its text, or a file
    "--grammar-file": GRAMMAR_FILES,
    "--json-schema": GRAMMAR_FILES,              # JSON text, or a file
    "--json-schema-file": GRAMMAR_FILES,
    "--chat-template": TEMPLATE_FILES,           # run, chat, serve (also --chat-template-file)
}


def _cap(option: str) -> Cap:
    return TEXT_FILE_OPTIONS[option]


def _cli_error(e: TextFileError, option: str) -> CLIError:
    return CLIError(e.say(f"{option} {e.path}"))


def check_text_file(path: str | Path, option: str) -> os.stat_result:
    """The ``stat`` of ``path`` (symbolic links followed) if it is a regular file within
    ``option``'s cap; a CLIError naming the option, the path and the problem otherwise.
    Nothing is opened: a FIFO is refused before any open could wait for its writer."""
    try:
        return check_limited(path, *_cap(option))
    except TextFileError as e:
        raise _cli_error(e, option) from None


def read_text_file(path: str | Path, option: str, errors: str = "strict") -> str:
    """The UTF-8 text of ``path`` ('-': standard input), named by ``option`` (a key of
    ``TEXT_FILE_OPTIONS``), read within the option's cap (``textfile.read_limited``); a
    CLIError that names the option, the path and the problem otherwise.
    ``errors="surrogateescape"`` keeps invalid bytes instead of refusing the file."""
    try:
        if str(path) == "-":
            return decode(_read_stdin(option), "standard input", errors)
        return read_limited(path, *_cap(option), errors)
    except TextFileError as e:
        raise _cli_error(e, option) from None


def _read_stdin(option: str) -> bytes:
    """Standard input, up to the option's cap (a pipe or a terminal: no size to check
    first)."""
    limit = _cap(option).limit
    stream = getattr(sys.stdin, "buffer", None)
    try:
        if stream is None:  # a text stream put in its place (tests)
            data = sys.stdin.read(limit + 1).encode("utf-8", "surrogateescape")
        else:
            data = stream.read(limit + 1)
    except OSError as e:
        raise TextFileError("-", f"cannot read {{where}}: {e.strerror or e}") from None
    if len(data) > limit:
        raise over_limit("-", f"more than {size_words(limit)} of standard input",
                         *_cap(option))
    return data


def is_existing_path(value: str) -> bool:
    """Whether ``value`` (an option that takes text or a file) names something that exists
    (a file, but also a FIFO or a device, which ``read_text_file`` then refuses)."""
    try:
        return os.path.lexists(value)
    except (OSError, ValueError):  # too long for a path, a NUL in it: text
        return False
