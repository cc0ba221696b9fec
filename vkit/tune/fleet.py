"""Many machines: each slot's server and measurements on a node of an existing Ray cluster.

``tune --ray ADDRESS`` (or ``sweep``) connects to the cluster and gives every slot of the state a
worker: a Ray actor pinned to a node that holds the slot's accelerators (``num_gpus`` = the slot's
device count; a slot's ``node`` in the slots file names the node's IP or id, else the nodes with
enough free GPUs are taken in turn). The worker holds the slot's own state file and server on its
node, and does the three things that must happen beside the server: restart with rollback
(``apply``), one validated measurement (``measure``), and the health check. Everything else stays
on the driver: the tune's state file, its trials, baselines, gate decisions and decision log. The
files a call made on the node (run summaries, request records) come back with its answer and are
written at the same paths beside the driver's state; the slot's state comes back too and is
mirrored into the driver's copy of the slot's state file, its log events appended to the slot's log.

A node lost, or a worker killed, mid-call is the slot failing under its trial (``Unavailable``):
the trial is measured again on another slot and the slot is taken out, as for a local slot whose
server dies twice; the tune goes on. The workers are detached and named after the state file, so
the first slot's server (left on the kept configuration) outlives the tuning command, and a rerun
finds its workers again.

Ray is an optional extra (``pip install vkit[fleet]``): nothing here imports it until ``--ray`` is
given, and the default path is one machine with no Ray.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import sys
import tempfile
import time
from typing import Any, Callable

from vkit.errors import ExitCode, Unavailable, UsageError, VkitError
from vkit.tune.ledger import Ledger, TuneView, first

CALL_TIMEOUT_S = 6 * 3600.0  # one measurement or restart; a lost node answers long before this


def _ray():
    try:
        import ray
    except ImportError:
        raise UsageError("--ray needs Ray on this machine and on every node: pip install 'vkit[fleet]'") from None
    return ray


def worker_name(state_path: str, slot: str) -> str:
    """The detached worker's name: one per state file and slot, so a rerun finds it again."""
    return f"vkit-{hashlib.sha256(os.path.abspath(state_path).encode()).hexdigest()[:12]}-{slot}"


def _node_for(ray: Any, slot: dict, taken: dict[str, float]) -> str:
    """The id of the node a slot's worker is pinned to: the slot's ``node`` (IP or id), else the first
    alive node with enough GPUs not yet given to another slot (any alive node when the slot needs none)."""
    need = float(len(slot.get("devices") or [])) if slot.get("gpus", True) else 0.0
    alive = [n for n in ray.nodes() if n.get("Alive")]
    want = slot.get("node")
    for n in alive:
        if want and want in (n["NodeID"], n.get("NodeManagerAddress")):
            return n["NodeID"]
    if want:
        raise Unavailable(f"slot {slot['name']}: no alive Ray node is {want}")
    for n in alive:
        gpus = float((n.get("Resources") or {}).get("GPU", 0.0))
        if gpus - taken.get(n["NodeID"], 0.0) >= need:
            taken[n["NodeID"]] = taken.get(n["NodeID"], 0.0) + need
            return n["NodeID"]
    raise Unavailable(f"slot {slot['name']}: no alive Ray node has {need:g} free GPU(s) for it")


