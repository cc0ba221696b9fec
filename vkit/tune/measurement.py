"""One measurement of the running configuration: a bench_stream run, or a capacity search."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from vkit import environment
from vkit.apply.lifecycle import Lifecycle
from vkit.errors import Abnormal, ExitCode, VkitError
from vkit.measure.gauge import build_config
from vkit.state import atomic_write_text
from vkit.tune import capacity as _cap
from vkit.tune.config import Workload
from vkit.tune.summaries import bench_failed, capacity_checker, cut_by_the_client, plain, relative
from vkit.validate import invariants

if TYPE_CHECKING:
    from vkit.tune.runner import Runner


class Measurer:
    """The runs of a tune: one bench_stream run (or one capacity search) of the running configuration, validated,
    measured again when the client was busy or the server died, its server start recorded."""

    def __init__(self, r: Runner):
        self.r = r

    # Anomalies that say the *client or machine* was busy, not that the server misbehaved: worth one re-measure.
    TRANSIENT = {"client_saturation", "warmup_outliers", "client_server_ttft_gap"}

    # With a saturated client these follow from it (latencies inflated, the loop not kept full), so
    # they do not stop the re-measure either; without client_saturation they are the server's.
    SATURATION_EFFECTS = {"littles_law", "phase_order"}

    @classmethod
    def transient(cls, findings: set) -> bool:
        """True when a run's findings are all explained by a busy client or machine."""
        if not findings:
            return False
        allowed = cls.TRANSIENT | (cls.SATURATION_EFFECTS if "client_saturation" in findings else set())
        return findings <= allowed

    def start_key(self) -> str | None:
        """The server process running now, as ``pid:ticks`` (None when none is recorded)."""
        run = self.r.served.running()
        return f"{run['pid']}:{run.get('ticks')}" if run.get("pid") else None

    def measure(self, label: str, k: int, workload: Workload | None = None) -> tuple[str, dict, dict]:
        """One bench_stream run (seed + k), validated, its server process recorded (``run_starts``).
        A run whose only findings say the load generator was saturated is measured once more
        (logged). Returns (relative path, summary, check)."""
        t0 = self.r.backend.now()
        path, doc, check = self.checked(label, k, workload)
        self.r.sf.tune.record_run_start(path, self.start_key(), seconds=self.r.backend.now() - t0)
        self.note_environment(path, doc)
        return path, doc, check

    def note_environment(self, path: str, doc: dict) -> None:
        """The run's environment fingerprint becomes the state's last seen one; a change is said
        (and logged by the state): gate refuses to compare runs across it."""
        fp = (doc.get("vkit") or {}).get("fingerprint")
        if isinstance(fp, dict):
            found = self.r.sf.service.note_fingerprint(self.r.tool_name, fp, run=path)
            if found:
                self.r.warn(environment.warning(found, path))

    # Pauses before measuring again a run the client fell behind on: a machine busy for a moment
    # (another process, a burst of I/O) is usually quiet again a few seconds later.
    BUSY_WAITS_S = (2.0, 6.0)

    def checked(self, label: str, k: int, workload: Workload | None = None) -> tuple[str, dict, dict]:
        last = 1 + len(self.BUSY_WAITS_S)
        for attempt in range(1, last + 1):
            try:
                path, doc, check = self.once(label, k, workload)
                died = bool(doc.get("failed")) and not self.r.healthy(self.r.served.url())
            except VkitError as e:
                if e.code != ExitCode.UNAVAILABLE or self.r.healthy(self.r.served.url()):
                    raise
                # the server was gone before the run began (killed between two runs): the same path as a death mid-run
                doc, died = {"failed": 1, "vkit": {"errors": {" ".join(str(e).split())[:200]: 1}}}, True
            if died:
                path, doc, check = self._server_died(label, k, workload, doc)
            if doc.get("failed") and check["code"] != ExitCode.INVALID:
                # requests failed on a server that stayed up (a burst of 5xx, a malformed event): the run is not a
                # measurement of the configuration, and no verdict may rest on it; measured once more, else invalid
                check = dict(check, code=int(ExitCode.INVALID), verdict="invalid",
                             findings=sorted({*(check.get("findings") or []), "failed_requests"}))
                if attempt == 1:
                    self.r.progress(f"{label} run {k}: {doc['failed']} request(s) failed on a healthy server; measuring again")
                    self.r.log("remeasure", run=path, findings=check["findings"], failed=doc["failed"])
                    continue
            findings = set(check.get("findings") or [])
            if check["code"] != ExitCode.REJECTED or not self.transient(findings) or attempt == last:
                return path, doc, check
            wait = self.BUSY_WAITS_S[attempt - 1]
            self.r.progress(f"{label} run {k}: {', '.join(sorted(findings))} (the client or the machine was busy); "
                          f"measuring again in {wait:g} s")
            self.r.log("remeasure", run=path, findings=sorted(findings), wait_s=wait)
            time.sleep(wait)
        return path, doc, check

    def _server_died(self, label: str, k: int, workload: Workload | None, doc: dict) -> tuple[str, dict, dict]:
        """The server died during a measurement: that run is not a measurement of the configuration.
        Restart the same configuration and measure again; if it dies again, a candidate's trial is
        invalid, and the kept configuration's death marks the environment ABNORMAL."""
        st = self.r.served.server()
        cfg = dict(st.running.get("config") or st.kept["config"])
        errs = "; ".join(f"{n}x {m}" for m, n in sorted((doc.get("vkit") or {}).get("errors", {}).items(), key=lambda kv: -kv[1])[:2])
        self.r.progress(f"{label} run {k}: the server died during the measurement ({errs}); restarting it and measuring again")
        self.r.log("server_died", label=label, run=k, config=cfg, errors=(doc.get("vkit") or {}).get("errors"))
        ok, res = self.r.apply(cfg, fresh=True)
        if ok:
            path, doc2, check = self.once(label, k, workload)
            if not (doc2.get("failed") and not self.r.healthy(st.url)):
                return path, doc2, check
        if cfg == st.kept["config"]:
            reason = (f"the server of the kept configuration died during measurements twice ({errs}); "
                      "read the server log in the logs/ folder beside the state file")
            Lifecycle(self.r.svc, self.r.tool_name, self.r.owner, progress=self.r.progress, policy=self.r.policy,
                      backend=self.r.backend).mark_abnormal(reason)
            raise Abnormal(reason)
        path = relative(os.path.join(self.r.runs_dir, label, f"rep{k}.json"), self.r.sf.dir)
        return path, doc, {"code": ExitCode.INVALID, "verdict": "invalid", "findings": ["server_died"]}

    def once(self, label: str, k: int, workload: Workload | None = None) -> tuple[str, dict, dict]:
        if self.r.remote():
            path, doc, check = self.r.fleet.call(self.r, "measure", label, k, workload)
            return path, doc, check
        w = workload or self.r.s.workload
        if w.kind == "capacity" and self.r.s.capacity is not None:
            return self._capacity(label, k, w)
        d = os.path.join(self.r.runs_dir, label)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"rep{k}.json")
        rec = os.path.join(d, f"rep{k}.jsonl")
        seed = w.seed + k
        # the command that makes the same measurement by hand, recorded in the summary
        command = ["--state", self.r.sf.path, *w.options.flags(), "--seed", str(seed), "-q", "--records", rec, "-o", path]
        try:
            cfg = build_config(replace(w.options, seed=seed), self.r.served.url(), command)
            cfg.launch_argv = self.r.ledger.server().launch_argv
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
        return relative(path, self.r.sf.dir), doc, check_brief

    def bench(self, cfg, records: str, output: str) -> dict:
        """One bench_stream run on this runner's backend (its files written, its summary returned)."""
        return self.r.backend.bench(cfg, records, output, self.r.interrupts)

    def _capacity(self, label: str, k: int, w: Workload) -> tuple[str, dict, dict]:
        """One capacity search of the running configuration (measurement ``k``): its load points
        under runs/<label>/rep<k>-points/, the capacity document at runs/<label>/rep<k>.json."""
        c = self.r.s.capacity
        assert c is not None
        d = os.path.join(self.r.runs_dir, label)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"rep{k}.json")
        st = self.r.ledger.tune()
        reference = st.record("capacity_reference").get("load")
        # where the answer probably is: the kept configuration's capacity, once its baseline is final
        b = st.record("baseline")
        hint = (b.get("metrics") or {}).get("slo_capacity") if b.get("config") == st.kept_config else None
        # every point's run its own prompts: measurement k starts 1000 seeds above measurement k - 1
        opts = replace(w.options, seed=w.seed + 1000 * k)
        command = ["--state", self.r.sf.path]
        try:
            doc = _cap.measure_configuration(opts, self.r.served.url(), os.path.join(d, f"rep{k}-points"), c.slo, c.plan,
                                             reference, command=command, interrupts=self.r.interrupts,
                                             progress=lambda m: self.r.progress(f"{label} capacity {k}: {m}"),
                                             accelerators=c.accelerators, seed=w.seed + k, hint=hint,
                                             launch_argv=st.server.launch_argv, bench=self.bench)
        except VkitError as e:
            raise bench_failed(e) from None
        atomic_write_text(path, json.dumps(plain(doc), indent=2) + "\n")
        code, _, _ = capacity_checker(path)
        findings = [] if code == 0 else ["no_clear_load_point"]
        verdict = "valid" if code == 0 else "invalid"
        if code == 0 and cut_by_the_client(doc):
            # the capacity is only a lower bound: the machine, not the server, ended the search (measured once more)
            code, verdict, findings = int(ExitCode.REJECTED), "rejected", ["client_saturation"]
        return relative(path, self.r.sf.dir), plain(doc), {"code": code, "verdict": verdict, "findings": findings}
