#!/usr/bin/env bash
# make soak: the soak run before delivery (runbook/soak.md). WINDOWS consecutive bench_stream
# windows of WINDOW_S seconds against the service at its kept configuration; each window is
# validated with check_invariants (with the kept configuration as --expect-config) and its summary
# appended as one line to soak.jsonl the moment it is validated; then drift over the windows.
# Exit: drift's verdict, 0 stable, 1 drifted (6: no verdict, e.g. no spread at all); 2 usage; 3 a window
# was invalid (the soak stops there); 4 the service is unavailable, ABNORMAL, leased by a tuning
# run, or not on its kept configuration; 130 interrupted (the windows measured so far stay in
# soak.jsonl; the interrupted window is kept aside as wNN.partial.json, never in soak.jsonl).
#
# Variables: PY (python with vkit's dependencies), VKIT_STATE (the service's state file; make passes
# STATE), URL (default: the state's; a URL other than the state's is soaked as it is, with no check
# of its configuration), WINDOWS (default 12, drift's minimum), WINDOW_S (default 150: 30 min in all),
# METRIC (drift's metric, default output_throughput), SIGMA (σ for drift, e.g. 2%; default estimated),
# SOAK_DIR (default soak/soak-<UTC time> beside the state file), KEEP_RECORDS (default 1; 0 deletes each
# window's per-request records once it is validated). Arguments: extra bench_stream flags,
# after the tune's workload (the last of a repeated flag wins), e.g. --max-concurrency 32.
set -euo pipefail
PY=${PY:-python3}
B=bin
STATE=${VKIT_STATE:-vkit-state/vkit.json}
URL=${URL:-}
WINDOWS=${WINDOWS:-12}
WINDOW_S=${WINDOW_S:-150}
METRIC=${METRIC:-output_throughput}
SIGMA=${SIGMA:-}
KEEP_RECORDS=${KEEP_RECORDS:-1}
DIR=${SOAK_DIR:-$(dirname "$STATE")/soak/soak-$(date -u +%Y%m%dT%H%M%S)}
JSONL=$DIR/soak.jsonl
INTERRUPTED=0

say() { printf 'soak: %s\n' "$*" >&2; }
die() { local rc=$1; shift; say "$*"; exit "$rc"; }
trap 'INTERRUPTED=1' INT TERM

[[ $WINDOWS =~ ^[0-9]+$ ]] && [ "$WINDOWS" -ge 12 ] \
    || die 2 "WINDOWS=$WINDOWS: give at least 12 windows (drift gives no verdict on fewer than 12 runs)"
[[ $WINDOW_S =~ ^[0-9]+([.][0-9]+)?$ ]] && [ "${WINDOW_S//[.0]/}" != "" ] || die 2 "WINDOW_S=$WINDOW_S: give a window length in seconds, > 0"
[ ! -s "$JSONL" ] || die 2 "$JSONL already holds windows: give another SOAK_DIR (a soak is judged over windows of one run)"
mkdir -p "$DIR/windows" || die 2 "cannot create $DIR"

# --- the plan: URL, workload and kept configuration, from the state file ---------------------------
plan_rc=0
"$PY" - "$STATE" "$URL" "$WINDOW_S" "$DIR" <<'PYEOF' || plan_rc=$?
import json, math, os, sys
state, url, window_s, d = sys.argv[1], sys.argv[2].rstrip("/"), float(sys.argv[3]), sys.argv[4]
def out(msg, rc):
    print(f"soak: {msg}", file=sys.stderr); sys.exit(rc)
# the tune's default workload (bin/tune --help), for a service tuned without a recorded one
args = ["--dataset-name", "random", "--random-input-len", "512", "--random-output-len", "128", "--num-prompts", "200",
        "--max-concurrency", "64", "--vocab-size", "1000"]
seed, expect, notes, st = 1, None, [], None
if os.path.exists(state):
    from vkit.errors import VkitError
    from vkit.state import StateFile, lease_staleness
    try:
        sf = StateFile(state)
        st = sf.read()
    except VkitError as e:
        out(str(e), int(e.code))
if st is None and not url:
    out(f"no state file {state} and no URL: give STATE=... (the tuned service) or URL=...", 4)
