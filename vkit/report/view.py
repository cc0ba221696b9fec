"""The tune result read once, defensively: every renderer's facts come from one ``View``.

A key of the wrong type reads as missing (``{}``, ``[]`` or ``""``); nothing here formats
for a particular output, it only picks and orders what the result holds.
"""

from __future__ import annotations

import json
from typing import Any

from vkit.report.text import (
    MAX_TRIAL_METRICS,
    TRIAL_METRICS,
    X_KEY,
    Y_DEFAULT,
    as_dict,
    as_list,
    as_text,
    config_text,
    flags_text,
    fmt_metric,
    fmt_num,
    metric_label,
    num,
    value_text,
)


class View:
    """What the section model needs, read defensively from the result."""

    def __init__(self, result: Any):
        r = as_dict(result)
        self.r = r
        self.schema = as_text(r.get("schema"))
        self.title = as_text(r.get("title")) or "vkit tuning report"
        self.generated = as_text(r.get("generated"))
        self.simulated = bool(r.get("simulated"))
        self.server = as_dict(r.get("server"))
        self.workload = as_dict(r.get("workload"))
        self.goal = as_dict(r.get("goal"))
        self.baseline = as_dict(r.get("baseline"))
        self.trials = [t for t in as_list(r.get("trials")) if isinstance(t, dict)]
        self.steps = [s for s in as_list(r.get("steps")) if isinstance(s, dict)]
        self.knee = as_dict(r.get("knee"))
        self.pareto = [p for p in as_list(r.get("pareto")) if isinstance(p, dict)]
        self.dropped = [p for p in as_list(r.get("not_confirmed")) if isinstance(p, dict)]
        self.rec = as_dict(r.get("recommendation"))
        self.stop_rule = as_text(r.get("stop_rule"))
        self.drift = [x for x in as_list(r.get("drift")) if isinstance(x, dict)]
        self.warnings = [as_text(w) for w in as_list(r.get("warnings")) if w is not None]
        self.soak = as_text(r.get("soak"))
        self.timings = as_dict(r.get("timings"))
        self.by_id = {as_text(t.get("id")): t for t in self.trials if t.get("id") is not None}
        self.knee_id = as_text(self.knee.get("trial_id"))
        self.rec_id = as_text(self.rec.get("trial_id"))
        # the latency axis: P95 TTFT at the workload's load, or, tuning for capacity, mean TPOT at the
        # reference load (interactivity; the SLO is inside the capacity then, no line to draw)
        self.capacity = as_dict(r.get("capacity"))
        # (with j-per-token: J per output token at the required load, the figure the goal minimises)
        self.x_key = {"capacity": "ref_mean_tpot_ms", "capacity-per-kw": "ref_mean_tpot_ms",
                      "j-per-token": "ref_j_per_output_token"}.get(as_text(self.goal.get("objective")), X_KEY)
        self.slo = num(as_dict(self.goal.get("subject_to")).get(self.x_key))
        if self.slo is None:
            self.slo = num(as_dict(self.workload.get("slo")).get(self.x_key))
        self.y_key = self._y_key()
        self.step_names = {}
        for s in self.steps:
            if s.get("step") is not None and s.get("name"):
                self.step_names[as_text(s.get("step"))] = as_text(s.get("name"))
        order: list[str] = [as_text(s.get("step")) for s in self.steps if s.get("step") is not None]
        for t in self.trials:
            k = as_text(t.get("step"))
            if k not in order:
                order.append(k)
        self.step_order = order

    def _y_key(self) -> str:
        """The goal's metric when the trials carry it, else output throughput."""
        want = as_text(self.goal.get("maximize")) or ("slo_capacity" if self.goal.get("minimize") else "")
        if want and want != Y_DEFAULT:
            pts = [as_dict(t.get("metrics")) for t in self.trials] + [as_dict(p.get("metrics")) for p in self.pareto]
            if any(num(m.get(want)) is not None for m in pts):
                return want
        return Y_DEFAULT

    def step_label(self, step: str) -> str:
        if step == "":
            return "no step"
        name = self.step_names.get(step)
        return f"step {step}: {name}" if name else f"step {step}"

    def roles_of(self, trial_id: str) -> list[str]:
        """"knee" and/or "recommended", for a Pareto row's note."""
        return [n for n, ok in (("knee", trial_id == self.knee_id), ("recommended", trial_id == self.rec_id)) if ok]

    def metrics_of(self, trial_id: str, entry: dict | None = None) -> dict:
        """Metrics of a Pareto/knee entry, falling back on the trial's own."""
        m = dict(as_dict(self.by_id.get(trial_id, {}).get("metrics")))
        if entry:
            m.update({k: v for k, v in as_dict(entry.get("metrics")).items() if v is not None})
        return m

    def plotted(self) -> tuple[list[tuple[dict, float, float]], list[dict]]:
        """Measured, valid trials with both plot metrics; and the trials left out."""
        pts, left = [], []
        for t in self.trials:
            m = as_dict(t.get("metrics"))
            x, y = num(m.get(self.x_key)), num(m.get(self.y_key))
            if t.get("status") == "measured" and t.get("valid") is not False and x is not None and y is not None:
                pts.append((t, x, y))
            else:
                left.append(t)
        return pts, left

    def baseline_point(self) -> tuple[float, float] | None:
        bm = as_dict(self.baseline.get("metrics"))
        x, y = num(as_dict(bm.get(self.x_key)).get("mean")), num(as_dict(bm.get(self.y_key)).get("mean"))
        return None if x is None or y is None else (x, y)

    def front(self) -> list[tuple[dict, float, float]]:
        """Pareto entries with both plot metrics, by latency."""
        out = []
        for p in self.pareto:
            m = self.metrics_of(as_text(p.get("trial_id")), p)
            x, y = num(m.get(self.x_key)), num(m.get(self.y_key))
            if x is not None and y is not None:
                out.append((p, x, y))
        return sorted(out, key=lambda e: (e[1], e[2]))

    def knee_is_rec(self) -> bool:
        """Whether the knee and the recommendation are one configuration (one trial, or the kept
        configuration's entry and a trial of the same flags): one point in every figure."""
        if not self.knee_id or not self.rec_id:
            return False
        kc = self.knee.get("config") or as_dict(self.by_id.get(self.knee_id)).get("config")
        rc = self.rec.get("config") or as_dict(self.by_id.get(self.rec_id)).get("config")
        return self.knee_id == self.rec_id or (kc is not None and kc == rc)

    def point_of(self, trial_id: str, entry: dict | None = None) -> tuple[float, float] | None:
        if not trial_id:
            return None
        m = self.metrics_of(trial_id, entry)
        for p in self.pareto:
            if as_text(p.get("trial_id")) == trial_id:
                m.update({k: v for k, v in as_dict(p.get("metrics")).items() if v is not None})
        x, y = num(m.get(self.x_key)), num(m.get(self.y_key))
        return None if x is None or y is None else (x, y)

    def capacity_rows(self) -> list[tuple[str, str, dict]]:
        """(trial id, configuration, capacity) of every configuration a capacity search measured: the
        kept one first (its baseline searches), then each trial that carries one."""
        out = []
        kept = as_dict(self.capacity.get("kept"))
        if kept:
            out.append(("kept", config_text(self.baseline.get("config")), kept))
        for t in self.trials:
            c = as_dict(t.get("capacity"))
            if c:
                out.append((as_text(t.get("id")), config_text(t.get("changes") if t.get("changes") is not None
                                                               else t.get("config")), c))
        return out

    def trial_metric_keys(self) -> list[str]:
        present: set[str] = set()
        for t in self.trials:
            present.update(k for k, v in as_dict(t.get("metrics")).items() if num(v) is not None)
        return self._key_metrics(present)

    def _key_metrics(self, present: set[str]) -> list[str]:
        """The metrics worth a column: the usual ones and the goal's; only when none of them is
        there, whatever is (a full bench summary has dozens of keys)."""
        keys = [k for k in TRIAL_METRICS if k in present]
        for k in [self.y_key] + list(as_dict(self.goal.get("subject_to"))):
            if k in present and k not in keys:
                keys.insert(0 if k == self.y_key else len(keys), k)
        return (keys or sorted(present))[:MAX_TRIAL_METRICS]

    def baseline_metrics(self) -> list[tuple[str, dict]]:
        bm = as_dict(self.baseline.get("metrics"))
        keys = self._key_metrics({k for k, m in bm.items() if num(as_dict(m).get("mean")) is not None})
        return [(k, as_dict(bm[k])) for k in keys]

    def serve_command(self) -> str:
        cmd = as_text(self.rec.get("serve_command"))
        if cmd:
            return cmd
        flags = flags_text(self.rec.get("serve_flags"))
        return f"vllm serve MODEL {flags}" if flags else ""

    def verdict_text(self, t: dict) -> str:
        v = t.get("verdict")
        return as_text(v) if v else "–"

    def status_text(self, t: dict) -> str:
        s = as_text(t.get("status")) or "–"
        if t.get("kept") is True:
            s += ", kept"
        return s

    def why_text(self, t: dict) -> str:
        why = as_text(t.get("why"))
        diag = t.get("diagnosis")
        if diag:
            d = diag if isinstance(diag, str) else json.dumps(diag, sort_keys=True, default=str)
            why = f"{why} (diagnosis: {d})" if why else f"diagnosis: {d}"
        return why

    def workload_text(self) -> str:
        w = self.workload
        parts = []
        known = {"dataset": "dataset {}", "input_len": "input {} tokens", "output_len": "output {} tokens",
                 "max_concurrency": "max concurrency {}", "num_prompts": "{} prompts", "request_rate": "request rate {} req/s"}
        for k, pat in known.items():
            if w.get(k) is not None:
                parts.append(pat.format(value_text(w[k])))
        for k, v in w.items():
            if k not in known and k not in ("slo", "lengths") and v is not None:
                parts.append(f"{k} {value_text(v)}")
        for k, label in (("input_tokens", "prompt tokens"), ("output_tokens", "output tokens asked")):
            d = as_dict(as_dict(w.get("lengths")).get(k))
            if num(d.get("p50")) is not None and num(d.get("min")) != num(d.get("max")):
                parts.append(f"{label} p50 {fmt_num(d['p50'])} (p5 {fmt_num(d.get('p5'))}, p95 {fmt_num(d.get('p95'))}, "
                             f"max {fmt_num(d.get('max'))})")
        slo = as_dict(w.get("slo"))
        if slo:
            parts.append("SLO " + ", ".join(f"{metric_label(k)} ≤ {fmt_metric(v, k)}" for k, v in slo.items()))
        return "; ".join(parts)

    def server_text(self) -> str:
        s = self.server
        parts = []
        if s.get("model"):
            parts.append(f"model {as_text(s['model'])}")
        if s.get("version"):
            parts.append(f"vLLM {as_text(s['version'])}")
        if s.get("url"):
            parts.append(f"at {as_text(s['url'])}")
        sim = as_dict(s.get("sim"))
        if sim:
            parts.append("simulator: " + ", ".join(f"{k} {value_text(v)}" for k, v in sim.items()))
        return "; ".join(parts)

    def goal_text(self) -> str:
        if self.goal.get("text"):
            return as_text(self.goal["text"])
        parts = []
        if self.goal.get("maximize"):
            parts.append(f"maximize {metric_label(as_text(self.goal['maximize']))}")
        st = as_dict(self.goal.get("subject_to"))
        if st:
            parts.append("subject to " + ", ".join(f"{metric_label(k)} ≤ {fmt_metric(v, k)}" for k, v in st.items()))
        return " ".join(parts)

    def timings_text(self) -> str:
        parts = []
        if num(self.timings.get("total_s")) is not None:
            parts.append(f"total {fmt_num(self.timings['total_s'])} s")
        if num(self.timings.get("restarts")) is not None:
            rs = num(self.timings.get("restart_s"))
            parts.append(f"{fmt_num(self.timings['restarts'])} server restarts" + (f" ({fmt_num(rs)} s)" if rs is not None else ""))
        if num(self.timings.get("runs")) is not None:
            ms = num(self.timings.get("run_s"))
            parts.append(f"{fmt_num(self.timings['runs'])} measurements" + (f" ({fmt_num(ms)} s)" if ms is not None else ""))
        if num(self.timings.get("other_s")) is not None:
            parts.append(f"{fmt_num(self.timings['other_s'])} s other (gates, waiting, reports)")
        return ", ".join(parts)

    def empty_pareto_text(self) -> str:
        return ("No Pareto front: no trial was measured." if not self.plotted()[0]
                else "No Pareto front in the result.")


    def knee_line(self) -> str:
        """The knee: its trial, configuration and where it sits on the plot."""
        pt = self.point_of(self.knee_id, self.knee)
        cfg = self.knee.get("config") or as_dict(self.by_id.get(self.knee_id)).get("config")
        s = f"{self.knee_id} — {config_text(cfg)}"
        if pt:
            s += f" — {fmt_metric(pt[1], self.y_key)} at {metric_label(self.x_key)} {fmt_metric(pt[0], self.x_key)}"
        return s
