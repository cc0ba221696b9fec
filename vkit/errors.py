"""Exit codes shared by every vkit tool, and the errors that carry them.

Library code raises a ``VkitError`` subclass with a sentence a field engineer can
act on; ``vkit.cli._common.run`` turns it into a one-line message and the exit code.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0  # ok / accepted / valid
    REJECTED = 1  # gate said no, an invariant failed, a check failed
    USAGE = 2  # bad command line or bad input file
    INVALID = 3  # invalid measurement: the data cannot support any verdict
    UNAVAILABLE = 4  # unreachable, timed out, lease held, environment ABNORMAL
    INTERNAL = 5  # a bug in vkit
    UNDECIDED = 6  # more measurements needed
    INTERRUPTED = 130


EXIT_CODE_HELP = {
    ExitCode.OK: "ok / accepted / valid",
    ExitCode.REJECTED: "rejected: gate said no, an invariant or a check failed",
    ExitCode.USAGE: "usage error (bad flag, bad value, bad input file)",
    ExitCode.INVALID: "invalid measurement or state: the data cannot support a verdict",
    ExitCode.UNAVAILABLE: "unavailable: unreachable, timed out, lease held, environment ABNORMAL",
    ExitCode.INTERNAL: "internal error (a bug; rerun with --traceback and report it)",
    ExitCode.UNDECIDED: "undecided: more measurements are needed",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C or SIGTERM)",
}


class VkitError(Exception):
    """An error with a message meant for a person and the exit code it maps to."""

    code: ExitCode = ExitCode.INTERNAL

    def __init__(self, message: str, code: ExitCode | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code


class UsageError(VkitError):
    code = ExitCode.USAGE


class Rejected(VkitError):
    code = ExitCode.REJECTED


class InvalidData(VkitError):
    code = ExitCode.INVALID


class Unavailable(VkitError):
    code = ExitCode.UNAVAILABLE


class Undecided(VkitError):
    code = ExitCode.UNDECIDED


class StateMissing(Unavailable):
    """No state file: the service was never registered with ``state init``."""


class StateCorrupt(InvalidData):
    """The state file cannot be parsed; never silently reset."""


class StateWriteError(Unavailable):
    """The new state could not be written; the previous one is intact."""


class LeaseHeld(Unavailable):
    """Another run holds the service's lease."""


class Abnormal(Unavailable):
    """The environment is marked ABNORMAL; a human must clear it."""


class PolicyRefusal(Rejected):
    """The parameter policy forbids the requested change."""


class MustRunMissing(InvalidData):
    """A check the policy requires before analysis has not been run."""
