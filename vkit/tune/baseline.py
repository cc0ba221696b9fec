"""The kept configuration's baseline: measured over several server starts, rebased after a keep."""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING

from vkit.decide.components import MIN_SPREAD_SEARCHES, capacity_sigma, sigma_parts
from vkit.errors import ExitCode, Rejected, UsageError, VkitError
from vkit.measure.loadorder import disturbed
from vkit.state import now_iso
from vkit.tune.compare import MAIN, Versus
from vkit.tune.config import start_sizes
from vkit.tune.summaries import KEY_METRICS, aggregate, brief, capacity_unit

if TYPE_CHECKING:
    from vkit.tune.context import Tune


class Baselines:
    """The baselines of a tune (``baseline`` and any other key): measured, finished (means, σ and its components), rebased."""

    def __init__(self, r: Tune):
        self.r = r

    def measure(self, force: bool = False, versus: Versus = MAIN, config: dict | None = None,
                again_of: int | None = None) -> dict:
        """Measure the kept configuration (or ``config``) N times with ``versus``'s workload, as its baseline record
        (resumable); σ_baseline into the state. A baseline whose capacity searches a disturbed machine measured is
        measured once more (:meth:`_once_more`; ``again_of``: the generation this one measures again)."""
        w, key = versus.workload or self.r.s.workload, versus.key
        st = self.r.ledger.tune()
        b = st.record(key)
        kept = dict(config) if config is not None else st.kept_config
        if b and not force and b.get("config") == kept and b.get("workload") == w.describe() and len(b.get("runs", [])) >= self.r.s.baseline_repeats:
            return self._once_more(key, b, versus, config)
        if force or not b or b.get("config") != kept or b.get("workload") != w.describe():
            gen = (b or {}).get("generation", 0) + 1
            b = {"config": kept, "workload": w.describe(), "runs": [], "checks": [], "generation": gen, "started": now_iso(),
                 **({"remeasure_of": again_of} if again_of is not None else {})}
            self.r.sf.tune.set_baseline(key, b)
        if config is None:
            self.r.seat.restore_kept(fresh=not b["runs"] and not self._only_step1_on_it())
        else:
            ok, res = self.r.seat.apply(kept, fresh=not b["runs"])
            if not ok:
                raise VkitError(f"the configuration to measure as {key} does not start: {res.get('message')}", ExitCode.UNAVAILABLE)
        label = f"{key}-g{b['generation']}"
        sizes = start_sizes(self.r.s.baseline_repeats, self.r.s.starts())
        ends = list(itertools.accumulate(sizes))
        while len(b["runs"]) < self.r.s.baseline_repeats:
            k = len(b["runs"]) + 1
            j = next(i for i, e in enumerate(ends) if len(b["runs"]) < e)  # the start this run belongs to
            if j > 0 and len(self.starts_of(b["runs"])) < j + 1:
                # on a new server start: σ's between-restart part is measured, not assumed zero
                span = f"runs {k}-{ends[j]}" if sizes[j] > 1 else f"run {k}"
                self.r.progress(f"{key}: {span} on server start {j + 1} of {len(sizes)} "
                              "(σ within one process and between restarts)")
                ok, res = self.r.seat.apply(kept, fresh=True)
                if not ok:
                    raise VkitError(f"the configuration to measure as {key} does not start again: {res.get('message')}",
                                    ExitCode.UNAVAILABLE)
            path, doc, check = self.r.measurer.measure(label, k, w)
            if check["code"] == ExitCode.INVALID:
                raise Rejected(f"the baseline measurement {path} is invalid ({', '.join(check.get('findings') or [])}): fix the gauge first")
            b["runs"].append(path)
            b["checks"].append(check)
            self.r.progress(f"{key} {k}/{self.r.s.baseline_repeats}: {brief(doc)}"
                          + ("" if check["code"] == 0 else f"  [{check['verdict']}: {', '.join(check.get('findings') or [])}]"))
            self.r.sf.tune.set_baseline(key, b)
            if "slo_capacity" in doc and not self.r.ledger.record("capacity_reference"):
                self._set_reference(doc, path)
        return self._once_more(key, self.finish(key, b), versus, config)

    def _once_more(self, key: str, b: dict, versus: Versus, config: dict | None) -> dict:
        """``b`` again, once, when its capacity searches read disturbed loads (``finish``'s ``disturbed``): a new
        generation on fresh starts, and a capacity reference taken from ``b``'s runs taken again from the new one's;
        the second is kept whatever it reads (its warning stands). A re-measure is never measured again."""
        if not b.get("disturbed") or "remeasure_of" in b or b.get("rebased_from"):  # a rebase's runs are a trial's
            return b
        self.r.warn(f"{key}: measuring it once more on fresh server starts: {len(b['disturbed'])} load point(s) of its "
                    f"capacity searches read slower than a heavier load of the same configuration ({b['disturbed'][0]})")
        self.r.log("baseline_remeasure", key=key, generation=b["generation"], runs=b["runs"], disturbed=b["disturbed"],
                   metrics={k: v for k, v in (b.get("metrics") or {}).items() if k == "slo_capacity"})
        ref = self.r.ledger.record("capacity_reference")
        if ref.get("from") in b["runs"]:
            self.r.sf.tune.set_capacity_reference({})
        return self.measure(force=True, versus=versus, config=config, again_of=int(b["generation"]))

    def starts_of(self, runs: list[str]) -> list[str]:
        """The distinct server processes that measured ``runs`` (as recorded), in order."""
        known = self.r.ledger.tune().run_starts
        return list(dict.fromkeys(known[p] for p in runs if known.get(p)))

    def _only_step1_on_it(self) -> bool:
        """The process running now is the kept configuration's and measured nothing but step 1's
        closed-loop runs (dataset seeds seed + 1, seed + 2), whose prompts no capacity search sends
        (seeds from seed + 1000 up): a capacity baseline can start on it without a restart. Step 1's
        choice is a business rule, not a selection on performance, so no winner's curse rides on its
        process either."""
        st = self.r.ledger.tune()
        key, run = self.r.measurer.start_key(), self.r.served.running()
        if self.r.s.capacity is None or key is None or run.get("config") != st.kept_config:
            return False
        step1 = {p for t in st.trials(step="1") for p in t.get("runs") or []}
        on_it = [p for p, s in st.run_starts.items() if s == key]
        return bool(on_it) and set(on_it) <= step1

    def finish(self, key: str, b: dict) -> dict:
        """The baseline's means and σ (per metric, relative) from its runs, recorded as final. With
        runs on two or more server starts, σ has two parts (``components``): within one process
        and between restarts; ``sigma`` is then the sd of one run on a new process (both parts)."""
        docs = [self.r.ledger.load(p) for p in b["runs"]]
        need_energy(self.r.s.energy_metrics(), docs)
        known = self.r.ledger.tune().run_starts
        starts = [known.get(p) for p in b["runs"]]
        sig, comps = {}, {}
        for m in KEY_METRICS:
            rows = [(s, math.log(d[m])) for s, d in zip(starts, docs, strict=True) if isinstance(d.get(m), (int, float)) and d.get(m) > 0]
            if len(rows) < 2:
                continue
            comp = sigma_parts([v for _, v in rows], [s for s, _ in rows])
            comps[m] = comp
            sig[m] = comp["total"]
        if "slo_capacity" in sig or any("slo_capacity_sd" in d for d in docs):
            sig["slo_capacity"] = capacity_sigma(sig.get("slo_capacity"), docs)
            if "slo_capacity" in comps:
                # the searches' own sd: a floor on σ only where too few searches measured their spread
                comps["slo_capacity"]["search_sd"] = capacity_sigma(None, docs)
                if len(docs) < MIN_SPREAD_SEARCHES:
                    comps["slo_capacity"]["resolution"] = comps["slo_capacity"]["search_sd"]
        b["metrics"] = aggregate(docs)
        b["sigma"] = sig
        b["components"] = comps
        found = disturbed_loads(docs)
        b.pop("disturbed", None)
        if found:
            b["disturbed"] = found
            if "remeasure_of" in b or b.get("rebased_from"):  # not measured once more (_once_more): kept, with a warning
                self.r.warn(f"{key}: warning: {len(found)} load point(s) of its capacity searches read slower than a "
                            f"heavier load of the same configuration ({found[0]}): the machine was disturbed while they "
                            "ran, and the capacity may read low" + ("; measured once more and still disturbed: tune with "
                                                                    "nothing else on the machine" if "remeasure_of" in b else ""))
        self.r.sf.tune.set_baseline(key, b, final=True)
        self.r.log("baseline", key=key, config=b["config"], runs=b["runs"], sigma=sig, metrics=b["metrics"],
                 **({"rebased_from": b["rebased_from"]} if b.get("rebased_from") else {}),
                 **({"disturbed": found} if found else {}))
        return b

    def rebase(self, tid: str, conf: dict) -> dict | None:
        """After a keep: the newly kept configuration's own measurements
        (its screening runs and the confirmation's B runs, each on a fresh server start) become the
        baseline the next candidates are screened against, with no extra run; None when they are
        fewer than the baseline repeats (the next ``baseline()`` then measures it)."""
        t = self.r.ledger.trial(tid)
        st = self.r.ledger.tune()
        runs = list(dict.fromkeys([*(t.get("runs") or []), *(conf.get("b_runs") or [])]))
        if len(runs) < self.r.s.baseline_repeats or t["config"] != st.kept_config:
            return None
        old = st.record("baseline")
        b = {"config": dict(t["config"]), "workload": self.r.s.workload.describe(), "runs": runs,
             "checks": [{"code": 0, "verdict": "valid", "findings": []} for _ in runs],
             "generation": old.get("generation", 0) + 1, "started": now_iso(), "rebased_from": tid}
        self.r.sf.tune.set_baseline("baseline", b)
        b = self.finish("baseline", b)
        pm = self.r.s.primary.split(":")[0]
        self.r.progress(f"baseline rebased on the kept {tid}: {len(runs)} measurements of it (screening and confirmation) "
                      f"on {len(self.starts_of(runs))} server starts, {pm} {b['metrics'].get(pm, 0):.4g} "
                      f"(σ {b['sigma'].get(pm, 0):.1%})")
        return b

    def _set_reference(self, doc: dict, path: str) -> None:
        """The load every later capacity search starts from and measures interactivity at: the first
        baseline search's capacity (its highest clear hold; the estimate when nothing clearly held); with
        --objective j-per-token, the required capacity (the load whose J per output token is minimised)."""
        req = self.r.s.required_capacity
        load = req if req is not None else doc.get("capacity_holds") or doc.get("slo_capacity")
        self.r.sf.tune.set_capacity_reference({"load": load, "from": "--required-capacity" if req is not None else path,
                                               "set": now_iso()})
        unit = capacity_unit(doc)
        what = "per-user tok/s and J per output token" if req is not None else "per-user tok/s"
        self.r.progress(f"capacity reference load: {load:g} {unit} (every later search starts there and measures "
                      f"{what} there)")


