"""The layer every tool shares: the parent parser, help layout, output helpers and
the error wrapper that maps library errors to one-line messages and exit codes.

A tool module looks like::

    def build_parser():
        p = make_parser("mytool", "One sentence.", examples=["mytool --json"])
        p.add_argument(...)
        return p

    def _run(args, io):
        ...library call...
        io.emit_json(result)
        return ExitCode.OK

    def main(argv=None, stdin=None, stdout=None, stderr=None):
        return run(build_parser(), _run, argv, stdout, stderr, stdin)
"""

from __future__ import annotations

import argparse
import contextlib
import io as _io
import json
import os
import signal
import sys
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, TextIO

from vkit import __version__
from vkit.apply.policy import Policy
from vkit.decide.percent import parse_fraction
from vkit.errors import EXIT_CODE_HELP, ExitCode, UsageError, VkitError
from vkit.interrupts import Interrupts
from vkit.state import default_owner

DEFAULT_STATE = os.path.join("vkit-state", "vkit.json")


def default_state_path() -> str:
    """``$VKIT_STATE`` if set, else ``./vkit-state/vkit.json``."""
    return os.environ.get("VKIT_STATE") or DEFAULT_STATE


# The environment is read here, in the CLI layer, and what it says is passed down to the library.
def lease_owner(tool: str) -> str:
    """``$VKIT_LEASE_OWNER`` when a parent run hands its lease down, else this process."""
    return os.environ.get("VKIT_LEASE_OWNER") or default_owner(tool)


def load_policy() -> Policy:
    """The parameter policy: ``$VKIT_POLICY`` (a site's copy) if set, else the packaged table."""
    return Policy.load(os.environ.get("VKIT_POLICY") or None)


def kb_path(state_dir: str) -> str:
    """The knowledge base: ``$VKIT_KB`` if set, else ``knowledge.jsonl`` beside the state file."""
    from vkit.tune import knowledge

    return os.environ.get("VKIT_KB") or knowledge.default_path(state_dir)


def parent_parser(for_subcommand: bool = False) -> argparse.ArgumentParser:
    """The flags every tool has; each means the same thing in every tool.

    ``for_subcommand``: the copy attached to a subcommand has no defaults of its own,
    so ``tool --json sub`` and ``tool sub --json`` both work (argparse would otherwise
    let the subcommand's default overwrite the value given before it).
    """
    p = argparse.ArgumentParser(add_help=False)
    if for_subcommand:
        p.argument_default = argparse.SUPPRESS
    g = p.add_argument_group("common options")
    g.add_argument(
        "--state",
        metavar="FILE",
        default=argparse.SUPPRESS if for_subcommand else default_state_path(),
        help="JSON state file shared by all tools (default: $VKIT_STATE, else ./vkit-state/vkit.json)",
    )
    g.add_argument("--url", metavar="URL", help="server base URL, e.g. http://127.0.0.1:8000 (default: the one in the state file)")
    g.add_argument("--json", action="store_true", help="write machine-readable JSON to stdout instead of text")
    g.add_argument(
        "-v", "--verbose", action="count", default=argparse.SUPPRESS if for_subcommand else 0, help="more progress on stderr (repeatable)"
    )
    g.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr, errors only")
    g.add_argument("--traceback", action="store_true", help="print a Python traceback on errors (for bug reports)")
    if not for_subcommand:
        g.add_argument("--version", action="version", version=f"vkit {__version__}")
    return p


