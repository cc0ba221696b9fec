"""A tuning run on a state with slots: the serial phases' slot, a lease per slot, a failed slot taken
out, and the other slots stopped at the end (``vkit.tune.driver`` calls these around its phases)."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

from vkit.errors import Abnormal, ExitCode, VkitError
from vkit.state import StateFile
from vkit.tune.context import Tune, for_slot, use_first_slot
from vkit.tune.ledger import Ledger
from vkit.tune.runplan import RunContext


def on_first_slot(runner: Tune) -> Tune:
    """The tune of the serial phases (baseline, confirmations, steps 1, 4m, 5, delivery): on the first
    slot in service when the state has slots, else on the service itself."""
    if not use_first_slot(runner):
        raise Abnormal("every slot of this state has been taken out (see `state show`): fix them, then "
                       "`state --slot-in NAME` and rerun the same command to continue")
    return runner


@contextlib.contextmanager
def slot_leases(sf: StateFile, ctx: RunContext) -> Iterator[None]:
    """One lease per slot under the run's own: a slot's restarts are refused to any other run."""
    with contextlib.ExitStack() as stack:
        for s in Ledger(sf).tune().slots(live=True):
            stack.enter_context(StateFile(os.path.join(sf.dir, s["state"])).leases.hold(ctx.owner, ttl_s=ctx.lease_ttl_s, tool=ctx.tool))
        yield


def take_out_failed_slot(runner: Tune, e: VkitError) -> Tune | None:
    """The serial phases' slot went ABNORMAL (``e``): taken out, and the tune of the next slot in
    service returned (the phase resumes from the state there); None when it is not a slot's failure or
    no slot is left."""
    if e.code != ExitCode.UNAVAILABLE or runner.slot is None:
        return None
    ab = runner.served.server().abnormal
    if not ab.get("flag"):
        return None
    reason = f"ABNORMAL: {ab.get('reason')}"
    did = runner.log("slot_out", slot=runner.slot, reason=reason)
    runner.sf.slots.take_out(runner.slot, reason, did)
    runner.warn(f"slot {runner.slot} taken out: {reason}; the tune goes on with the other slots ({did})")
    try:
        return on_first_slot(runner)
    except Abnormal:
        return None


def stop_other_slots(runner: Tune) -> None:
    """At the end of a run, the slots other than the serial phases' stop their servers (they served
    the run's trials, nothing else); the first slot stays on the kept configuration."""
    from vkit.apply.lifecycle import Lifecycle

    for s in runner.ledger.slots(live=False):
        if s["name"] != runner.slot:
            other = for_slot(runner, s)
            with contextlib.suppress(VkitError):
                if other.seat.remote():
                    runner.fleet.call(other, "stop")
                    runner.fleet.release(s["name"])
                else:
                    Lifecycle(other.svc, runner.tool_name, runner.owner, progress=runner.progress, policy=runner.policy,
                              backend=runner.backend).stop()
