"""Fractions written as a number or a percentage (``0.03`` or ``3%``): the one parser of
``--floor``, ``--sigma``, a guard's tolerance and the like."""

from __future__ import annotations

from vkit.errors import UsageError


def parse_fraction(text: str, what: str, open_unit: bool = True) -> float:
    """``"3%"`` → 0.03, ``"0.03"`` → 0.03. ``open_unit``: the value must lie strictly between 0
    and 1 (a σ, a tolerance); without it the caller checks its own range. ``what`` names the
    input in the message (``--sigma output_throughput=x``)."""
    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise UsageError(f"{what}: {text!r} is not a number or a percentage such as 5%") from None
    if open_unit and not (0 < v < 1):
        raise UsageError(f"{what}: {text!r} must be between 0 and 100%")
    return v
