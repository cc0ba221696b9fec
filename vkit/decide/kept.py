"""The kept configuration's series: every run of it since the last drift alarm, the one series the tune's
sentinel (vkit.tune.sentinel), ``drift --kept`` and the soak recommendation judge."""

from __future__ import annotations

from typing import Callable

from vkit.decide import gate as _gate


def kept_series(st: dict, load: Callable[[str], dict]) -> list[tuple[str, dict]]:
    """Every run of the kept configuration since the last drift alarm, as (path, summary), oldest
    first: its repeats (the baseline's, then each sentinel's), the A runs of confirmations against
    it and the B runs of the confirmation that kept it. Only runs measured the same way as the
    newest one count (step 5's mixed workload is another gauge). tune's sentinel and
    ``drift --kept`` judge this one series."""
    kept = st["kept"]["config"]
    paths = [r.get("path") if isinstance(r, dict) else r for r in (st.get("kept") or {}).get("repeats") or []]
    trials = {t["id"]: t for t in st.get("trials", [])}
    for c in st.get("confirmations", []) + st.get("delivery_confirmations", []):
        if c.get("against") == kept:
            paths += c.get("a_runs") or []
        t = trials.get(c.get("trial_id"))
        if t is not None and t.get("config") == kept:
            paths += c.get("b_runs") or []
    since = _gate.parse_date((st.get("drift") or {}).get("reset"))
    rows = []
    for p in dict.fromkeys(x for x in paths if isinstance(x, str)):
        try:
            doc = load(p)
        except (OSError, ValueError):
            continue
        when = _gate.parse_date(doc.get("date"))
        if since is not None and (when is None or when <= since):
            continue
        rows.append((when, p, doc))
    if all(w is not None for w, _, _ in rows):
        rows.sort(key=lambda r: r[0])
    if not rows:
        return []
    last = _gate.gauge_of(rows[-1][2])
    return [(p, doc) for _, p, doc in rows if _gate.gauge_of(doc) == last]
