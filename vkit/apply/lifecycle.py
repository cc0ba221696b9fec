"""APPLY with rollback as the default branch (seed 004 §6, §9).

``Lifecycle.restart`` applies a candidate configuration: lease, policy, record the
rollback target, stop, start, wait for health while watching the process and its log,
verify. Any failure rolls back to the last *kept* configuration — never to the last
changed one — and verifies it. Two candidate start failures in a row (a successful
rollback between them does not reset the count; a successful candidate start does), or a
rollback that itself fails, mark the environment ABNORMAL; every later restart refuses
until a human runs ``state --clear-abnormal``.

A restart interrupted (SIGINT/SIGTERM) goes back to the kept configuration first. A vkit
killed with -9 mid-restart leaves ``candidate.status == "applying"`` and the recorded pid:
the next lifecycle command sees that its owner is gone and recovers to the kept config.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

from vkit.apply import launcher
from vkit.apply.backend import PROCESS, Backend
from vkit.apply.launcher import Running
from vkit.apply.policy import Policy
from vkit.apply.verify import CACHE_CONFIG_KEYS
from vkit.errors import Abnormal, ExitCode, VkitError
from vkit.interrupts import Interrupts
from vkit.state import StateFile, now_iso, pid_alive


class Interrupted(VkitError):
    code = ExitCode.INTERRUPTED


@dataclass
class Outcome:
    ok: bool
    code: int
    action: str  # applied | kept | rolled_back | abnormal | recovered
    message: str
    diagnosis: dict | None = None
    candidate: dict | None = None
    kept: dict | None = None
    startup: dict = field(default_factory=dict)
    decision_id: str | None = None
    events: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def expectations(config: dict) -> dict:
    """What post_start_verify can check of a configuration from the server's own reports."""
    out = {}
    if "max_model_len" in config:
        out["max_model_len"] = config["max_model_len"]
    for k in CACHE_CONFIG_KEYS:
        if k in config:
            out[k] = config[k]
    return out


