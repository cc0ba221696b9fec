"""Command-line entry points: one module per tool, each with ``main(argv, stdin, stdout, stderr)``.

A tool parses, calls one library function, prints and maps the outcome to an exit code;
``_common`` holds the shared parser, the error wrapper, the one signal setup and what is read
from the environment (``$VKIT_STATE``, ``$VKIT_POLICY``, ``$VKIT_KB``, ``$VKIT_LEASE_OWNER``).
Only this package imports ``vkit.cli``.
"""
