"""Energy checks on the ``energy`` block of a vkit summary (board power sampled beside the run, and the
driver's energy counter where it has one): the counter did not run backwards, board power under load is
not below the board's own idle, and the power samples cover enough of the run.

A failure here means the run's energy figures (J per token, J per request, mean W) cannot be trusted; it
says nothing about its latency figures. So these checks fail with severity ``info``: ``evaluate`` lists
them under ``energy_findings`` and leaves the verdict of the run to the other checks."""

from __future__ import annotations

from vkit.validate.invariants.common import FAIL, INFO, NA, PASS, Thresholds, _f, _res

IDLE_FLOOR = 0.9  # mean board power under load below this fraction of the idle power = a wrong reading
MIN_COVERAGE = 0.8  # power samples must span at least this fraction of the run
MIN_SAMPLES = 3  # and number at least this many


def _energy(rep: dict) -> dict | None:
    e = rep.get("energy")
    return e if isinstance(e, dict) else None


def check_energy_counter_monotone(rep: dict, th: Thresholds, ctx: dict) -> dict:
    """The driver's energy counter over the run. Why: it only counts up while the driver stays loaded;
    a negative delta means a reset, a wrap or a reload in the run, so the energy it gives is wrong."""
    cid, title = "energy_counter_monotone", "energy counter did not go backwards"
    e = _energy(rep)
    cj = (e or {}).get("counter_j")
    if cj is None:
        why = (e or {}).get("why") if e and not e.get("available") else None
        return _res(cid, title, NA, INFO, "the report carries no energy counter reading"
                    + (f" ({why})." if why else " (a vkit summary from a driver with total_energy_consumption does)."))
    ev = dict(counter_j=cj, sampled_j=e.get("sampled_j"), duration_s=e.get("duration_s"))
    if cj < 0:
        return _res(cid, title, FAIL, INFO,
                    f"the energy counter went backwards: {_f(cj)} J over the run (the driver reset, wrapped or reloaded "
                    "the counter, or other devices were read at the end): energy figures from it are wrong; use the "
                    "sampled energy or measure again.", **ev)
    return _res(cid, title, PASS, INFO, f"the energy counter rose by {_f(cj)} J over the run.", **ev)


def check_power_above_idle(rep: dict, th: Thresholds, ctx: dict) -> dict:
    """Mean board power under load vs the board's idle power measured at the server's start. Why: a
    loaded board draws more than an idle one; less means the wrong device was read, the units are
    wrong, or the samples are stale."""
    cid, title = "power_above_idle", "board power under load above idle"
    e = _energy(rep) or {}
    mean, idle = e.get("mean_w"), e.get("idle_w")
    if mean is None or idle is None:
        return _res(cid, title, NA, INFO, "needs both the mean board power over the run and the idle power at the "
                    "server's start (a vkit summary with sampled power).", mean_w=mean, idle_w=idle)
    ev = dict(mean_w=mean, idle_w=idle, floor=IDLE_FLOOR)
    if mean < IDLE_FLOOR * idle:
        return _res(cid, title, FAIL, INFO,
                    f"mean board power under load {_f(mean)} W is below {IDLE_FLOOR:.0%} of the board's idle "
                    f"{_f(idle)} W: the wrong device, wrong units or stale samples; the energy figures are wrong.", **ev)
    return _res(cid, title, PASS, INFO, f"mean board power {_f(mean)} W under load, idle {_f(idle)} W.", **ev)


def check_power_coverage(rep: dict, th: Thresholds, ctx: dict) -> dict:
    """How much of the run the power samples span, and how many there are. Why: energy integrated over
    a small part of the run, or from one or two samples, is not the run's energy."""
    cid, title = "power_coverage", "power samples cover the run"
    e = _energy(rep)
    if not e or not e.get("available"):
        why = (e or {}).get("why")
        return _res(cid, title, NA, INFO, "no energy figures in the report" + (f" ({why})." if why else "."))
    cov, covered, dur = e.get("coverage"), e.get("covered_s"), e.get("duration_s")
    if cov is None and covered is not None and dur:
        cov = covered / dur
    n, iv = e.get("samples"), e.get("interval_s")
    if cov is None and n is None:
        return _res(cid, title, NA, INFO, "the energy block gives neither its coverage of the run nor its sample count.")
    ev = dict(coverage=cov, covered_s=covered, duration_s=dur, samples=n, interval_s=iv,
              min_coverage=MIN_COVERAGE, min_samples=MIN_SAMPLES)
    bad = []
    if cov is not None and cov < MIN_COVERAGE:
        bad.append(f"the power samples span {cov:.0%} of the run (< {MIN_COVERAGE:.0%})")
    if n is not None and n < MIN_SAMPLES:
        bad.append(f"there are {n} power samples (< {MIN_SAMPLES})")
    if bad:
        return _res(cid, title, FAIL, INFO,
                    f"{' and '.join(bad)}: a {_f(dur)} s run sampled every {_f(iv)} s; the energy figures rest on too "
                    "little of the run. A longer run or a shorter sampling interval fixes it.", **ev)
    return _res(cid, title, PASS, INFO, f"{n} power samples span {cov:.0%} of the {_f(dur)} s run."
                if n is not None and cov is not None else "the power samples cover the run.", **ev)
