"""What every benchmark shares: a free port for a server it starts, the revision it measured, the
machine it ran on, and its results file written atomically with one header.

Every ``bench/*.py`` imports it (``bench/`` is the script's folder, so ``import harness`` works from
``python3 bench/x.py`` as from the Makefile). A result written with :func:`write_result` carries
``benchmark``, ``date`` (UTC), ``revision`` (the commit, ``+changes`` when the tree had changes),
``machine`` (CPUs, Python, the load when it ended) and ``command``; a script's own fields of the same
name are kept, never overwritten. The file is replaced in one step (temp file, fsync, rename): a
benchmark stopped mid-write leaves the previous results whole.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from vkit.state import atomic_write_text  # noqa: E402


def sim_sources(*starts: str) -> list[str]:
    """The simulator's modules that ``starts`` (module names in ``vkit.sim``, e.g. ``predict``) run: those
    and what they import from ``vkit.sim``, transitively. A benchmark's truth is keyed by their source: a
    change to one of them changes a truth; a new simulator module beside them (a fitter, the HTTP
    server) does not."""
    import ast

    seen, todo = set(), list(starts)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        with open(os.path.join(ROOT, "vkit", "sim", f"{name}.py"), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for n in ast.walk(tree):
            mods = ([n.module] if isinstance(n, ast.ImportFrom) and n.module
                    else [a.name for a in n.names] if isinstance(n, ast.Import) else [])
            todo += [m.split(".")[2] for m in mods if m.startswith("vkit.sim.")]
    return sorted(os.path.join(ROOT, "vkit", "sim", f"{m}.py") for m in seen)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a server the benchmark starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def revision() -> str | None:
    """The commit measured (short), ``+changes`` when the working tree differs from it; None outside git."""
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+changes" if dirty else "")) or None


def machine() -> dict:
    """The machine the benchmark ran on, as every result names it."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "loadavg_1m": round(load, 2) if load is not None else None}


def header(benchmark: str, argv: list[str] | None = None) -> dict:
    """The fields every result opens with."""
    args = sys.argv[1:] if argv is None else argv
    script = os.path.relpath(os.path.abspath(sys.argv[0]), ROOT) if sys.argv and sys.argv[0] else benchmark
    return {"benchmark": benchmark, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "revision": revision(),
            "machine": machine(), "command": shlex.join(["python3", script, *args])}


def write_result(path: str, doc: dict, benchmark: str | None = None, **dump) -> dict:
    """``doc`` under the common header (its own fields win) written atomically to ``path``; returns what was written."""
    name = benchmark or os.path.splitext(os.path.basename(path))[0]
    out = {**header(name), **doc}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write_text(path, json.dumps(out, **({"indent": 2} | dump)) + "\n")
    return out
