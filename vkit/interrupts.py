"""How the library hears of an interrupt without installing a signal handler.

The CLI installs the one handler (``vkit.cli._common``) and calls ``Interrupts.notify()``.
Outside any section that must finish safely that raises ``KeyboardInterrupt``, as Python's
default handler does. A section that must finish safely (a restart that rolls back, a
benchmark that drains its in-flight requests) opens ``deferred()``: there the first interrupt
only sets the section's flag, which the section polls; with ``again_raises`` the next one
raises ``KeyboardInterrupt`` (stop waiting).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator


class Deferred:
    """One section's interrupts: ``event`` is set by the first, ``hits`` counts them."""

    def __init__(self, on_first: Callable[[], None] | None = None, again_raises: bool = False):
        self.event = threading.Event()
        self.hits = 0
        self.on_first = on_first
        self.again_raises = again_raises

    def is_set(self) -> bool:
        return self.hits > 0

    def hit(self) -> None:
        self.hits += 1
        if self.hits == 1:
            self.event.set()
            if self.on_first is not None:
                self.on_first()
        elif self.again_raises:
            raise KeyboardInterrupt


class Interrupts:
    """The interrupts of one tool invocation; built in ``main`` and passed down."""

    def __init__(self) -> None:
        self._open: list[Deferred] = []
        self._fan_out = 0

    def notify(self, reason: str = "") -> None:
        """An interrupt arrived (called from the CLI's signal handler, on the main thread)."""
        if not self._open:
            raise KeyboardInterrupt(reason) if reason else KeyboardInterrupt()
        for d in list(self._open) if self._fan_out else self._open[-1:]:
            d.hit()

    @contextlib.contextmanager
    def every_section(self) -> Iterator[None]:
        """While trials run side by side on several threads (slots), an interrupt reaches every open
        section, not only the innermost: each thread's restart rolls back, each measurement drains."""
        self._fan_out += 1
        try:
            yield
        finally:
            self._fan_out -= 1

    @contextlib.contextmanager
    def deferred(self, on_first: Callable[[], None] | None = None, again_raises: bool = False) -> Iterator[Deferred]:
        d = Deferred(on_first, again_raises)
        self._open.append(d)
        try:
            yield d
        finally:
            self._open.remove(d)