class SlotWorker:
    """The node side of one slot (a Ray actor): the slot's state file and the server it describes
    (``vkit.tune.server.ProcessServer``: restarts with rollback), one measurement at a time beside it
    (``vkit.tune.onerun.OneRun``), against a shadow of the tune's state refreshed from the driver at every
    call. Nothing of the tune's decisions runs here."""

    def __init__(self, name: str, slot_rel: str, slot_doc: dict, settings: bytes, owner: str, tool: str, policy: bytes):
        from vkit.state import StateFile

        self.name = name
        # the node's side: $VKIT_FLEET_DIR (as the node's Ray was started with), else the temp folder
        self.dir = tempfile.mkdtemp(prefix=f"vkit-fleet-{name}-", dir=os.environ.get("VKIT_FLEET_DIR") or None)
        with open(os.path.join(self.dir, "worker.pid"), "w", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")
        self.main = StateFile(os.path.join(self.dir, "vkit.json"))
        self.slot = StateFile(os.path.join(self.dir, slot_rel))  # the driver's layout: run and log paths alike
        self.slot.create(slot_doc, force=True)
        self.settings, self.owner, self.tool, self.policy = pickle.loads(settings), owner, tool, pickle.loads(policy)
        self.seen: dict[str, tuple[int, int]] = {}
        self.log_seen = 0

    def pid(self) -> int:
        return os.getpid()

    def call(self, main_doc: dict, runs_rel: str, op: str, args: tuple) -> dict:
        """``op`` on this node (apply, measure, healthy, stop) against the tune's state ``main_doc``;
        the answer, the files it wrote, the slot's state and its new log events."""
        from vkit.apply.backend import PROCESS
        from vkit.interrupts import Interrupts
        from vkit.tune.onerun import OneRun
        from vkit.tune.server import ProcessServer

        if self.main.exists():
            self.main.mirror_remote(main_doc)  # the tune's state as the driver holds it now
        else:
            self.main.create(main_doc, force=True)
        runs_dir = os.path.join(self.dir, runs_rel)
        os.makedirs(runs_dir, exist_ok=True)
        server = ProcessServer(self.slot, self.main, self.owner, self.policy, Interrupts(), PROCESS, self.settings.ready_timeout_s)
        out: dict[str, Any] = {}
        try:
            if op == "apply":
                out["result"] = server.apply(*args)
            elif op == "measure":
                out["result"] = OneRun(self.settings, Ledger(self.main), Ledger(self.slot), runs_dir, PROCESS, Interrupts(),
                                       lambda m: None).once(*args)
            elif op == "healthy":
                out["result"] = server.healthy(*args)
            elif op == "stop":
                from vkit.apply.lifecycle import Lifecycle

                Lifecycle(self.slot, self.tool, self.owner, progress=lambda m: None, policy=self.policy).stop()
                out["result"] = None
            else:
                raise UsageError(f"unknown fleet call {op!r}")
        except VkitError as e:
            out["error"] = (int(e.code), str(e), type(e).__name__)
        out["files"] = self._new_files()
        out["node_dir"] = self.dir
        out["slot_state"] = Ledger(self.slot).raw()
        events = self.slot.log.read()
        out["events"], self.log_seen = events[self.log_seen:], len(events)
        return out

    def _new_files(self) -> dict[str, tuple[int, bytes]]:
        """The runs (summaries, records) and the server logs written since the last call: relative path ->
        (offset, bytes); a file grown in place sends what it gained, a new or replaced one all of it."""
        got = {}
        for top in (os.path.join(self.dir, "runs"), os.path.join(os.path.dirname(self.slot.path), "logs")):
            for root, _, names in os.walk(top):
                for n in names:
                    p = os.path.join(root, n)
                    st = os.stat(p)
                    ino, size = self.seen.get(p, (0, 0))
                    if (ino, size) == (st.st_ino, st.st_size):
                        continue
                    start = size if ino == st.st_ino and st.st_size > size else 0
                    with open(p, "rb") as f:
                        f.seek(start)
                        got[os.path.relpath(p, self.dir)] = (start, f.read())
                    self.seen[p] = (st.st_ino, st.st_size)
        return got


def _put(path: str, offset: int, data: bytes) -> None:
    """A file from a node, written here: whole (atomically) at offset 0, else what it gained appended at ``offset``."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if offset and os.path.exists(path):
        with open(path, "r+b") as f:
            f.truncate(offset)
            f.seek(offset)
            f.write(data)
        return
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


class Fleet:
    """The driver's side: one worker per slot, created on first use (pinned to its node), and the calls."""

    def __init__(self, address: str, state_path: str, settings: Any, owner: str, tool: str, policy: Any,
                 progress: Callable[[str], None] = lambda m: None):
        self.ray = _ray()
        self.state_path = state_path
        self.settings, self.owner, self.tool, self.policy = pickle.dumps(settings), owner, tool, pickle.dumps(policy)
        self.progress = progress
        # Ray's driver prints the cluster's messages (a worker died, ...) to sys.stdout: here they go to stderr,
        # so that stdout carries vkit's own output alone (the tool's IO holds the real stdout already)
        sys.stdout = sys.stderr
        try:
            self.ray.init(address=address, namespace="vkit", log_to_driver=False, ignore_reinit_error=True,
                          configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise Unavailable(f"--ray {address}: cannot connect to the Ray cluster: {' '.join(str(e).split())[:300]}") from None
        self.workers: dict[str, Any] = {}
        self.taken: dict[str, float] = {}

    def worker(self, slot: dict, slot_doc: dict, slot_rel: str) -> Any:
        name = slot["name"]
        if name in self.workers:
            return self.workers[name]
        ray = self.ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor_name = worker_name(self.state_path, name)
        try:
            w = ray.get_actor(actor_name)
        except ValueError:
            node = _node_for(ray, slot, self.taken)
            need = float(len(slot.get("devices") or [])) if slot.get("gpus", True) else 0.0
            cls = ray.remote(num_cpus=0, num_gpus=need, max_restarts=0, max_concurrency=2)(SlotWorker)
            w = cls.options(name=actor_name, lifetime="detached", get_if_exists=True,
                            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
                name, slot_rel, slot_doc, self.settings, self.owner, self.tool, self.policy)
            self.progress(f"slot {name}: Ray worker {actor_name} on node {node[:12]}")
        self.workers[name] = w
        return w

    def call(self, runner: Any, op: str, *args: Any) -> Any:
        """``op`` on ``runner``'s slot's worker; its files, state and events brought back to the driver."""
        ray = self.ray
        main = runner.ledger.raw()
        slot = first(TuneView(main).slots(live=False), name=runner.slot)
        w = self.worker(slot, runner.served.raw(), os.path.relpath(runner.svc.path, runner.sf.dir))
        rel = os.path.relpath(runner.runs_dir, runner.sf.dir)
        t0 = time.time()
        try:
            out = ray.get(w.call.remote(main, rel, op, args), timeout=CALL_TIMEOUT_S)
        except (ray.exceptions.RayError, TimeoutError) as e:
            self.workers.pop(runner.slot, None)
            raise Unavailable(f"slot {runner.slot}: its Ray worker was lost during {op} after {time.time() - t0:.0f} s "
                              f"({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None
        for rel_path, (offset, data) in out["files"].items():
            _put(os.path.join(runner.sf.dir, rel_path), offset, data)
        # the slot's state as the node holds it, its paths (server logs) moved to where they came back to
        text = json.dumps(out["slot_state"]).replace(json.dumps(out["node_dir"])[1:-1], json.dumps(runner.sf.dir)[1:-1])
        runner.svc.mirror_remote(json.loads(text))
        for e in out["events"]:  # the node's own ids kept: the slot's state refers to them
            runner.svc.log.append(e.get("tool") or self.tool, e.get("event") or "remote", decision_id=e.get("id"),
                                  **{k: v for k, v in e.items() if k not in ("tool", "event", "ts", "id", "vkit_version")},
                                  node_ts=e.get("ts"))
        if "error" in out:
            code, msg, kind = out["error"]
            raise (Unavailable(msg) if code == int(ExitCode.UNAVAILABLE) else VkitError(msg, ExitCode(code)))
        return out["result"]

    def pid(self, slot: str) -> int:
        return self.ray.get(self.workers[slot].pid.remote(), timeout=60)

    def release(self, slot: str) -> None:
        """The slot's worker ended (its server stopped first by the caller)."""
        w = self.workers.pop(slot, None)
        if w is not None:
            try:
                self.ray.kill(w)
            except self.ray.exceptions.RayError:
                pass
