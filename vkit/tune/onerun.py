"""One measurement of the configuration running on a server, as it is made wherever the server runs.

:class:`OneRun` makes one bench_stream run, or one SLO-capacity search when the workload is the
capacity objective's, of the configuration a server runs now: its files under the runs folder, the
summary, and check_invariants' (or the capacity checker's) verdict. It re-measures nothing and records
nothing in the state: the tune's measurer (``vkit.tune.measurement``) does that around it, on the
driver. The tune's measurer makes one per measurement, and a Ray worker makes one beside its slot's
server (``vkit.tune.fleet``).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from functools import cached_property
from typing import Callable

from vkit.apply.backend import Backend
from vkit.errors import ExitCode, VkitError
from vkit.interrupts import Interrupts
from vkit.measure.gauge import build_config
from vkit.state import atomic_write_text
from vkit.tune import capmeasure
from vkit.tune.config import Settings, Workload
from vkit.tune.ledger import Ledger
from vkit.tune.summaries import bench_failed, capacity_checker, cut_by_the_client, plain, relative
from vkit.validate import invariants


class OneRun:
    """One run (or capacity search) on the server ``served`` describes, under ``runs_dir``; paths relative
    to the tune's state file's folder, the command that repeats it by hand naming that file."""

    def __init__(self, s: Settings, tune: Ledger, served: Ledger, runs_dir: str, backend: Backend, interrupts: Interrupts,
                 progress: Callable[[str], None]):
        self.s, self.tune, self.served = s, tune, served
        self.runs_dir, self.backend, self.interrupts, self.progress = runs_dir, backend, interrupts, progress
        self.state_path, self.state_dir = tune.f.path, tune.f.dir

    def bench(self, cfg, records: str, output: str) -> dict:
        """One bench_stream run on the backend (its files written, its summary returned); its energy judged
        against the idle power measured at this start where one was."""
        if cfg.idle_w is None:
            cfg.idle_w = self.idle_w
        return self.backend.bench(cfg, records, output, self.interrupts)

    @cached_property
    def idle_w(self) -> float | None:
        """The boards' idle power post_start_verify read at the running start (``service.startup.idle_w``):
        read once, the server does not restart within one measurement."""
        return self.served.server().startup.get("idle_w")

    def once(self, label: str, k: int, workload: Workload | None = None) -> tuple[str, dict, dict]:
        """Run ``k`` of ``label`` (seed + k): (path relative to the state's folder, summary, check)."""
        w = workload or self.s.workload
        if w.kind == "capacity" and self.s.capacity is not None:
            return self.capacity(label, k, w)
        d = os.path.join(self.runs_dir, label)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"rep{k}.json")
        rec = os.path.join(d, f"rep{k}.jsonl")
        seed = w.seed + k
        # the command that makes the same measurement by hand, recorded in the summary
        command = ["--state", self.state_path, *w.options.flags(), "--seed", str(seed), "-q", "--records", rec, "-o", path]
        try:
            cfg = build_config(replace(w.options, seed=seed), self.served.url(), command)
            cfg.launch_argv = self.tune.server().launch_argv
            summary = self.bench(cfg, rec, path)
        except VkitError as e:
            raise bench_failed(e) from None
        if summary["vkit"].get("partial"):
            raise KeyboardInterrupt
        doc = plain(summary)
        try:
            c = invariants.check_file(path, records=rec)
            check_brief = {"code": int(c.code), "verdict": c.verdict, "findings": c.findings}
        except VkitError as e:
            check_brief = {"code": int(e.code), "verdict": None, "findings": None}
        return relative(path, self.state_dir), doc, check_brief

    def capacity(self, label: str, k: int, w: Workload) -> tuple[str, dict, dict]:
        """One capacity search of the running configuration (measurement ``k``): its load points
        under runs/<label>/rep<k>-points/, the capacity document at runs/<label>/rep<k>.json."""
        c = self.s.capacity
        assert c is not None
        d = os.path.join(self.runs_dir, label)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"rep{k}.json")
        st = self.tune.tune()
        # the first baseline search's capacity, once it is known; the required capacity (j-per-token) from the first
        reference = st.record("capacity_reference").get("load") or self.s.required_capacity
        # where the answer probably is: this configuration's own last estimate, else the twin's prediction for
        # it, else the kept configuration's capacity once its baseline is final (the search goes there second)
        hint = guess(st, self.served.running().get("config"), self.state_dir)
        # every point's run its own prompts: measurement k starts 1000 seeds above measurement k - 1
        opts = replace(w.options, seed=w.seed + 1000 * k)
        try:
            doc = capmeasure.measure_configuration(opts, self.served.url(), os.path.join(d, f"rep{k}-points"), c.slo, c.plan,
                                             reference, command=["--state", self.state_path], interrupts=self.interrupts,
                                             progress=lambda m: self.progress(f"{label} capacity {k}: {m}"),
                                             accelerators=c.accelerators, seed=w.seed + k, hint=hint,
                                             launch_argv=st.server.launch_argv, bench=self.bench, prices=c.prices)
        except VkitError as e:
            raise bench_failed(e) from None
        atomic_write_text(path, json.dumps(plain(doc), indent=2) + "\n")
        code, _, _ = capacity_checker(path)
        findings = [] if code == 0 else ["no_clear_load_point"]
        verdict = "valid" if code == 0 else "invalid"
        if code == 0 and cut_by_the_client(doc):
            # the capacity is only a lower bound: the machine, not the server, ended the search (measured once more)
            code, verdict, findings = int(ExitCode.REJECTED), "rejected", ["client_saturation"]
        elif code == 0 and ((((doc.get("vkit") or {}).get("capacity") or {}).get("drift")) or {}).get("moved"):
            # the server's level moved between the search's first loads and its last: measured once more
            code, verdict, findings = int(ExitCode.REJECTED), "rejected", ["level_moved"]
        return relative(path, self.state_dir), plain(doc), {"code": code, "verdict": verdict, "findings": findings}


def guess(st, config: dict | None, state_dir: str) -> float | None:
    """Where ``config``'s capacity probably is: its own last capacity measured in this tune (a
    baseline's or a trial's run document), else the twin's prediction it was proposed on, else the
    kept configuration's final baseline capacity; None when nothing is known."""
    docs, predicted = [], None
    b = st.record("baseline")
    if config is not None and b.get("config") == config:
        docs += list(b.get("runs") or [])
    for t in st.trials():
        if config is not None and t.get("config") == config:
            docs += list(t.get("runs") or [])
            predicted = (((t.get("proposal") or {}).get("twin") or {}).get("prediction") or {}).get("capacity") or predicted
    for path in reversed(docs):
        try:
            with open(os.path.join(state_dir, path)) as f:
                c = json.load(f).get("slo_capacity")
        except (OSError, ValueError):
            continue
        if isinstance(c, (int, float)) and c > 0:
            return float(c)
    if predicted:
        return float(predicted)
    return (b.get("metrics") or {}).get("slo_capacity") if b.get("config") == st.kept_config else None
