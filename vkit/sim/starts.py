"""The start count of a simulated server: which draw of the between-restart noise a process gets.

``next_start(path)`` adds one to the counter in ``path`` under an exclusive lock and returns
the new count (1 for the first start). The file holds one integer; it is replaced atomically,
so a start killed half-way leaves the previous count. Same seed and same count give the same
between-restart draw; every new start gets a new one.
"""

from __future__ import annotations

import fcntl
import os

from vkit.errors import UsageError


def next_start(path: str) -> int:
    lock = path + ".lock"
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise UsageError(f"--sim-start-file: cannot open {lock}: {e.strerror}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        count = 0
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read().strip()
            count = int(text) if text else 0
        except FileNotFoundError:
            pass
        except ValueError as e:
            raise UsageError(f"--sim-start-file {path}: not a start count ({e})") from e
        count += 1
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(f"{count}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return count
    finally:
        os.close(fd)
