"""Confirmation: fresh interleaved B A A B runs of a candidate against the kept configuration, then keep."""

from __future__ import annotations

from vkit.apply.policy import to_serve_flags
from vkit.decide.power import Effect
from vkit.errors import ExitCode
from vkit.state import now_iso
from vkit.tune.compare import MAIN, Versus
from vkit.tune.config import Workload
from vkit.tune.context import Tune, for_slot
from vkit.tune.ledger import first
from vkit.tune.summaries import brief


class Confirmer:
    """Confirmations of a step's winner (kept on accept) and of delivered configurations (nothing kept)."""

    def __init__(self, r: Tune):
        self.r = r

    def confirm_and_keep(self, tid: str, selected_from: int, versus: Versus = MAIN, effect: Effect | None = None) -> dict:
        """Fresh interleaved runs of trial ``tid``'s configuration against the kept one (B A A B blocks),
        gated with --fresh --selected-from K; an accept is kept (a gate decision, logged). ``effect``: the
        winner's screened effect, corrected for the winner's curse, that the blocks are planned for."""
        t = self.r.ledger.trial(tid)
        conf = self.confirm(tid, "confirmations", selected_from, versus, effect)
        if conf.get("decision") == "kept":
            return conf
        if conf.get("decision") != "accept":
            self.r.progress(f"REVERT: {tid} not kept ({conf.get('decision')}): {conf.get('why')}")
            return conf
        if self.kept_before_saved(conf, t, "confirmations"):
            did = self.r.ledger.tune().kept["decision_id"]  # the keep was made before an interruption: not made twice
        else:
            if not conf.get("keep_id"):
                # the keep's id first: a stop between its log line and the state finds it again on the rerun
                conf["keep_id"] = self.r.sf.log.new_id()
                self.save(conf)
            ok, _ = self.r.seat.apply(t["config"])
            if not ok:
                conf["decision"] = "start_failed"
                self.save(conf)
                return conf
            did = self.r.seat.keep(reason=f"gate accepted {tid} on fresh interleaved runs: {conf.get('why')}", decision="gate",
                            decision_id=conf["keep_id"])
        conf["decision"] = "kept"
        conf["decision_id"] = did
        self.save(conf)
        self.r.sf.tune.update_trial(tid, kept=True, decision_id=did)
        self.r.progress(f"KEEP {tid}: {' '.join(to_serve_flags(t['changes']))} ({did})")
        if versus.on_main_workload(self.r.s):
            self.r.baselines.rebase(tid, conf)
        return conf

    def kept_before_saved(self, conf: dict, trial: dict, list_key: str) -> bool:
        """A confirmation whose keep was made (the kept configuration is the trial's, by a gate decision): not yet
        recorded on it ("accept": vkit was stopped between the two writes), or recorded ("kept": stopped before
        what follows a keep). Its ``against`` is the configuration kept before, so it is not confirmed again."""
        k = self.r.ledger.tune().kept
        return (list_key == "confirmations" and conf.get("decision") in ("accept", "kept") and k.get("decision") == "gate"
                and k["config"] == trial["config"] and conf.get("against") != trial["config"])

    def confirm_point(self, tid: str, selected_from: int, claim: Versus) -> dict:
        """A delivered (Pareto) configuration re-confirmed on its own claim — ``claim``'s primary, the objective
        it screened better on, with its guards — against the kept one, on fresh interleaved runs; nothing is kept.
        Decision: accept (confirmed), reject (the claim was noise) or undecided. The server is left
        on the candidate (the last arm of B A A B): the caller restores the kept configuration once,
        after its last confirmation, rather than restarting it between two candidates."""
        return self.confirm(tid, "delivery_confirmations", selected_from, claim)

    def confirm(self, tid: str, list_key: str, selected_from: int, versus: Versus = MAIN, effect: Effect | None = None) -> dict:
        """B A A B blocks of trial ``tid`` (B) against the kept configuration (A), gated after each
        block until a decision or the planned blocks (``confirm_plan``, at most ``confirm_blocks``
        unless granted); one the budget cannot decide is refused before any run (``underpowered``).
        Resumable from the record in ``list_key``."""
        workload, primary = versus.workload, versus.primary
        t = self.r.ledger.trial(tid)
        st = self.r.ledger.tune()
        kept_cfg = dict(st.kept_config)
        conf = first(st.confirmations(list_key), trial_id=tid)
        if conf is not None and conf.get("against", kept_cfg) != kept_cfg:
            if self.kept_before_saved(conf, t, list_key):
                return conf  # accepted and kept, interrupted before the record said so: confirm_and_keep finishes it
            conf = None  # confirmed against an earlier kept configuration: that verdict no longer applies
        if conf is None:
            conf = self._new_conf(tid, selected_from, primary, kept_cfg)
            conf["plan"] = self.r.budget.confirm_plan(versus, effect)
            if not conf["plan"]["fits"]:
                conf.update(decision="underpowered", why=conf["plan"]["why"], finished=now_iso())
                self.r.progress(f"confirm {tid}: not measured: {conf['why']}")
                self.r.log("underpowered", trial_id=tid, plan=conf["plan"])
            else:
                self.r.progress(f"confirm {tid}: {conf['plan']['why']}")
            self.save(conf, list_key)
        if conf.get("decision") in ("accept", "reject", "kept", "start_failed", "invalid", "underpowered") or \
                (conf.get("decision") == "undecided" and conf.get("finished")):
            return conf
        blocks = (conf.get("plan") or {}).get("blocks") or self.r.s.confirm_blocks
        label = f"confirm-{tid}" if list_key == "confirmations" else f"deliver-{tid}"
        decision = None
        g: dict = {}
        block = len(conf["sequence"]) // 4
        while block < blocks:
            live = self.r.ledger.slots()
            if len(live) > 1 and len(conf["sequence"]) % 4 == 0:
                # q blocks at once, block k on slot k mod q: each block's pairs within one device, the verdict over all
                group = list(range(block, min(blocks, block + len(live))))
                bad = self._blocks_on_slots(conf, group, live, (t["config"], kept_cfg), label, workload, list_key)
            else:
                group = [block]
                bad = self._block_here(conf, block, (t["config"], kept_cfg), label, workload, list_key)
            if bad:
                conf["decision"], conf["why"] = bad
                self.save(conf, list_key)
                return conf
            block += len(group)
            g = self.r.compare.gate(conf["a_runs"], conf["b_runs"], fresh=True, selected_from=selected_from, versus=versus)
            decision = g.get("decision")
            self.r.progress(f"confirm {tid} after {len(conf['b_runs'])} pairs: {decision} — {g.get('why')}")
            if decision in ("accept", "reject", "invalid"):
                break
        conf["decision"] = decision
        conf["gate"] = {k: g.get(k) for k in ("decision", "why", "primary", "guards", "more_runs", "warnings", "design", "exit_code")}
        conf["why"] = g.get("why")
        conf["finished"] = now_iso()
        self.save(conf, list_key)
        return conf

    BLOCK = ("B", "A", "A", "B")

    def _block_here(self, conf: dict, block: int, cfgs: tuple[dict, dict], label: str, workload: Workload | None,
                    list_key: str) -> tuple[str, str] | None:
        """One B A A B block on this tune's server, each run recorded as it ends (resumable mid-block);
        (decision, why) when a start failed or a run was invalid."""
        for j, arm in enumerate(self.BLOCK):
            if block * 4 + j < len(conf["sequence"]):
                continue  # measured before an interruption
            prev = conf["sequence"][-1] if conf["sequence"] else None
            ok, res = self.r.seat.apply(cfgs[0] if arm == "B" else cfgs[1], fresh=prev != arm)
            if not ok:
                return "start_failed", f"the {'candidate' if arm == 'B' else 'kept configuration'} did not start: {res.get('message')}"
            k = len(conf["b_runs" if arm == "B" else "a_runs"]) + 1
            path, doc, check = self.r.measurer.measure(f"{label}-{arm}", k, workload)
            if check["code"] == ExitCode.INVALID:
                return "invalid", f"invalid confirmation run {path}"
            conf["b_runs" if arm == "B" else "a_runs"].append(path)
            conf["sequence"].append(arm)
            self.save(conf, list_key)
            self.r.progress(f"{label} {arm}{k}: {brief(doc)}")
        return None

    def run_block(self, block: int, cfgs: tuple[dict, dict], label: str, workload: Workload | None, fresh: bool) -> dict:
        """Block ``block`` of B A A B on this tune's slot (a thread's body): its runs, or what stopped it."""
        runs, prev = [], (None if fresh else "B")  # the slot's last block ended on B: it goes on from that server
        for j, arm in enumerate(self.BLOCK):
            ok, res = self.r.seat.apply(cfgs[0] if arm == "B" else cfgs[1], fresh=prev != arm)
            if not ok:
                return {"bad": ("start_failed", f"the {'candidate' if arm == 'B' else 'kept configuration'} did not start on "
                                                f"slot {self.r.slot}: {res.get('message')}")}
            k = 2 * block + (1 if j < 2 else 2)
            path, doc, check = self.r.measurer.measure(f"{label}-{arm}", k, workload)
            if check["code"] == ExitCode.INVALID:
                return {"bad": ("invalid", f"invalid confirmation run {path}")}
            runs.append((arm, path, doc))
            prev = arm
        return {"runs": runs}

    def _blocks_on_slots(self, conf: dict, group: list[int], live: list[dict], cfgs: tuple[dict, dict], label: str,
                         workload: Workload | None, list_key: str) -> tuple[str, str] | None:
        """Blocks ``group`` side by side, block k on slot k mod q; recorded in block order once all ended, so the
        record (and the gate after it) never depends on which slot finished first."""
        from concurrent.futures import ThreadPoolExecutor

        q = len(live)
        with self.r.interrupts.every_section(), ThreadPoolExecutor(max_workers=len(group)) as ex:
            futs = [ex.submit(for_slot(self.r, live[b % q]).confirmer.run_block, b, cfgs, label, workload, b < q) for b in group]
            outs = [f.result() for f in futs]
        for b, out in zip(group, outs, strict=True):
            if out.get("bad"):
                return out["bad"]
            for arm, path, doc in out["runs"]:
                conf["b_runs" if arm == "B" else "a_runs"].append(path)
                conf["sequence"].append(arm)
                self.r.progress(f"{label} {arm} block {b + 1} on slot {live[b % q]['name']}: {brief(doc)}")
            self.save(conf, list_key)
        return None

    def save(self, conf: dict, list_key: str = "confirmations") -> None:
        self.r.sf.tune.save_confirmation(conf, list_key)

    def _new_conf(self, tid: str, selected_from: int, primary: str | None, against: dict) -> dict:
        t = self.r.ledger.trial(tid)
        return {"trial_id": tid, "step": t["step"], "config": t["config"], "selected_from": selected_from,
                "primary": primary, "against": dict(against), "a_runs": [], "b_runs": [], "decision": None,
                "started": now_iso(), "sequence": []}

    def drop_point(self, tid: str, selected_from: int, primary: str, why: str) -> dict:
        """A delivered configuration dropped without measuring (it claims nothing over the kept one),
        recorded as a rejected delivery confirmation."""
        conf = self._new_conf(tid, selected_from, primary, self.r.ledger.kept_config())
        conf.update(decision="reject", why=why, finished=now_iso())
        self.save(conf, "delivery_confirmations")
        return conf
