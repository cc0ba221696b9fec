"""A trial: APPLY → VERIFY → VALIDATE → GATE (screening), or skipped when it cannot differ."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vkit.apply.policy import to_serve_flags
from vkit.errors import ExitCode
from vkit.state import now_iso
from vkit.tune.compare import MAIN, Versus
from vkit.tune.ledger import FINISHED, RANKED, Status, first
from vkit.tune.summaries import aggregate, brief, gmean, summary_metrics

if TYPE_CHECKING:
    from vkit.tune.context import Tune


class Trials:
    """The trials of a tune: proposed, skipped without a restart, or run and screened."""

    def __init__(self, r: Tune):
        self.r = r

    def cannot_differ(self, config: dict) -> tuple[str, str | None] | None:
        """(why, the trial it is the same as) when measuring ``config`` cannot tell anything new, so it
        is not worth a restart: it was measured in this run already (a trial, or the baseline when it
        is the kept configuration); it differs from a measured configuration only in ``max_num_seqs``
        with both values at or above the most requests the server ever held in that configuration's
        measurements (the peak in flight of its capacity searches, or the client's concurrency: the
        limit never bound, so it cannot bind at the other value either); or vLLM refuses to start
        it (``max_num_batched_tokens`` below ``max_model_len`` with chunked prefill off). None: measure it."""
        st = self.r.ledger.tune()
        tokens, mml = config.get("max_num_batched_tokens"), config.get("max_model_len")
        if (config.get("enable_chunked_prefill") is False and isinstance(tokens, int) and isinstance(mml, int)
                and tokens < mml):
            return (f"vLLM refuses to start it: max_num_batched_tokens {tokens} < max_model_len {mml} with chunked "
                    "prefill off", None)
        measured = [(t["id"], t["config"], t.get("runs") or []) for t in st.trials(status=RANKED)
                    if t.get("valid") is not False and t["step"] not in ("1", "5")]
        b = st.record("baseline")
        if b.get("config") and b.get("metrics") and b.get("workload") == self.r.s.workload.describe():
            measured.insert(0, ("baseline", b["config"], b.get("runs") or []))
        for tid, cfg, _ in measured:
            if cfg == config:
                return f"the same configuration as {tid}, measured in this run", tid
        for tid, cfg, runs in measured:
            if {k for k in set(cfg) | set(config) if cfg.get(k) != config.get(k)} != {"max_num_seqs"}:
                continue
            peak = self._peak_in_flight(runs)
            a, c = cfg.get("max_num_seqs"), config.get("max_num_seqs")
            if peak and isinstance(a, int) and isinstance(c, int) and min(a, c) >= peak:
                return (f"max_num_seqs {c} cannot differ from {a} ({tid}): the server never held more than {peak} "
                        f"requests at any load measured, so neither limit binds", tid)
        return None

    def _peak_in_flight(self, runs: list[str]) -> int | None:
        """The most requests in flight in these runs: a capacity search's peak over its points, or a
        closed-loop run's concurrency (the client never sends more)."""
        peak = 0
        for p in runs:
            try:
                d = self.r.ledger.load(p)
            except (OSError, ValueError):
                return None
            if "slo_capacity" in d:
                peak = max(peak, int(d.get("peak_in_flight") or 0))
            elif isinstance(d.get("max_concurrency"), int):
                peak = max(peak, d["max_concurrency"])
            else:
                return None  # open loop without a recorded peak: the limit may have bound
        return peak or None

    def skip(self, step: str, config: dict, reason: str, why: str, same_as: str | None, audit: dict | None = None) -> dict:
        """A proposed configuration recorded without a restart: it carries the measurement of the trial it
        is the same as (so the search sees it as measured), status ``skipped`` and the reason."""
        t = self.new(step, config, reason, audit)
        st = self.r.ledger.tune()
        src = first(st.trials(), id=same_as)
        if same_as == "baseline":
            metrics, valid = dict(st.record("baseline").get("metrics") or {}), True
        elif src is not None:
            metrics, valid = dict(src.get("metrics") or {}), src.get("valid")
        else:
            metrics, valid = {}, False  # refused by vLLM: infeasible, as a start failure would be
        self.r.log("skip", trial=t["id"], config=config, why=why, same_as=same_as)
        self.r.progress(f"{t['id']} step {step}: skipped, no restart: {why}")
        return self.r.sf.tune.update_trial(t["id"], status=Status.SKIPPED, valid=valid, metrics=metrics, verdict=None, why=why,
                                 same_as=same_as, finished=now_iso())

    # -- a trial ----------------------------------------------------------------
    def new(self, step: str, config: dict, reason: str, audit: dict | None = None) -> dict:
        t = self.r.sf.tune.add_trial(step, config, reason, audit or {})
        self.r.log("propose", trial=t["id"], step=step, config=config, reason=reason, audit=audit or {})
        return t

    def run(self, tid: str, versus: Versus = MAIN, repeats: int | None = None) -> dict:
        """APPLY → VERIFY → VALIDATE → GATE (screening) on ``versus`` (its workload, against its baseline, on
        its metrics), resuming from the recorded phase. ``repeats``: the runs the caller needs (step 1's
        stability, an ablation's verdict); else ``screen_size``."""
        baseline_key, workload = versus.key, versus.workload
        t = self.r.ledger.trial(tid)
        if t["status"] in FINISHED:
            return t
        b = self.r.ledger.record(baseline_key)  # {} before BASELINE (step 1): measured, not gated
        if t["status"] == Status.PROPOSED:
            self.r.progress(f"{tid} step {t['step']}: apply {' '.join(to_serve_flags(t['changes'])) or '(kept)'}")
            ok, res = self.r.seat.apply(t["config"], fresh=True)
            if not ok:
                diag = res.get("diagnosis") or {}
                return self.r.sf.tune.update_trial(tid, status=Status.START_FAILED, valid=False, verdict="reject", finished=now_iso(),
                                         why=f"start failed: {diag.get('quote') or res.get('message')}", diagnosis=diag)
            t = self.r.sf.tune.update_trial(tid, status=Status.APPLIED, startup=res.get("startup") or {})
        else:
            ok, res = self.r.seat.apply(t["config"])  # resumed: make sure it is what runs
            if not ok:
                diag = res.get("diagnosis") or {}
                return self.r.sf.tune.update_trial(tid, status=Status.START_FAILED, valid=False, verdict="reject", finished=now_iso(),
                                         why=f"start failed: {diag.get('quote') or res.get('message')}", diagnosis=diag)
        base_docs = [self.r.ledger.load(p) for p in b["runs"]] if b else []
        pm = versus.primary_of(self.r.s).split(":")[0]
        pm = pm if pm in ("output_throughput", "slo_capacity", "slo_capacity_per_kw") else "output_throughput"  # elimination: higher is better
        base_tp = gmean([d.get(pm) for d in base_docs]) or 0.0
        sig_tp = ((b or {}).get("sigma") or {}).get(pm, 0.02)
        if repeats is None:
            repeats = t.get("repeats_planned")
            if repeats is None:
                repeats, why_n = self.r.budget.screen_size(baseline_key) if b else (self.r.s.screen_repeats, "no baseline yet")
                t = self.r.sf.tune.update_trial(tid, repeats_planned=repeats, repeats_why=why_n)
        while len(t["runs"]) < repeats:
            k = len(t["runs"]) + 1
            path, doc, check = self.r.measurer.measure(tid, k, workload)
            t["runs"].append(path)
            t["checks"].append(check)
            t = self.r.sf.tune.update_trial(tid, runs=t["runs"], checks=t["checks"])
            self.r.progress(f"{tid} run {k}: {brief(doc)}"
                          + ("" if check["code"] == 0 else f"  [{check['verdict']}: {', '.join(check.get('findings') or [])}]"))
            if check["code"] == ExitCode.INVALID:
                return self.r.sf.tune.update_trial(tid, status=Status.INVALID, valid=False, verdict=None, finished=now_iso(),
                                         metrics=summary_metrics(doc),
                                         why=f"invalid measurement ({', '.join(check.get('findings') or [])}): no verdict")
            cut = max(4 * sig_tp, self.r.s.eliminate_below)
            what = {"slo_capacity": "capacity", "slo_capacity_per_kw": "capacity per kW"}.get(pm, "throughput")
            # only a run check_invariants passed shows a clearly worse candidate (a busy client's run does not)
            if k == 1 and check["code"] == 0 and base_tp and (doc.get(pm) or 0.0) < base_tp * (1 - cut):
                self.r.progress(f"{tid} eliminated: {doc[pm] / base_tp - 1:+.1%} {what} vs the baseline")
                return self.r.sf.tune.update_trial(tid, status=Status.ELIMINATED, valid=True, verdict="reject", finished=now_iso(),
                                         metrics=summary_metrics(doc),
                                         why=f"eliminated after 1 run: {(doc.get(pm) or 0.0) / base_tp - 1:+.1%} {what} vs the "
                                             f"baseline, beyond -{cut:.0%}; no full repeats for a clearly worse candidate")
        docs = [self.r.ledger.load(p) for p in t["runs"]]
        valid = all(c["code"] == 0 for c in t["checks"])
        if not b:
            return self.r.sf.tune.update_trial(tid, status=Status.DONE, valid=valid, metrics=aggregate(docs), verdict=None,
                                     why=t.get("why") or "measured; no baseline yet to gate against", finished=now_iso())
        g = self.r.compare.gate(b["runs"], t["runs"], versus=versus)
        verdict = g.get("decision")
        why = g.get("why") or ""
        self.r.progress(f"{tid} screened: {verdict} — {why}")
        return self.r.sf.tune.update_trial(tid, status=Status.DONE, valid=valid, metrics=aggregate(docs), verdict=verdict, why=why,
                                 gate={k: g.get(k) for k in ("decision", "why", "primary", "more_runs", "warnings", "exit_code")},
                                 finished=now_iso())