def add_subcommand(sub, name: str, help: str, description: str | None = None, examples: Iterable[str] = ()):
    """A subcommand parser that also takes the common flags and lists the exit codes."""
    return sub.add_parser(
        name,
        help=help,
        description=description or help,
        epilog=_epilog(examples),
        parents=[parent_parser(for_subcommand=True)],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def int_at_least(lo: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``lo`` ("invalid int value" as argparse says it)."""

    def conv(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
        return v

    conv.__name__ = f"int>={lo}"
    return conv


def positive_float(value: str) -> float:
    """An argparse type: a number > 0 (argparse says "invalid positive_float value")."""
    v = float(value)
    if not v > 0:
        raise ValueError(value)
    return v


def non_negative_float(value: str) -> float:
    """An argparse type: a number >= 0."""
    v = float(value)
    if v < 0:
        raise ValueError(value)
    return v


def fraction_arg(open_unit: bool = True) -> Callable[[str], float]:
    """An argparse type: a number or a percentage (``vkit.decide.percent``), said as argparse says it."""

    def conv(text: str) -> float:
        try:
            return parse_fraction(text, "value", open_unit)
        except UsageError as e:
            raise argparse.ArgumentTypeError(str(e).split(": ", 1)[1]) from None

    conv.__name__ = "fraction"
    return conv


def _epilog(examples: Iterable[str], exit_notes: dict[int, str] | None = None) -> str:
    ex = list(examples)
    head = ("Examples:\n" + "\n".join(f"  {e}" for e in ex) + "\n\n") if ex else ""
    return head + exit_codes_epilog(exit_notes)


def exit_codes_epilog(notes: dict[int, str] | None = None) -> str:
    """The one exit-code enum, whole, in every tool's --help: a code means the same everywhere.
    ``notes`` say what a code means for this tool in particular."""
    notes = notes or {}
    lines = ["Exit codes (the same in every vkit tool):"]
    for c in ExitCode:
        lines.append(f"  {int(c):<4d}{EXIT_CODE_HELP[c]}" + (f"; here: {notes[int(c)]}" if int(c) in notes else ""))
    return "\n".join(lines)


def make_parser(
    prog: str,
    description: str,
    examples: Iterable[str] = (),
    exit_notes: dict[int, str] | None = None,
    common: bool = True,
    **kwargs: Any,
) -> argparse.ArgumentParser:
    """A parser with the shared flags, an ``Examples:`` epilog and the exit codes."""
    return argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=_epilog(examples, exit_notes),
        parents=[parent_parser()] if common else [],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        **kwargs,
    )


@dataclass
class IO:
    """Where a tool writes: data to ``out``, everything for people to ``err``."""

    prog: str
    out: TextIO
    err: TextIO
    verbosity: int = 1  # 0 quiet, 1 normal, 2+ verbose
    json: bool = False
    stdin: TextIO | None = None
    interrupts: Interrupts = field(default_factory=Interrupts)

    def emit_json(self, obj: Any) -> None:
        self.out.write(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
        self.out.flush()

    def emit_line(self, obj: Any) -> None:
        """One JSON Lines record."""
        self.out.write(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str) + "\n")
        self.out.flush()

    def progress(self, msg: str) -> None:
        if self.verbosity >= 1:
            self.err.write(f"{self.prog}: {msg}\n")
            self.err.flush()

    def debug(self, msg: str) -> None:
        if self.verbosity >= 2:
            self.err.write(f"{self.prog}: {msg}\n")
            self.err.flush()

    def warn(self, msg: str) -> None:
        self.err.write(f"{self.prog}: warning: {msg}\n")
        self.err.flush()

    def is_tty(self) -> bool:
        return isatty(self.out)


def isatty(stream) -> bool:
    """True for a terminal; False for pipes, files, StringIO and closed streams."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _one_line(msg: str) -> str:
    return " ".join(str(msg).split())


@contextlib.contextmanager
def signals(interrupts: Interrupts, real: bool) -> Iterator[None]:
    """The one place a tool sets signal handlers. A real process gets SIGPIPE back to the
    default, so ``tool | head`` ends quietly. SIGINT and SIGTERM go to ``interrupts``: outside a
    section that finishes safely both are the clean interrupt of Ctrl-C (exit 130), inside one
    the section is told and ends what it started (vkit.interrupts)."""
    if real and hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    old = {}
    if threading.current_thread() is threading.main_thread():
        def on_signal(signum, frame):  # noqa: ARG001
            interrupts.notify("SIGTERM" if signum == signal.SIGTERM else "")

        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, on_signal)
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def loop_signals(loop, stop: Callable[[], None]) -> None:
    """``signals`` for a tool that runs an asyncio loop (sim_server): SIGTERM and SIGINT call
    ``stop`` from the loop itself, so a stop is seen at once whichever thread the signal hits."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop)


def run(
    parser: argparse.ArgumentParser,
    body: Callable[[argparse.Namespace, IO], int],
    argv: list[str] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    stdin: TextIO | None = None,
) -> int:
    """Parse ``argv``, call ``body(args, io)``, map every outcome to an exit code.

    Signals while the tool runs: see ``signals``.
    """
    interrupts = Interrupts()
    with signals(interrupts, real=stdout is None):
        return _run_body(parser, body, argv, stdout, stderr, stdin, interrupts)


def _run_body(parser, body, argv, stdout, stderr, stdin, interrupts: Interrupts) -> int:
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    prog = parser.prog
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, usage errors
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else ExitCode.USAGE)
        return int(code)
    verbosity = 0 if getattr(args, "quiet", False) else 1 + getattr(args, "verbose", 0)
    tio = IO(prog=prog, out=out, err=err, verbosity=verbosity, json=getattr(args, "json", False),
             stdin=stdin if stdin is not None else sys.stdin, interrupts=interrupts)
    show_tb = getattr(args, "traceback", False)
    try:
        rc = body(args, tio)
        return int(ExitCode.OK if rc is None else rc)
    except VkitError as e:
        err.write(f"{prog}: error: {_one_line(e)}\n")
        if show_tb:
            traceback.print_exc(file=err)
        return int(e.code)
    except KeyboardInterrupt:
        err.write(f"{prog}: interrupted\n")
        return int(ExitCode.INTERRUPTED)
    except BrokenPipeError:
        # The reader went away (only reachable in-process; real processes die on SIGPIPE).
        with contextlib.suppress(Exception):
            sys.stdout = _io.StringIO()
        return int(ExitCode.OK)
    except Exception as e:  # noqa: BLE001 - the one place that turns bugs into exit 5
        err.write(f"{prog}: internal error: {type(e).__name__}: {_one_line(e)} (rerun with --traceback and report it)\n")
        if show_tb:
            traceback.print_exc(file=err)
        return int(ExitCode.INTERNAL)
    finally:
        with contextlib.suppress(Exception):
            err.flush()
