"""The server a tune restarts and measures, as the tune's steps see it: apply a configuration with
rollback, health, what runs, keep, settle between trials.

A :class:`Seat` is over one :class:`vkit.tune.context.Tune`: the service's server, or a slot's
(``context.for_slot``), on the tune's backend (a process, or the simulator in virtual time under
``--virtual``: vkit.tune.server.ProcessServer) or on a Ray worker's node when the slot is served there
(``vkit.tune.fleet``). Which one is the tune's business; the steps call the same five verbs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vkit.apply.lifecycle import Lifecycle
from vkit.errors import ExitCode, VkitError
from vkit.tune.server import ProcessServer

if TYPE_CHECKING:
    from vkit.tune.context import Tune


class Seat:
    """Restarts (with rollback to the kept configuration) and keeps of the server ``t`` measures."""

    def __init__(self, t: Tune):
        self.t = t

    @property
    def server(self) -> ProcessServer:
        """The server (the service's, or its slot's), on the tune's backend."""
        t = self.t
        return ProcessServer(t.svc, t.sf, t.owner, t.policy, t.interrupts, t.backend, t.s.ready_timeout_s)

    def running_config(self) -> dict | None:
        return self.server.running_config()

    def remote(self) -> bool:
        """This seat's slot is served on a Ray node (``vkit.tune.fleet``)."""
        return self.t.fleet is not None and self.t.slot is not None

    def apply(self, config: dict, fresh: bool = False) -> tuple[bool, dict]:
        """restart_with_rollback to ``config`` (``ProcessServer.apply``), on the slot's Ray worker when it is served there."""
        if self.remote():
            self.server.mirror_kept()
            ok, res = self.t.fleet.call(self.t, "apply", dict(config), fresh)
            return bool(ok), res
        return self.server.apply(config, fresh)

    def healthy(self, url: str) -> bool:
        if self.remote():
            return bool(self.t.fleet.call(self.t, "healthy", url))
        return self.server.healthy(url)

    def settle(self) -> None:
        """Between two trials or steps. In production (``--yes``) the service goes back to the kept
        configuration at once, so that it serves traffic on it between trials. In a sandbox it stays
        on whatever runs: the next trial restarts the server anyway, and the kept configuration is
        started when it must be measured or the tune ends (each rollback skipped is a restart saved)."""
        if not self.t.s.sandbox:
            self.restore_kept()

    def restore_kept(self, fresh: bool = False) -> None:
        kept = self.t.ledger.kept_config()
        ok, res = self.apply(dict(kept), fresh=fresh)
        if not ok:
            raise VkitError(f"the kept configuration does not start: {res.get('message')}", ExitCode.UNAVAILABLE)

    def keep(self, reason: str, decision: str, decision_id: str | None = None) -> str:
        """The applied candidate on this seat's server becomes the kept configuration (the lifecycle's
        keep, logged); on a slot, the tune's state records it too (the other slots copy it at their next restart)."""
        t = self.t
        previous = t.ledger.tune().kept
        lc = Lifecycle(t.svc, t.tool_name, t.owner, progress=t.progress, policy=t.policy, backend=t.backend)
        did = lc.keep(reason=reason, decision=decision, decision_id=decision_id)
        if t.svc is not t.sf:
            k = t.served.server().kept
            t.sf.service.mirror_kept(k["config"], did, decision)
            if not t.sf.log.holds("keep", did):
                t.sf.log.append(t.tool_name, "keep", decision_id=did, config=k["config"], previous=previous, reason=reason,
                                decision=decision, slot=t.slot)
        return did
