"""``tune --search twin --twin-design``: designed calibration runs on the configuration already running.

Where the baseline's load points leave a parameter of the twin's fit unidentified (``auto``), or always
(``always``), the twin step measures closed-loop runs of the kept configuration on the server as it
runs, with no restart (:func:`vkit.sim.designfit.design`: concurrency 1 and the KV-bound one at the workload's
lengths, and a long prompt one at a time; :func:`vkit.sim.designfit.requests_for` requests each), records them under the
state's ``tune.twin_design`` and the twin is refitted on the points and the runs together
(:class:`vkit.sim.designfit.JointProblem`). The decision log's ``twin_design`` event names the runs and
what each parameter's standard error was before and after.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from vkit.sim.designfit import design, requests_for, serving
from vkit.tune.config import Workload

if TYPE_CHECKING:
    from vkit.tune.context import Tune

MODES = ("auto", "always", "off")


class TwinDesign:
    """The designed runs of one twin step: whether they are wanted, and measuring them."""

    def __init__(self, runner: Tune, mode: str, progress: Callable[[str], None]):
        self.runner, self.mode, self.progress = runner, mode, progress
        self.done = False

    def wanted(self, fit: dict) -> list[str]:
        """The parameters the designed runs are for: those ``fit`` (a twin's calibration report) left unidentified
        under ``auto``, every fitted one under ``always``; none once measured, or under ``off``."""
        if self.done or self.mode == "off":
            return []
        table = fit.get("table") or {}
        return [n for n, row in table.items() if self.mode == "always" or not row.get("identified")]

    def measure(self, why: list[str]) -> list[str]:
        """The runs, measured on the running kept configuration and recorded in the state: their paths (relative to
        the state's folder); none when the server runs another configuration than the kept one (said)."""
        self.done = True
        r = self.runner
        kept = dict(r.ledger.kept_config())
        running = dict((r.served.running() or {}).get("config") or {})
        if running != kept:
            self.progress(f"twin design: the server runs {running}, not the kept {kept}: no designed run (it would "
                          "need a restart)")
            return []
        w = r.s.workload
        opts = w.options
        # the launch's engine flags under the kept configuration: the model length the long prompt must fit is one
        runs = design(serving(r.ledger.raw(), kept), r.served.server().startup, int(opts.random_input_len),
                      int(opts.random_output_len))
        self.progress(f"twin design: {', '.join(why)} not identified by the load points; closed-loop runs on the running "
                      "configuration (no restart): " + ", ".join(f"{c} at a time x {n} prompt tokens" for c, n in runs))
        paths = []
        for c, n in runs:
            o = replace(opts, max_concurrency=c, request_rate=math.inf, exact_rate=False, num_prompts=requests_for(c),
                        duration=None, num_warmups=0, random_input_len=n)
            path, _, _ = r.measurer.measure(f"twin-design-c{c}-in{n}", 0, Workload(options=o, seed=w.seed, name="twin-design"))
            paths.append(path)
        r.sf.tune.update(twin_design={"config": kept, "runs": paths, "design": [list(x) for x in runs], "for": why})
        return paths