class Lifecycle:
    def __init__(
        self,
        sf: StateFile,
        tool: str,
        owner: str,
        progress: Callable[[str], None] = lambda s: None,
        ready_timeout_s: float = 600.0,
        grace_s: float = 15.0,
        verify_timeout_s: float = 60.0,
        interrupted: Callable[[], bool] = lambda: False,
        policy: Policy | None = None,
        backend: Backend | None = None,
    ):
        self.sf = sf
        self.tool = tool
        self.owner = owner
        self.progress = progress
        self.ready_timeout_s = ready_timeout_s
        self.grace_s = grace_s
        self.verify_timeout_s = verify_timeout_s
        self.interrupted = interrupted
        self.policy = policy or Policy.load()
        self.backend = backend or PROCESS  # where the server runs: a process, or the simulator in virtual time

    # -- helpers ---------------------------------------------------------
    def _log(self, event: str, **kw) -> str:
        return self.sf.log.append(self.tool, event, owner=self.owner, **kw)

    def _check_interrupt(self) -> None:
        if self.interrupted():
            raise Interrupted("interrupted")

    def _stop_running(self, st: dict) -> None:
        run = st["service"].get("running")
        if run and run.get("pid"):
            self.progress(self.backend.stop(run, st["service"]["launch"], grace_s=self.grace_s))
            self.sf.service.set_running(None)
        # a server this state launched but never recorded (vkit killed between its start and the
        # state write) still holds the port: stop it too
        for line in self.backend.stop_tagged(launcher.tag_for(self.sf.dir), grace_s=self.grace_s):
            self.progress(f"an unrecorded server of this state: {line}")
            self._log("orphan_stopped", what=line)

    def _start_and_verify(self, st: dict, config: dict, role: str) -> tuple[bool, dict, Running | None, dict]:
        """Start ``config``; returns (ok, diagnosis-or-{}, running, startup facts)."""
        svc = st["service"]
        log = launcher.log_path_for(self.sf.dir, role)
        self.progress(f"starting the {role} configuration: {' '.join(launcher.to_serve_flags(config)) or '(launch defaults)'}")
        run = self.backend.start(svc["launch"], config, log, tag=launcher.tag_for(self.sf.dir))
        self.sf.service.set_running(dict(run.as_state(), config=config, role=role))
        ready = self.backend.wait_ready(
            svc["url"], run, self.ready_timeout_s,
            on_wait=lambda el: self.progress(f"waiting for /health ({el:.0f} s)"),
            stop_flag=self.interrupted if role == "candidate" else None,
        )
        lines = self.backend.tail(run.log, 400)
        facts = launcher.startup_facts(lines)
        facts["ready_s"] = round(ready.seconds, 2)
        if not ready.ok:
            if ready.why == "interrupted":
                return False, {"kind": "interrupted", "quote": "", "advice": ""}, run, facts
            return False, dict(ready.diagnosis or {}, why=ready.why), run, facts
        self.progress(f"/health 200 after {ready.seconds:.1f} s; verifying")
        v = self.backend.verify(svc["url"], svc["model"], expectations(config), timeout_s=self.verify_timeout_s)
        if not v.ok:
            return False, {"kind": "verify_failed", "quote": v.summary_line(), "advice": "read the server log",
                           "why": f"post_start_verify failed: {v.summary_line()}", "verify": v.as_dict()}, run, facts
        if not run.is_alive():
            d = launcher.diagnose(self.backend.tail(run.log))
            return False, dict(d, why=f"the server exited right after verification: {d['quote']}"), run, facts
        idle = next((c.evidence.get("idle_w") for c in v.checks if c.id == "accelerator"), None)
        if idle is not None:
            facts["idle_w"] = idle  # the energy of every run on this start is judged against it
        return True, {}, run, facts

    def mark_abnormal(self, reason: str) -> str:
        did = self._log("abnormal", reason=reason)
        self.sf.service.set_abnormal(reason, did)
        return did

    # -- public ----------------------------------------------------------
    def refuse_if_abnormal(self) -> None:
        ab = self.sf.read().get("abnormal") or {}
        if ab.get("flag"):
            raise Abnormal(
                f"the environment is ABNORMAL since {ab.get('since')}: {ab.get('reason')}; "
                "fix the cause, then run `state --clear-abnormal --reason ...`"
            )

    def recover_orphan(self) -> Outcome | None:
        """A restart whose vkit died mid-way (kill -9): put the kept configuration back."""
        st = self.sf.read()
        cand = st.get("candidate") or {}
        if cand.get("status") != "applying":
            return None
        opid = cand.get("owner_pid")
        if opid and opid != os.getpid() and pid_alive(opid) and cand.get("owner") != self.owner:
            return None  # someone is applying right now (the lease should have stopped us earlier)
        self.progress(f"found an unfinished restart by {cand.get('owner')} (pid {opid} gone): recovering the kept configuration")
        self._log("orphan_detected", candidate=cand, running=st["service"].get("running"))
        out = self.rollback(reason="recovering from an interrupted restart (vkit was killed mid-restart)")
        out.action = "recovered" if out.ok else out.action
        return out

    def restart(self, changes: dict, allow: list[str] = (), keep: bool = False) -> Outcome:
        self.refuse_if_abnormal()
        st = self.sf.read()
        kept = dict(st["kept"]["config"])
        diff = {k: v for k, v in changes.items() if kept.get(k) != v}
        overrides = self.policy.check_change(diff, frozen=st.get("frozen") or {}, allow=allow)
        cand_cfg = dict(kept, **changes)
        did = self._log("apply", kept=kept, candidate=cand_cfg, changes=diff, overrides=overrides)
        self.sf.service.begin_candidate({"config": cand_cfg, "changes": diff, "since": now_iso(), "owner": self.owner,
                                 "owner_pid": os.getpid(), "decision_id": did})
        try:
            self._check_interrupt()
            self._stop_running(self.sf.read())
            self._check_interrupt()
            ok, diag, run, facts = self._start_and_verify(self.sf.read(), cand_cfg, "candidate")
        except (Interrupted, KeyboardInterrupt):
            ok, diag, run, facts = False, {"kind": "interrupted"}, None, {}
        if diag.get("kind") == "interrupted" or self.interrupted():
            self.progress("interrupted: restoring the kept configuration")
            self._log("interrupted", candidate=cand_cfg)
            back = self.rollback(reason="interrupted during a restart", failed_run=run)
            raise Interrupted("interrupted; " + ("the kept configuration is back and verified" if back.ok else back.message))
        if ok:
            self.sf.service.candidate_applied(facts, checks=["post_start_verify"])  # _start_and_verify passed it
            self._log("applied", candidate=cand_cfg, startup=facts, decision_id_apply=did)
            out = Outcome(True, ExitCode.OK, "applied", f"candidate applied and verified in {facts.get('ready_s')} s",
                          candidate=cand_cfg, kept=kept, startup=facts, decision_id=did)
            if keep:
                kid = self.keep(reason="manual --keep after a verified start")
                out.action, out.decision_id = "kept", kid
                out.message += f"; kept by hand ({kid})"
            return out
        # failure: diagnose, count, roll back
        why = diag.get("why") or diag.get("quote") or "start-up failed"
        n_fail = self.sf.service.candidate_failed({k: v for k, v in diag.items() if k != "verify"})
        fid = self._log("start_failed", candidate=cand_cfg, diagnosis=diag, consecutive=n_fail, log=run.log if run else None)
        self.progress(f"candidate failed ({diag.get('kind')}): {why}")
        back = self.rollback(reason=f"candidate failed: {why}", failed_run=run)
        if not back.ok:
            return Outcome(False, ExitCode.UNAVAILABLE, "abnormal", f"{why}; and the rollback failed: {back.message}",
                           diag, cand_cfg, kept, facts, fid)
        if n_fail >= 2:
            reason = f"{n_fail} candidate start failures in a row; last: {why}"
            self.mark_abnormal(reason)
            return Outcome(False, ExitCode.UNAVAILABLE, "abnormal",
                           f"{why}; rolled back to the kept configuration, and the environment is now ABNORMAL ({reason})",
                           diag, cand_cfg, kept, facts, fid)
        return Outcome(False, ExitCode.REJECTED, "rolled_back", f"{why}; rolled back to the kept configuration and verified it",
                       diag, cand_cfg, kept, facts, fid)

    def rollback(self, reason: str, failed_run: Running | None = None) -> Outcome:
        """Stop whatever runs, start the kept configuration, verify. A failure marks ABNORMAL."""
        st = self.sf.read()
        kept = dict(st["kept"]["config"])
        if failed_run is not None:
            self.progress(self.backend.stop(failed_run, st["service"]["launch"], grace_s=self.grace_s))
            running = st["service"].get("running") or {}
            if running.get("pid") == failed_run.pid:
                self.sf.service.set_running(None)
                st = self.sf.read()
        self._stop_running(st)
        ok, diag, run, facts = self._start_and_verify(self.sf.read(), kept, "kept")
        if ok:
            self.sf.service.rolled_back(facts)
            did = self._log("rolled_back", kept=kept, reason=reason, startup=facts)
            return Outcome(True, ExitCode.OK, "rolled_back", f"kept configuration restored and verified ({reason})",
                           kept=kept, startup=facts, decision_id=did)
        why = diag.get("why") or diag.get("quote") or "start-up failed"
        did = self.mark_abnormal(f"rollback to the kept configuration failed: {why} (after: {reason})")
        return Outcome(False, ExitCode.UNAVAILABLE, "abnormal", f"rollback failed: {why}", diag, kept=kept, decision_id=did)

    def stop(self, reason: str = "the run is over") -> None:
        """Stop the server this state file started (a slot's, at the end of a tune); logged."""
        st = self.sf.read()
        if (st["service"].get("running") or {}).get("pid"):
            self._log("stopped", reason=reason, running=st["service"]["running"])
        self._stop_running(st)

    def keep(self, reason: str, decision: str = "manual", decision_id: str | None = None) -> str:
        """Make the applied candidate the kept configuration (the rollback target). ``decision_id``: an id the
        caller reserved and recorded first; when the log already holds that keep (stopped between the log and
        the state), it is not logged twice, only applied."""
        st = self.sf.read()
        cand = st.get("candidate") or {}
        if cand.get("status") != "applied":
            raise VkitError(f"no applied candidate to keep (candidate status: {cand.get('status')})", ExitCode.USAGE)
        self.policy.require(cand.get("checks") or [], before="keep")
        if decision_id and self.sf.log.holds("keep", decision_id):
            self.sf.service.set_kept(cand["config"], decision_id, decision)
            return decision_id
        did = self._log("keep", decision_id=decision_id, config=cand["config"], previous=st["kept"], reason=reason, decision=decision)
        self.sf.service.set_kept(cand["config"], did, decision)
        return did