if st is not None and (not url or url == st["service"]["url"].rstrip("/")):
    from vkit.apply.launcher import alive
    from vkit.apply.policy import to_serve_flags
    url = st["service"]["url"].rstrip("/")
    ab, lease = st.get("abnormal") or {}, st.get("lease")
    if ab.get("flag"):
        out(f"the environment is ABNORMAL since {ab.get('since')}: {ab.get('reason')}; fix the cause first", 4)
    if lease and lease_staleness(lease) is None:
        out(f"{lease.get('owner')} holds the lease (until {lease.get('expires')}): a tuning run restarts the server; "
            "soak after it has finished", 4)
    kept, run = st["kept"]["config"], st["service"].get("running") or {}
    if run.get("config") != kept or (run.get("pid") and not alive(run.get("pid"), run.get("ticks"))):
        out(f"the server is not recorded as running the kept configuration ({' '.join(to_serve_flags(kept)) or 'launch defaults'}); "
            f"start it with `bin/rollback --reason soak` (then post_start_verify runs), and soak again", 4)
    expect = os.path.join(d, "kept_config.json")
    with open(expect, "w") as f:
        json.dump(kept, f, sort_keys=True)
    w = (st.get("tune") or {}).get("workload") or {}
    if w.get("bench_args"):
        args, seed = list(w["bench_args"]), int(w.get("seed", 1))
        notes.append("workload: the tune's (state tune.workload)")
    else:
        args += ["--model", st["service"]["model"]]
        notes.append("workload: the tune's defaults (the state records no tuning run)")
    # enough prompts that a window does not cycle its request set (a repeated prompt hits the prefix cache):
    # the kept configuration's last measured request rate x the window x 1.25
    reps = (st.get("kept") or {}).get("repeats") or []
    try:
        p = reps[-1] if isinstance(reps[-1], str) else reps[-1]["path"]
        rps = json.load(open(p if os.path.isabs(p) else os.path.join(sf.dir, p)))["request_throughput"]
        i = args.index("--num-prompts") + 1
        need = math.ceil(1.25 * rps * window_s)
        if need > int(args[i]):
            args[i] = str(need)
            notes.append(f"--num-prompts {need} (1.25 x {rps:.1f} req/s measured on the kept configuration x {window_s:g} s)")
    except (IndexError, KeyError, ValueError, OSError, TypeError):
        notes.append("no measured request rate of the kept configuration: a window that sends more than --num-prompts "
                     "requests repeats prompts (prefix-cache hits); give a larger --num-prompts if it says so")
else:
    notes.append("not the state's service: soaked as it is, its configuration unchecked "
                 "(the tune's default workload)")
json.dump({"url": url, "bench_args": args, "seed": seed, "expect_config": expect, "notes": notes},
          open(os.path.join(d, "plan.json"), "w"), indent=2)
with open(os.path.join(d, "bench_args"), "w") as f:
    f.write("".join(a + "\n" for a in args))
print(f"soak: {url}; " + "; ".join(notes), file=sys.stderr)
PYEOF
[ "$INTERRUPTED" = 0 ] || exit 130
[ "$plan_rc" = 0 ] || exit "$plan_rc"
mapfile -t ARGS < "$DIR/bench_args"
read -r URL SEED EXPECT < <("$PY" -c 'import json, sys; p = json.load(open(sys.argv[1])); print(p["url"], p["seed"], p["expect_config"] or "-")' "$DIR/plan.json")
CHECK_FLAGS=()
[ "$EXPECT" = - ] || CHECK_FLAGS=(--expect-config "$EXPECT")

append() {  # append K SUMMARY CHECK: the summary as one line of soak.jsonl (one write), the check to checks.jsonl
    ( trap '' INT TERM; "$PY" - "$@" "$JSONL" "$DIR/checks.jsonl" <<'PYEOF'
import json, os, sys
k, summary, check, jsonl, checks = sys.argv[1:6]
doc = json.load(open(summary))
try:
    c = json.load(open(check))
except ValueError:
    c = {}
for path, rec in ((jsonl, doc), (checks, {"window": int(k), "summary": summary, "verdict": c.get("verdict"),
                                          "findings": c.get("findings") or []})):
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(rec, sort_keys=True, separators=(",", ":")) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
f = c.get("findings") or []
n_set = ((doc.get("vkit") or {}).get("dataset") or {}).get("num_prompts") or 0
print(f"{doc['output_throughput']:.0f} out tok/s, P95 TTFT {doc['p95_ttft_ms']:.1f} ms, {doc['completed']} requests"
      f" ({doc['failed']} failed); {c.get('verdict')}" + (f" ({', '.join(f)})" if f else "")
      + (f"; the request set of {n_set} prompts was cycled" if doc["num_prompts"] > n_set else ""))
PYEOF
    )
}

# --- the windows ---------------------------------------------------------------------------------
say "$WINDOWS windows of ${WINDOW_S} s (bench_stream ${ARGS[*]}${*:+ $*}); windows in $JSONL"
n=0
for k in $(seq 1 "$WINDOWS"); do
    [ "$INTERRUPTED" = 0 ] || break
    w=$(printf '%s/windows/w%02d' "$DIR" "$k")
    say "window $k/$WINDOWS: measuring ${WINDOW_S} s"
    rc=0
    "$PY" $B/bench_stream --url "$URL" "${ARGS[@]}" "$@" --seed $((SEED + k)) --duration "$WINDOW_S" -q \
        --records "$w.records.jsonl" -o "$w.json" > /dev/null || rc=$?
    if [ "$rc" = 130 ]; then  # interrupted mid-window: a partial window is not a window
        [ -f "$w.json" ] && mv "$w.json" "$w.partial.json"
        INTERRUPTED=1
        break
    fi
    [ "$rc" = 0 ] || die "$rc" "window $k: bench_stream failed (exit $rc); $n windows kept in $JSONL"
    crc=0
    ( trap '' INT; exec "$PY" $B/check_invariants "$w.json" --records "$w.records.jsonl" "${CHECK_FLAGS[@]}" -q ) \
        > "$w.check.json" || crc=$?
    case $crc in
        0|1) line=$(append "$k" "$w.json" "$w.check.json") || die 5 "window $k: could not append it to $JSONL"
             n=$((n + 1)); say "window $k/$WINDOWS: $line"
             [ "$KEEP_RECORDS" = 1 ] || rm -f "$w.records.jsonl" ;;
        3)   mv "$w.json" "$w.invalid.json"
             die 3 "window $k is invalid: $("$PY" -c 'import json, sys; print(", ".join(json.load(open(sys.argv[1]))["findings"]))' "$w.check.json"); \
see $w.check.json (kept aside as $w.invalid.json); $n windows kept in $JSONL" ;;
        *)   die "$crc" "window $k: check_invariants failed (exit $crc); $n windows kept in $JSONL" ;;
    esac
