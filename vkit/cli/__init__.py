"""Command-line entry points: one module per tool, each with ``main(argv, stdout, stderr)``."""
