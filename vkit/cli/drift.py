"""drift: has one configuration's level changed over its repeated runs?

Sits beside the tuning loop: the kept configuration is re-measured every few trials (a
sentinel); ``drift`` runs CUSUM, Page–Hinkley, ADWIN and Bayesian online change-point
detection over that series, with thresholds calibrated for short streams, and says whether
and when the level changed and by how much. The tune driver re-baselines on drift, and gate
refuses a baseline older than the change point (``--record`` writes it to the state file).
Input: summary files in run order, a JSON Lines stream of summaries (or bare numbers), or the
kept configuration's repeats in the state file (``--kept``). Exit 0 stable, 1 changed,
6 too few runs to tell, 3 invalid input.
"""

from __future__ import annotations

import argparse
import json
import math
import os

from vkit.cli._common import IO, fraction_arg, isatty, make_parser, run
from vkit.decide.drift import DEFAULT_DETECTOR, DETECTORS, detect
from vkit.decide.gate import Run, check_same_gauge, load_summary, parse_date, sigma_from_state
from vkit.errors import ExitCode, InvalidData, UsageError
from vkit.jsonio import BadLine, json_lines

TOOL = "drift"


def build_parser() -> argparse.ArgumentParser:
    p = make_parser(
        TOOL,
        "Detect a change of level in repeated runs of one configuration (CUSUM, Page–Hinkley, ADWIN, BOCPD; "
        "thresholds calibrated to 5% false alarms per stream) and say when and by how much.",
        examples=[
            "drift sentinel_*.json                       # files in run order (sorted by their dates when all have one)",
            "cat repeats.jsonl | drift --metric p95_ttft_ms",
            "drift --kept --record                       # the kept configuration's repeats in the state file",
            "drift runs.jsonl --sigma 2% --detector bocpd  # σ pooled from earlier A/A runs",
            "printf '%s\\n' 101 99 100 98 ... | drift -     # bare numbers, one a line",
        ],
    )
    p.add_argument("inputs", nargs="*", metavar="FILE", help="summary JSON files, or JSON Lines of summaries or numbers; - reads stdin")
    p.add_argument("--kept", action="store_true", help="use the kept configuration's repeats listed in the state file (kept.repeats)")
    p.add_argument("--metric", default="output_throughput", help="metric to watch (default output_throughput)")
    p.add_argument("--sigma", type=fraction_arg(), default=None, metavar="REL",
                   help="relative σ pooled from earlier A/A runs (default: the state file's sigma_baseline with --kept, else estimated)")
    p.add_argument("--detector", choices=DETECTORS, default=DEFAULT_DETECTOR, help=f"detector that decides (default {DEFAULT_DETECTOR}); all are reported")
    p.add_argument("--no-sort", action="store_true", help="keep the order given even when every run has a date")
    p.add_argument("--record", action="store_true", help="with --kept: write the result (drift.change_date) into the state file for gate")
    p.add_argument("--human", action="store_true", help="write the table to stdout instead of JSON")
    return p


def _read_items(paths: list[str], io: IO) -> list[tuple[str, object]]:
    """(source label, summary dict or number) in the order given."""
    items: list[tuple[str, object]] = []
    for path in paths:
        if path == "-":
            text, name = io.stdin.read(), "<stdin>"
        else:
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except FileNotFoundError:
                raise UsageError(f"no such file: {path}") from None
            except OSError as e:
                raise UsageError(f"cannot read {path}: {e.strerror}") from None
            name = path
        stripped = text.strip()
        if not stripped:
            continue
        try:
            items.append((name, json.loads(stripped)))
            continue
        except json.JSONDecodeError:
            pass
        try:
            items += [(f"{name}:{n}", v) for n, v in json_lines(text)]
        except BadLine as e:
            raise UsageError(f"{name} line {e.line} is not JSON ({e.msg}); give summary files or JSON Lines") from None
    return items


def _series(items: list[tuple[str, object]], metric: str, sort: bool) -> tuple[list[float], list[str], list, list[str]]:
    runs, labels, values, dates, warns = [], [], [], [], []
    for label, obj in items:
        if isinstance(obj, bool):
            raise InvalidData(f"{label}: not a number or a summary")
        if isinstance(obj, (int, float)):
            values.append(float(obj))
            labels.append(label)
            dates.append(None)
            continue
        if not isinstance(obj, dict):
            raise InvalidData(f"{label}: not a number or a summary")
        v = obj.get(metric)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise InvalidData(f"{label} has no numeric {metric!r}")
        runs.append(Run(label, obj, "series", when=parse_date(obj.get("date"))))
        values.append(float(v))
        labels.append(label)
        dates.append(parse_date(obj.get("date")))
    if runs and len(runs) != len(items):
        raise InvalidData("mixed input: some items are summaries and some bare numbers; give one kind")
    if len(runs) >= 2:
        _g, warns = check_same_gauge(runs)
    for lab, v in zip(labels, values, strict=True):
        if not (math.isfinite(v) and v > 0):
            raise InvalidData(f"{lab}: {metric} = {v}; drift needs positive values")
    if sort and dates and all(d is not None for d in dates):
        order = sorted(range(len(values)), key=lambda i: dates[i])
        if order != list(range(len(values))):
            warns.append("runs sorted by their dates")
        values = [values[i] for i in order]
        labels = [labels[i] for i in order]
        dates = [dates[i] for i in order]
    return values, labels, dates, warns