def need_energy(metrics: tuple[str, ...], docs: list[dict]) -> None:
    """An energy objective (capacity-per-kw, --energy-axis) cannot decide on runs without board power: refuse
    after the baseline, with the first run's reason, rather than compare figures that are not there."""
    for m in metrics:
        for d in docs:
            if not isinstance(d.get(m), (int, float)):
                v = d.get("vkit") or {}
                why = ((v.get("capacity") or {}).get("energy") or v.get("energy") or {}).get("why") or "no board power in the run"
                raise UsageError(f"the objective needs {m}, and the baseline's runs have none: {why}. Run where "
                                 "nvidia-smi, npu-smi or rocm-smi reads the boards' power, or tune without the energy objective")


def disturbed_loads(docs: list[dict]) -> list[str]:
    """The loads of the capacity searches in ``docs`` (runs of one configuration) that a disturbed machine measured,
    one line each: a mean TPOT well above that of a heavier load in any of them
    (:func:`vkit.measure.loadorder.disturbed`)."""
    rows = []
    for d in docs:
        for c in (((d.get("vkit") or {}).get("capacity") or {}).get("curve")) or []:
            tpot = (c.get("metrics") or {}).get("mean_tpot_ms")
            if isinstance(c.get("load"), (int, float)) and isinstance(tpot, (int, float)) and tpot > 0:
                rows.append((float(c["load"]), float(tpot)))
    return [f"mean TPOT {rows[i][1]:.3g} ms at load {rows[i][0]:.4g}, {rows[i][1] / rows[j][1]:.1f}x the "
            f"{rows[j][1]:.3g} ms at {rows[j][0]:.4g}" for i, j in sorted(disturbed(rows).items())]
