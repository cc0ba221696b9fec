"""The report on disk: ``report.md``, ``report.html`` and ``result.json``, each written atomically."""

from __future__ import annotations

import json
import os

from vkit.errors import StateWriteError, Unavailable
from vkit.report import html, markdown
from vkit.report.model import build
from vkit.state import atomic_write_text
from vkit.tune.result import TuneResult


class ReportWriteError(Unavailable):
    """A report file could not be written; any earlier file of that name is intact."""


def _atomic_write(path: str, text: str) -> None:
    """vkit's one atomic writer (temp file beside it, fsync, replace), with the report's advice."""
    try:
        atomic_write_text(path, text)
    except StateWriteError as e:
        raise ReportWriteError(f"{e}; choose a writable report directory") from e


def write_report(result: TuneResult | dict, out_dir: str) -> dict:
    """Write ``report.md``, ``report.html`` and ``result.json`` into ``out_dir`` (created when
    missing), each atomically; return ``{"md": path, "html": path, "json": path}``."""
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise ReportWriteError(f"could not create the report directory {out_dir}: "
                               f"{os.strerror(e.errno) if e.errno else e}") from e
    # Render everything before writing anything: a rendering bug leaves no half-written report.
    report = build(result)
    doc = result.to_dict() if isinstance(result, TuneResult) else result
    texts = {
        "md": ("report.md", markdown.render(report)),
        "html": ("report.html", html.render(report)),
        "json": ("result.json", json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False, default=str) + "\n"),
    }
    paths = {}
    for key, (name, text) in texts.items():
        path = os.path.join(out_dir, name)
        _atomic_write(path, text)
        paths[key] = path
    return paths
