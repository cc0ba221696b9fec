"""The drift sentinel: the kept configuration re-measured, its series checked for a level change."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from vkit.decide.kept import kept_series
from vkit.errors import ExitCode
from vkit.state import now_iso

if TYPE_CHECKING:
    from vkit.tune.context import Tune


SENTINEL_CHECKS = 4  # sentinel checks a tune makes (after steps 2, 3, 4 and 5): the level check's Bonferroni count


class Sentinel:
    """The tune's drift sentinel over the kept configuration's series."""

    def __init__(self, r: Tune):
        self.r = r

    def kept_series(self) -> list[tuple[str, dict]]:
        return kept_series(self.r.ledger.raw(), self.r.ledger.load)

    def check(self) -> dict:
        """Re-measure the kept configuration once and look for a level change in everything measured
        of it since the last alarm (``kept_series``); on a change, the alarm time resets the series."""
        from vkit.decide.drift import MIN_RUNS, detect, level_check

        self.r.seat.restore_kept(fresh=True)
        st = self.r.ledger.tune()
        d = os.path.join(self.r.runs_dir, "sentinel")
        k = 1 + (sum(1 for f in os.listdir(d) if f.endswith(".json")) if os.path.isdir(d) else 0)  # never overwrite
        path, doc, check = self.r.measurer.measure("sentinel", k)
        if check["code"] == ExitCode.INVALID:
            # an invalid run (failed requests, a broken gauge) says nothing of the level: kept out of the series
            trials = st.trials()
            out = {"after_trial": trials[-1]["id"] if trials else None, "runs": None, "min_runs": MIN_RUNS, "detector": None,
                   "changed": False, "shift": None, "last": None,
                   "why": f"invalid sentinel run {path} ({', '.join(check.get('findings') or [])}): no drift verdict"}
            self.r.sf.tune.record_drift_check(dict(out, ts=now_iso()))
            self.r.log("drift_check", **out)
            return out
        self.r.sf.tune.add_kept_repeat(path)
        series = self.kept_series()
        vals = [d["output_throughput"] for _, d in series]
        # σ from the series' own reference window: the baseline's σ comes from a handful of runs, and the
        # detectors' thresholds for a given σ assume it exact (drift.py: "estimated" calibration).
        if len(vals) >= MIN_RUNS:
            res = detect(vals)
        else:
            # too short for the detectors: the sentinel's start against the earlier starts' level, calibrated
            # for the tune's few starts (drift.level_check; false alarms and delay in bench/bench_drift_tune.py)
            known = self.r.ledger.tune().run_starts
            groups: dict = {}
            for i, (p, d) in enumerate(series):
                groups.setdefault(known.get(p) or f"unknown-{i}", []).append(d["output_throughput"])
            mine = known.get(path) or next(iter(reversed(groups)))
            latest = groups.pop(mine, [doc["output_throughput"]])
            res = level_check(list(groups.values()), latest, checks=SENTINEL_CHECKS)
            res.setdefault("detector", "level_check")
            if res.get("changed"):
                res["change_index"] = next(i for i, (p, _) in enumerate(series) if (known.get(p) or "") == mine)
        trials = st.trials()
        out = {"after_trial": trials[-1]["id"] if trials else None, "runs": len(vals), "min_runs": MIN_RUNS,
               "detector": res.get("detector"), "changed": bool(res.get("changed")), "shift": res.get("shift"),
               "why": res.get("why") or res.get("verdict"), "last": doc["output_throughput"]}
        change = None
        if out["changed"]:
            # Runs before now no longer describe the server: the series restarts, the baseline is re-measured.
            ci = res.get("change_index")
            cp, cdoc = series[ci] if ci is not None else (None, {})
            change = {"reset": now_iso(), "changed": True, "change_date": cdoc.get("date") or now_iso(),
                      "change_run": cp, "shift": out["shift"], "detector": res.get("detector"), "source": "tune sentinel"}
        self.r.sf.tune.record_drift_check(dict(out, ts=now_iso()), change)
        self.r.log("drift_check", **out)
        return out
