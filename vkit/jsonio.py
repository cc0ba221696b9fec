"""Reading JSON files (``read_json``, ``read_json_file``, ``load_json_file``) and JSON Lines: one rule
for every file of one JSON value a line.

vkit's logs (the decision log, the knowledge base, per-request records, a soak's windows) are
appended one line at a time, so a writer killed mid-line leaves a last line without its newline.
The rule, the same for every reader: blank lines are skipped; a last line without its newline
that does not parse is that cut-short write and is left out; any other line that does not parse
is an error (``BadLine``), which each caller words for its own file.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

from vkit.errors import UsageError


class BadLine(ValueError):
    """A line that is not JSON: ``line`` (1-based) and the parser's ``msg``."""

    def __init__(self, line: int, msg: str):
        super().__init__(f"line {line}: {msg}")
        self.line = line
        self.msg = msg


def json_lines(text: str, skip_bad: bool = False) -> Iterator[tuple[int, Any]]:
    """(line number, value) of every JSON line of ``text``; ``skip_bad`` leaves out bad lines
    instead of raising (a log that must stay readable whatever one line holds)."""
    lines = text.split("\n")  # the piece after the last newline is "" for a complete file
    last = len(lines)
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as e:
            if n == last or skip_bad:  # n == last: no newline after it, a write cut short
                continue
            raise BadLine(n, e.msg) from None


def read_json_lines(path: str, skip_bad: bool = False) -> list[tuple[int, Any]]:
    """``json_lines`` of a file (``OSError``, e.g. ``FileNotFoundError``, propagates)."""
    with open(path, encoding="utf-8") as f:
        return list(json_lines(f.read(), skip_bad))


def load_json_lines(path: str, what: str, hint: str = "") -> list[tuple[int, Any]]:
    """``read_json_lines`` for an input named ``what`` (``records file``): a missing, unreadable
    or bad file is refused in one wording, with ``hint`` saying what a line should hold."""
    try:
        return read_json_lines(path)
    except FileNotFoundError:
        raise UsageError(f"no such {what}: {path}") from None
    except OSError as e:
        raise UsageError(f"cannot read {what} {path}: {e.strerror}") from None
    except BadLine as e:
        raise UsageError(f"{path}:{e.line}: not valid JSON ({e.msg})" + (f"; {hint}" if hint else "")) from None


def read_json(path: str, what: str) -> Any:
    """One JSON document from a file; ``what`` names it in the refusal (``parameter policy``).
    A missing file raises ``FileNotFoundError``, which the caller words for its input."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{what} {path} is not valid JSON ({e.msg} at line {e.lineno})") from None


def read_json_file(path: str) -> tuple[Any, bytes]:
    """One JSON document from a file and the bytes it was parsed from (for a digest). ``OSError``
    and ``ValueError`` (not JSON, not UTF-8) propagate: for a reader that skips a damaged file."""
    with open(path, "rb") as f:
        raw = f.read()
    return json.loads(raw), raw


def load_json_file(path: str) -> tuple[Any, bytes]:
    """``read_json_file`` for an input file: a missing, unreadable or bad file is refused in one wording."""
    try:
        return read_json_file(path)
    except OSError as e:
        raise UsageError(f"no such file: {path}" if isinstance(e, FileNotFoundError) else f"cannot read {path}: {e.strerror}") from None
    except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError
        raise UsageError(f"{path} is not valid JSON ({e})") from None
