"""A pure function over many items, fanned out over the machine's cores (forked workers), or run here.

The twin's fit replays its load points under each parameter set, and its ranking bisects every
configuration's capacity: each item is independent and deterministic, so the answer is the same
whether the items run here or in workers. Workers are forked (the function and its items are
inherited, only results travel back through a pipe; worker k takes items k, k + n, ...), and only
from a process with no other thread alive (a fork copies no thread, and a lock another thread held
would stay held in the child); elsewhere, with a single core, one item, or ``VKIT_SERIAL=1``, the
items run here, in order."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
from typing import Callable, Iterable, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def workers_for(n_items: int) -> int:
    """How many forked workers ``fan_out`` would use for ``n_items`` here (1: it runs them here)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    n = min(n_items, cores)
    if (n < 2 or os.environ.get("VKIT_SERIAL") == "1" or threading.active_count() > 1 or mp.current_process().daemon
            or "fork" not in mp.get_all_start_methods()):
        return 1
    return n


def fan_out(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``[fn(x) for x in items]``, in order; over forked workers where :func:`workers_for` allows. An
    exception in a worker is raised here as a RuntimeError naming it."""
    items = list(items)
    n = workers_for(len(items))
    if n < 2:
        return [fn(x) for x in items]
    ctx = mp.get_context("fork")

    def work(k: int, conn) -> None:
        try:
            conn.send(("ok", [fn(items[i]) for i in range(k, len(items), n)]))
        except BaseException as e:  # noqa: BLE001 - carried to the parent, which raises it
            conn.send(("error", f"{type(e).__name__}: {e}"))
        finally:
            conn.close()

    pipes, procs, answered = [], [], False
    try:
        for k in range(n):
            here, there = ctx.Pipe(duplex=False)
            p = ctx.Process(target=work, args=(k, there), daemon=True)
            p.start()
            there.close()
            pipes.append(here)
            procs.append(p)
        out: list = [None] * len(items)
        for k, here in enumerate(pipes):
            try:
                status, got = here.recv()
            except EOFError:
                raise RuntimeError(f"fan_out: worker {k} ended without an answer") from None
            if status != "ok":
                raise RuntimeError(f"fan_out: worker {k}: {got}")
            for j, v in zip(range(k, len(items), n), got, strict=True):
                out[j] = v
        answered = True
        return out
    finally:
        # a worker that answered ends on its own (a terminate during its exit would run the caller's SIGTERM
        # handler in it: a tool that turns SIGTERM into KeyboardInterrupt prints a traceback per worker)
        for p in procs:
            p.join(timeout=5 if answered else 0)
            if p.is_alive():
                p.terminate()
            p.join()