@dataclass
class Held:
    """How a restart or rollback runs: its lease, its timeouts, where it reports."""

    owner: str
    ready_timeout_s: float = 600.0
    grace_s: float = 15.0
    lease_ttl_s: float = 3600.0
    progress: Callable[[str], None] = lambda s: None
    interrupts: Interrupts = field(default_factory=Interrupts)
    on_interrupt: Callable[[], None] | None = None
    policy: Policy | None = None
    backend: Backend | None = None


def run_held(sf: StateFile, tool: str, how: Held, body: Callable[[Lifecycle], Outcome]) -> tuple[int, Outcome | None]:
    """``body`` under the lease, after recovering a restart an earlier run left unfinished: what
    restart_with_rollback and rollback do. An interrupt lets the step under way finish safely
    (a restart rolls back). Returns the exit code and the outcome (None when interrupted)."""
    sf.read()  # missing/corrupt state → exit 4/3 before anything is touched
    with how.interrupts.deferred(on_first=how.on_interrupt) as stop:
        lc = Lifecycle(sf, tool, how.owner, progress=how.progress, ready_timeout_s=how.ready_timeout_s, grace_s=how.grace_s,
                       interrupted=stop.is_set, policy=how.policy, backend=how.backend)
        with sf.leases.hold(how.owner, ttl_s=how.lease_ttl_s, tool=tool):
            rec = lc.recover_orphan()
            if rec is not None:
                how.progress(f"recovery: {rec.message}")
                if not rec.ok:
                    return rec.code, rec
            out = body(lc)
    if stop.is_set() and out.ok:
        return ExitCode.INTERRUPTED, out
    return out.code, out
