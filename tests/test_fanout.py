"""vkit.sim.fanout: items over forked workers give what a loop here gives, in order, errors carried back."""

from __future__ import annotations

import os

import pytest

from vkit.sim import fanout

pytestmark = pytest.mark.unit


def _one_thread(monkeypatch, cores: int) -> None:
    """This process as a tool runs it: ``cores`` cores, no other thread (one a test before left is not ours)."""
    monkeypatch.setattr(fanout.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(fanout.threading, "active_count", lambda: 1)


def test_fanned_out_items_come_back_in_order_as_a_loop_here_gives_them(monkeypatch):
    _one_thread(monkeypatch, 3)
    assert fanout.workers_for(11) == 3 and fanout.workers_for(1) == 1
    pids = fanout.fan_out(lambda x: (x * x, os.getpid()), range(11))
    assert [v for v, _ in pids] == [x * x for x in range(11)]
    # worker k took items k, k + 3, ...: three processes, none of them this one
    assert len({p for _, p in pids}) == 3 and os.getpid() not in {p for _, p in pids}
    assert {p for _, p in pids[0::3]} == {pids[0][1]}


def test_a_workers_exception_is_raised_here_naming_it(monkeypatch):
    _one_thread(monkeypatch, 2)
    with pytest.raises(RuntimeError, match=r"worker 1: ZeroDivisionError"):
        fanout.fan_out(lambda x: 1 / (x - 3), range(5))


def test_serial_where_asked_or_where_a_thread_is_alive(monkeypatch):
    _one_thread(monkeypatch, 2)
    assert fanout.workers_for(8) == 2
    monkeypatch.setenv("VKIT_SERIAL", "1")
    assert fanout.workers_for(8) == 1
    assert {p for p in fanout.fan_out(lambda x: os.getpid(), range(4))} == {os.getpid()}
    monkeypatch.delenv("VKIT_SERIAL")
    # a fork would copy no thread, and a lock another one held would stay held in the child
    monkeypatch.setattr(fanout.threading, "active_count", lambda: 2)
    assert fanout.workers_for(8) == 1
