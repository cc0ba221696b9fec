"""One measurement of the running configuration: a bench_stream run, or a capacity search."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from vkit import environment
from vkit.apply.lifecycle import Lifecycle
from vkit.errors import Abnormal, ExitCode, VkitError
from vkit.tune.config import Workload
from vkit.tune.onerun import OneRun
from vkit.tune.summaries import relative

if TYPE_CHECKING:
    from vkit.tune.context import Tune


class Measurer:
    """The runs of a tune: one bench_stream run (or one capacity search) of the running configuration, validated,
    measured again when the client was busy or the server died, its server start recorded."""

    def __init__(self, r: Tune):
        self.r = r

    # Anomalies that say the *client or machine* was busy, not that the server misbehaved: worth one re-measure
    # (level_moved: a capacity search's anchor load read another level at its end than at its start).
    TRANSIENT = {"client_saturation", "warmup_outliers", "client_server_ttft_gap", "level_moved"}

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
                died = bool(doc.get("failed")) and not self.r.seat.healthy(self.r.served.url())
            except VkitError as e:
                if e.code != ExitCode.UNAVAILABLE or self.r.seat.healthy(self.r.served.url()):
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
            why = "the level moved during the search" if findings == {"level_moved"} else "the client or the machine was busy"
            self.r.progress(f"{label} run {k}: {', '.join(sorted(findings))} ({why}); measuring again in {wait:g} s")
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
        ok, res = self.r.seat.apply(cfg, fresh=True)
        if ok:
            path, doc2, check = self.once(label, k, workload)
            if not (doc2.get("failed") and not self.r.seat.healthy(st.url)):
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
        """One run (or capacity search) of the running configuration: on the slot's Ray worker when it is
        served there, else here (``vkit.tune.onerun``)."""
        if self.r.seat.remote():
            path, doc, check = self.r.fleet.call(self.r, "measure", label, k, workload)
            return path, doc, check
        return self.one_run().once(label, k, workload)

    def one_run(self) -> OneRun:
        r = self.r
        return OneRun(r.s, r.ledger, r.served, r.runs_dir, r.backend, r.interrupts, r.progress)

    def bench(self, cfg, records: str, output: str) -> dict:
        """One bench_stream run on this tune's backend (its files written, its summary returned)."""
        return self.one_run().bench(cfg, records, output)