done
if [ "$INTERRUPTED" = 1 ]; then
    [ "$n" -ge 12 ] || die 130 "interrupted: $n windows kept in $JSONL (drift needs 12 for a verdict)"
    say "interrupted: $n windows kept in $JSONL; drift over them (the exit stays 130)"
fi

# --- drift over the windows ----------------------------------------------------------------------
# drift reads the summaries and refuses windows measured another way (a timed window's gauge is its
# duration, not the number of requests it happened to send).
drc=0
SIGMA_FLAGS=()
[ -z "$SIGMA" ] || SIGMA_FLAGS=(--sigma "$SIGMA")
"$PY" $B/drift "$JSONL" --metric "$METRIC" --no-sort "${SIGMA_FLAGS[@]}" > "$DIR/drift.json" || drc=$?
[ "$drc" -le 1 ] || [ "$drc" = 6 ] || { cat "$DIR/drift.json" >&2; exit "$drc"; }
"$PY" -c 'import json, sys
for x in open(sys.argv[1]):
    if x.strip():
        print(repr(float(json.loads(x)[sys.argv[2]])))' "$JSONL" "$METRIC" > "$DIR/series.txt"
"$PY" - "$DIR" "$METRIC" "$drc" "$WINDOW_S" <<'PYEOF' >&2 || true
import json, sys
d, metric, rc, w = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
v = [float(x) for x in open(f"{d}/series.txt")]
checks = [json.loads(x) for x in open(f"{d}/checks.jsonl")]
bad = [f"{c['window']} ({', '.join(c['findings'])})" for c in checks if c["verdict"] != "valid"]
try:
    r = json.load(open(f"{d}/drift.json"))
except ValueError:
    r = {}
head = {0: "STABLE", 1: "DRIFTED", 6: "UNDECIDED"}.get(rc, f"drift exit {rc}")
print(f"soak: {head} over {len(v)} windows of {w} s: {metric} first {v[0]:.1f}, last {v[-1]:.1f}, "
      f"min {min(v):.1f}, max {max(v):.1f}; drift: {r.get('why')}")
if r.get("changed"):
    print(f"soak: level changed at window {r['change_index'] + 1} (alarm at window {r['alarm_index'] + 1}): "
          f"{r['shift']:+.1%}, {r['level_before']:.1f} -> {r['level_after']:.1f}")
print("soak: windows with anomalies: " + ("; ".join(bad) if bad else "none"))
# how often to re-measure the baseline, from the drift rate the windows measured (runbook/soak.md, The soak's length)
from vkit.decide.drift import drift_rate, format_hours, soak_plan
from vkit.decide.runs import parse_date
from vkit.decide.specs import Settings
when = [parse_date(json.loads(x).get("date")) for x in open(f"{d}/soak.jsonl") if x.strip()]
rate = None
if r.get("sigma") and all(when):
    rate = drift_rate([(t - when[0]).total_seconds() / 3600 for t in when], v)
if rate is None or not rate["interval"][1] - rate["interval"][0] + abs(rate["per_h"]) > 0:
    print("soak: no drift rate: the windows carry no dates, or show no spread and no slope")
else:
    floor = Settings().floor
    thr = min(max(2 * r["sigma"], floor), 0.99)
    p = soak_plan(rate, thr, float(w))
    lo, hi = rate["interval"]
    print(f"soak: drift rate {rate['per_h']:+.2%}/h ({rate['level']:.0%} interval {lo:+.2%} to {hi:+.2%}/h) over {rate['runs']} "
          f"windows in {rate['span_h']:.2f} h; at the fastest, {p['fastest_per_h']:.2%}/h, the level moves by the gate's threshold "
          f"{thr:.1%} (max(2σ, {floor:.0%}), σ {r['sigma']:.2%}) in ln(1 + {thr:.3f}) / {p['fastest_per_h']:.4f} = {p['hours']:.4g} h: "
          f"re-measure the baseline at least every {format_hours(p['hours'])}")
print(f"soak: {d}/soak.jsonl (summaries), checks.jsonl, drift.json, windows/")
PYEOF
cat "$DIR/drift.json"
[ "$INTERRUPTED" = 0 ] || exit 130
exit "$drc"
