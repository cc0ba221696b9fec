"""The server a tune restarts: restart with rollback to a configuration, health, what runs.

:class:`ProcessServer` is one server on its backend (a process by default, the simulator in virtual
time under ``--virtual``): the service's, or a slot's. Its lifecycle (``lifecycle.run_held``: the
lease, the candidate, post-start verification, rollback, ABNORMAL) works on the server's own state
file ``svc``; the kept configuration and the frozen parameters come from the tune's state file,
copied into a slot's before each restart, and the restart's time is accounted there. The tune's
seat holds one (``vkit.tune.seat.Seat.server``) and a Ray worker holds one beside its slot's server
(``vkit.tune.fleet``): the same code restarts a server wherever it runs.
"""

from __future__ import annotations

from typing import Callable

from vkit.apply.backend import Backend
from vkit.apply.lifecycle import Held, Lifecycle, Outcome, run_held
from vkit.apply.policy import Policy
from vkit.errors import ExitCode, VkitError
from vkit.interrupts import Interrupts
from vkit.state import StateFile
from vkit.tune.ledger import Ledger
from vkit.tune.summaries import plain


class ProcessServer:
    """Restarts of one server under ``owner``'s lease: to a configuration, with rollback to the kept one."""

    def __init__(self, svc: StateFile, tune_sf: StateFile, owner: str, policy: Policy, interrupts: Interrupts,
                 backend: Backend, ready_timeout_s: float):
        self.svc, self.tune_sf = svc, tune_sf
        self.owner, self.policy, self.interrupts, self.backend = owner, policy, interrupts, backend
        self.ready_timeout_s = ready_timeout_s

    def mirror_kept(self) -> None:
        """A slot's rollback target and frozen parameters are the tune's: copied before each restart."""
        if self.svc is not self.tune_sf:
            st = Ledger(self.tune_sf).tune()
            k = st.kept
            self.svc.service.mirror_kept(k["config"], k.get("decision_id"), k.get("decision"), frozen=st.frozen)

    def apply(self, config: dict, fresh: bool = False) -> tuple[bool, dict]:
        """restart_with_rollback to ``config`` (a full configuration); no-op if it already runs,
        unless ``fresh``: a new measurement series starts on a freshly started server, so that no
        request set finds its prompts in the prefix cache from an earlier series on the same process."""
        self.mirror_kept()
        st = Ledger(self.svc).server()
        run, cand = st.running, st.candidate
        if (not fresh and run.get("config") == config and self.backend.alive(run.get("pid"), run.get("ticks"))
                and cand.get("status") != "applying" and self.healthy(st.url)):
            return True, {"action": "already running"}
        kept = st.kept["config"]
        changes = {k: v for k, v in config.items() if kept.get(k) != v}
        removed = [k for k in kept if k not in config]
        if removed:
            raise VkitError(f"a candidate cannot drop kept parameters ({', '.join(removed)})", ExitCode.INTERNAL)
        if not changes:
            code, res, err = self.held("rollback", lambda lc: lc.rollback(reason="measure the kept configuration"))
        else:
            typed = {k: self.policy.coerce(k, v) for k, v in sorted(changes.items())}
            code, res, err = self.held("restart_with_rollback", lambda lc: lc.restart(typed))
        if code == ExitCode.UNAVAILABLE:
            raise VkitError(f"the environment is unavailable or ABNORMAL: {(res.get('message') or err.strip())}", ExitCode.UNAVAILABLE)
        if code == ExitCode.INTERRUPTED:
            raise KeyboardInterrupt
        if code not in (0, 1):
            raise VkitError(f"restart_with_rollback failed (exit {code}): {err.strip()[-300:]}", code)
        return code == 0, res

    def held(self, tool: str, body: Callable[[Lifecycle], Outcome]) -> tuple[int, dict, str]:
        """A restart or rollback as ``tool`` makes it: (exit code, outcome, error message)."""
        how = Held(owner=self.owner, ready_timeout_s=self.ready_timeout_s, interrupts=self.interrupts, policy=self.policy,
                   backend=self.backend)
        t0 = self.backend.now()
        try:
            code, out = run_held(self.svc, tool, how, body)
        except VkitError as e:
            return int(e.code), {}, f"{tool}: error: {' '.join(str(e).split())}"
        finally:
            self.tune_sf.tune.add_time("restart", self.backend.now() - t0)
        return int(code), plain(out.as_dict()) if out is not None else {}, ""

    def healthy(self, url: str) -> bool:
        return self.backend.healthy(url)

    def running_config(self) -> dict | None:
        """The configuration of the process running now (None when none is recorded)."""
        run = Ledger(self.svc).running()
        return run.get("config") if run.get("pid") else None