def render(res: dict, metric: str) -> str:
    head = "CHANGED" if res.get("changed") else ("STABLE" if res.get("verdict") == "stable" else "UNDECIDED")
    lines = [f"drift: {head} — {metric}: {res.get('why')}"]
    if res.get("detectors"):
        lines.append(f"  {'detector':<13} {'fired':<5} {'alarm':>5} {'change':>6} {'shift':>7} {'max stat':>9} {'threshold':>9}")
        for d, info in res["detectors"].items():
            mark = "*" if d == res.get("detector") else " "
            alarm = info.get("alarm_index")
            cp = info.get("change_index")
            sh = info.get("shift")
            smax = info.get("statistic_max")
            lines.append(
                f" {mark}{d:<13} {'yes' if info['fired'] else 'no':<5} {alarm + 1 if alarm is not None else '-':>5} "
                f"{cp + 1 if cp is not None else '-':>6} {(f'{sh:+.1%}' if sh is not None else '-'):>7} "
                f"{(f'{smax:.2f}' if smax is not None else '-'):>9} {info['threshold']:>9.3f}"
            )
        lines.append(f"  σ {res.get('sigma', float('nan')):.2%} ({res.get('sigma_source')}); runs numbered from 1")
    for w in res.get("warnings") or []:
        lines.append(f"  warning: {w}")
    return "\n".join(lines) + "\n"


def _run(args: argparse.Namespace, io: IO) -> int:
    sigma = args.sigma
    sf = None
    if args.kept:
        if args.inputs:
            raise UsageError("--kept reads the runs from the state file; do not also give files")
        from vkit.decide.kept import kept_series
        from vkit.state import StateFile

        sf = StateFile(args.state)
        st = sf.read()

        def load(p: str) -> dict:
            return load_summary(p if os.path.isabs(p) else os.path.join(sf.dir, p), "series").doc

        # The series tune's sentinel judges: repeats, confirmation runs of the kept configuration, since the last alarm.
        items = kept_series(st, load)
        if not items:
            raise InvalidData("the state file lists no runs of the kept configuration (kept.repeats, confirmations) "
                              "since the last drift alarm; nothing to watch")
        if sigma is None:
            sigma = sigma_from_state(st).get(args.metric)
    else:
        if args.record:
            raise UsageError("--record needs --kept (it writes the result into the state file)")
        inputs = args.inputs or ["-"]
        if "-" in inputs and io.stdin is not None and isatty(io.stdin):
            raise UsageError("no FILE given and stdin is a terminal; pass summary files, a JSON Lines file, or --kept")
        items = _read_items(inputs, io)
    values, labels, dates, warns = _series(items, args.metric, not args.no_sort)
    res = detect(values, sigma=sigma, detector=args.detector)
    res["metric"] = args.metric
    res["inputs"] = labels
    res["warnings"] = warns
    res["tool"] = TOOL
    if res.get("changed"):
        cp = res["change_index"]
        res["change_run"] = labels[cp]
        res["change_date"] = dates[cp].isoformat() if dates and dates[cp] is not None else None
    if sf is not None:
        did = sf.log.append(TOOL, "drift", metric=args.metric, changed=res["changed"], change_index=res.get("change_index"),
                            change_date=res.get("change_date"), shift=res.get("shift"), detector=args.detector, n=res["n"])
        res["decision_id"] = did
        if args.record:
            sf.service.record_drift({"checked_id": did, "metric": args.metric, "changed": res["changed"], "detector": args.detector,
                             "change_index": res.get("change_index"), "change_date": res.get("change_date"), "shift": res.get("shift")})
            io.progress(f"drift result recorded in {sf.path} ({did})")
    human = args.human or (io.is_tty() and not args.json)
    if human:
        io.out.write(render(res, args.metric))
    else:
        io.emit_json(res)
        if io.verbosity >= 1:
            io.err.write(render(res, args.metric))
    if res.get("changed"):
        return ExitCode.REJECTED
    if res.get("verdict") in ("too_short", "no_spread"):
        return ExitCode.UNDECIDED
    return ExitCode.OK


def main(argv: list[str] | None = None, stdin=None, stdout=None, stderr=None) -> int:
    return run(build_parser(), _run, argv, stdout, stderr, stdin)
