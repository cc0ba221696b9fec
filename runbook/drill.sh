#!/usr/bin/env bash
# make drill: the fault drill (issue 10). A tune on the simulator with faults injected through its
# flags, then a table: per fault what vkit did (exit code, diagnosis, decision-log events) and the
# checks — vkit reacted as documented; the server is left on the last kept configuration (or ABNORMAL
# is declared with its reason); no finished trial record was lost or duplicated.
#   1 start failure        a candidate carrying sim_fail_at_start (restart_with_rollback --set)
#   2 crash mid-benchmark  a service launched with --sim-crash-after: the kept server dies in the baseline;
#                          vkit notices, does not record the run, restarts and measures again
#   3 stalled stream       a candidate carrying sim_stall_stream_after; bench_stream --stall-timeout
#   4 health hang          a candidate carrying sim_hang_health, short --ready-timeout
#   5 kill -9 mid-trial    the tune killed with SIGKILL while a trial is mid-benchmark, then the same command again
#   6 lease held           a second tune started while the first holds the lease
# State under $DIR (default vkit-state/drill/), the table also as JSON in $DIR/drill.json.
# Exit 0 only if every check passes. See runbook/drill.md.
set -u
PY=${PY:-python3}
DIR=${DRILL_DIR:-vkit-state/drill}
SPEED=${SIM_SPEED:-8}
B=bin
T0=$(date +%s)
unset VKIT_LEASE_OWNER VKIT_STATE VKIT_POLICY
MAIN=$DIR/main/vkit.json     # the tuned service: faults 1, 3, 4, 5, 6
CRASH=$DIR/crash/vkit.json   # a service whose engine dies after 150 requests: fault 2
SNAP=$DIR/snap
OUT=$DIR/out
ROWS=$DIR/rows.jsonl
T1=""

say() { printf 'drill: %s\n' "$*" >&2; }

stop_servers() {  # every server the drill's services recorded as running; never by name
    "$PY" - "$MAIN" "$CRASH" <<'PYEOF' >/dev/null 2>&1
import os, sys
from vkit.apply import launcher
from vkit.state import StateFile
for p in sys.argv[1:]:
    try:
        if os.path.exists(p):
            launcher.stop(StateFile(p).read()["service"].get("running"), grace_s=5)
    except Exception:
        pass
PYEOF
}
cleanup() {
    if [ -n "$T1" ] && kill -0 "$T1" 2>/dev/null; then kill -9 "$T1" 2>/dev/null; wait "$T1" 2>/dev/null; fi
    stop_servers
}
trap cleanup EXIT
trap 'exit 130' INT TERM

stop_servers  # a previous drill's servers, if it was killed
rm -rf "$DIR" && mkdir -p "$DIR/main" "$DIR/crash" "$SNAP" "$OUT" || exit 2
: > "$ROWS"

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
SIM=("$PY" $B/sim_server sim-8b --sim-speed "$SPEED" --sim-startup-s 0.2 --sim-seed 5 --max-model-len 4096)
# The tune: one fast, fixed command (rerun unchanged after kill -9).
TUNE=(--sandbox --objective throughput --concurrency 16 --input-len 256 --output-len 64 --num-prompts 100 --baseline-repeats 3 --screen-repeats 1
      --ready-timeout 30 --slo p95_ttft_ms=5000 --steps 3 --budget 2 --guard p95_ttft_ms:-:50%)
# (the guard: at 16 streams that the server holds, P95 TTFT is mostly timing jitter and a 15 % guard cannot be
# decided within the confirmation budget, so a step would be refused up front and its faults never reached)

# A site policy: the shipped table plus the simulator's fault flags as tunables (step 9, never proposed by the
# search), so a candidate carries a fault through the same --set path as a real parameter.
"$PY" -c '
import json, sys
from vkit.apply.policy import Policy
d = json.loads(json.dumps(Policy.load().data))
for i, (p, t) in enumerate([("sim_fail_at_start", "bool"), ("sim_hang_health", "bool"), ("sim_crash_after", "int"),
                            ("sim_stall_stream_after", "int")]):
    d["situational"].append(dict({"id": f"D{i + 1}", "param": p, "type": t, "step": 9, "why": "fault drill"},
                                 **({"candidates": [True]} if t == "bool" else {"min": 0, "max": 10**6, "candidates": [0]})))
open(sys.argv[1], "w").write(json.dumps(d))' "$DIR/policy.json" || exit 2
export VKIT_POLICY=$DIR/policy.json

# --- helpers over the state JSON -------------------------------------------------------------------
snap() {  # snap NAME STATE: the state as `state show --json` gives it, and the decision log's length
    "$PY" $B/state --state "$2" show --json > "$SNAP/$1.json" 2>/dev/null || echo '{}' > "$SNAP/$1.json"
    local log; log="$(dirname "$2")/decisions.jsonl"
    if [ -f "$log" ]; then wc -l < "$log" | tr -d ' ' > "$SNAP/$1.loglen"; else echo 0 > "$SNAP/$1.loglen"; fi
}
events() {  # events STATE FROM_SNAP: the decision-log events appended since that snapshot, in order
    "$PY" -c '
import json, sys
lines = open(sys.argv[1], encoding="utf-8").read().splitlines()[int(open(sys.argv[2]).read()):]
ev = [json.loads(x)["event"] for x in lines if x.strip()]
out = [e for i, e in enumerate(ev) if i == 0 or e != ev[i - 1]]
print(", ".join(out) if len(out) <= 12 else ", ".join(out[:5] + ["..."] + out[-6:]))' "$(dirname "$1")/decisions.jsonl" "$SNAP/$2.loglen" 2>/dev/null
}
wait_for() {  # wait_for STATE PID TIMEOUT EXPR: poll the state file until EXPR (over s, the state) holds; 1 if PID ends first
    "$PY" -c '
import json, os, sys, time
path, pid, end, expr = sys.argv[1], int(sys.argv[2]), time.time() + float(sys.argv[3]), sys.argv[4]
FIN, OPEN = ("done", "eliminated", "start_failed", "invalid"), ("proposed", "applied")
while time.time() < end:
    try:
        s = json.load(open(path))
        if eval("(" + expr + ")", {"s": s, "FIN": FIN, "OPEN": OPEN, "pid": pid}):
            sys.exit(0)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit(1)
    time.sleep(0.05)
sys.exit(1)' "$@"
}
verify_rc() {  # post_start_verify on what the state says runs
    "$PY" $B/post_start_verify --state "$1" -q --timeout 10 >/dev/null 2>&1; echo $?
}
check_server() {  # check_server SNAP VERIFY_RC: on the kept configuration and serving, or ABNORMAL with its reason
    "$PY" - "$SNAP/$1.json" "$2" <<'PYEOF'
import json, sys
from vkit.apply.launcher import alive
from vkit.apply.policy import to_serve_flags
s, vrc = json.load(open(sys.argv[1])), int(sys.argv[2])
run, kept, ab = s["service"].get("running") or {}, s["kept"]["config"], s.get("abnormal") or {}
live = alive(run.get("pid"), run.get("ticks"))
flags = " ".join(to_serve_flags(kept)) or "(launch defaults)"
if run.get("config") == kept and live and vrc == 0:
    r = {"pass": True, "detail": f"pid {run['pid']} runs the kept configuration ({flags}); post_start_verify exit 0"}
else:
    what = (f"pid {run.get('pid')} is recorded as running " + ("the kept" if run.get("config") == kept else "another")
            + " configuration but " + ("is alive" if live else "is dead") + f", post_start_verify exit {vrc}") if run else "nothing is recorded as running"
    r = {"pass": False, "detail": what + "; ABNORMAL not declared"}
if ab.get("flag") and ab.get("reason"):
    r = {"pass": True, "detail": f"ABNORMAL declared: {ab['reason']}; " + r["detail"].replace("; ABNORMAL not declared", "")}
print(json.dumps(r))
PYEOF
}
check_records() {  # check_records BEFORE AFTER MODE: same = every trial identical; finished = finished ones kept, none twice
    "$PY" - "$SNAP/$1.json" "$SNAP/$2.json" "$3" <<'PYEOF'
import json, sys
b, a, mode = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
FIN = ("done", "eliminated", "start_failed", "invalid")
key = lambda t: {k: t.get(k) for k in ("status", "runs", "verdict", "config")}
bt = [t for t in b.get("trials", []) if mode == "same" or t["status"] in FIN]
at = {t["id"]: t for t in a.get("trials", [])}
ids = [t["id"] for t in a.get("trials", [])]
cfgs = [json.dumps(t["config"], sort_keys=True) for t in a.get("trials", [])]
lost = [t["id"] for t in bt if t["id"] not in at]
changed = [t["id"] for t in bt if t["id"] in at and key(at[t["id"]]) != key(t)]
dup = sorted({i for i in ids if ids.count(i) > 1}) + (["a configuration measured twice"] if len(set(cfgs)) != len(cfgs) else [])
bb, ab = b.get("baseline") or {}, a.get("baseline") or {}
brun, arun = bb.get("runs") or [], ab.get("runs") or []
bad = [f"lost {lost}" if lost else "", f"changed {changed}" if changed else "", f"duplicated {dup}" if dup else "",
       "baseline runs changed" if bb.get("generation") == ab.get("generation") and arun[:len(brun)] != brun else "",
       "a baseline run recorded twice" if len(set(arun)) != len(arun) else ""]
bad = [x for x in bad if x]
if bad:
    print(json.dumps({"pass": False, "detail": "; ".join(bad)}))
    sys.exit()
what = (", ".join(t["id"] for t in bt) + " unchanged (status, runs, verdict)") if bt else "no finished trial before"
d = f"{what}; {len(ids)} trial(s) after, ids unique; baseline runs {len(brun)} -> {len(arun)}, none lost or twice"
flag = [f"{i + 1} ({', '.join(c.get('findings') or [])})" for i, c in enumerate(ab.get("checks") or []) if c.get("code") not in (0, None)]
if flag:
    d += f"; note: baseline run {', '.join(flag)} recorded as a finished repeat despite its findings"
print(json.dumps({"pass": True, "detail": d}))
PYEOF
}
row() {  # row N KEY FAULT INJECTED EXIT DID DIAGNOSIS EVENTS REACTION_OK REACTION_DETAIL SERVER_JSON RECORDS_JSON
    "$PY" -c '
import json, sys
a = sys.argv[1:]
r = {"n": int(a[0]), "key": a[1], "fault": a[2], "injected": a[3], "exit": int(a[4]) if a[4].lstrip("-").isdigit() else a[4],
     "did": a[5], "diagnosis": a[6], "events": [e for e in a[7].split(", ") if e],
     "checks": {"reaction": {"pass": a[8] == "1", "detail": a[9]}, "server": json.loads(a[10]), "records": json.loads(a[11])}}
open(sys.argv[13], "a").write(json.dumps(r) + "\n")' "$@" "$ROWS"
}
errline() {  # the last "tool: error/ABNORMAL" line of a stderr file
    grep -E "^[a-z_]+: (error|ABNORMAL)" "$1" 2>/dev/null | tail -1 | cut -c1-300
}
verify_json() {  # a restart_with_rollback --json result: the diagnosis, kind and why
    "$PY" - "$1" <<'PYEOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    print("(no JSON result)"); sys.exit()
g = d.get("diagnosis") or {}
msg = (g.get("why") or g.get("quote") or d.get("message") or "")[:240]
print(f"diagnosis {g.get('kind')}: {msg}" if g else msg)
PYEOF
}
action_of() {  # a restart_with_rollback --json result: "action (diagnosis kind)"
    "$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(d.get("action"), "(" + str((d.get("diagnosis") or {}).get("kind")) + ")")' \
        "$1" 2>/dev/null || echo "no result"
}

echo "SIMULATED services (vkit sim_server, llama-3.1-8b on one H200, virtual time ${SPEED}x): every figure is simulated." >&2

# --- the tuned service: faults 6 and 5 during its tune -----------------------------------------------
PORT=$(free_port)
"$PY" $B/state --state "$MAIN" init --url "http://127.0.0.1:$PORT" --model sim-8b \
    --set max_num_seqs=4 --set max_num_batched_tokens=2048 -- "${SIM[@]}" --port "$PORT" >/dev/null 2>&1 || { say "state init failed"; exit 2; }
snap tune0 "$MAIN"
say "tune on the simulator: $PY $B/tune ${TUNE[*]}"
VKIT_STATE=$MAIN "$PY" $B/tune "${TUNE[@]}" > "$OUT/tune1.out" 2> "$OUT/tune1.err" &
T1=$!

# fault 6: a second tune while the first holds the lease (during its baseline: the kept configuration runs)
if wait_for "$MAIN" "$T1" 90 '(s.get("lease") or {}).get("pid") == pid and (s["service"].get("running") or {}).get("role") == "kept"
        and (s["service"]["running"].get("config") == s["kept"]["config"]) and len((s.get("baseline") or {}).get("runs", [9, 9])) <= 1'; then
    snap lease_before "$MAIN"
    say "fault 6: a second tune while the first ($T1) holds the lease"
    timeout 60 env VKIT_STATE="$MAIN" "$PY" $B/tune "${TUNE[@]}" > "$OUT/tune2.out" 2> "$OUT/tune2.err"; RC6=$?
    snap lease_after "$MAIN"
    HOLDER=$("$PY" -c 'import json,sys; print((json.load(open(sys.argv[1])).get("lease") or {}).get("owner") or "")' "$SNAP/lease_before.json")
    DIAG6=$(errline "$OUT/tune2.err")
    OK6=0; [ "$RC6" = 4 ] && [ -n "$HOLDER" ] && grep -qF "$HOLDER" "$OUT/tune2.err" && OK6=1
    # the refused run touched nothing: the lease is the first run's, no log entry by the second, the server the same
    # one (or replaced by the first run only)
    SRV6=$("$PY" - "$SNAP/lease_before.json" "$SNAP/lease_after.json" "$DIR/main/decisions.jsonl" "$SNAP/lease_before.loglen" <<'PYEOF'
import json, sys
b, a = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
lines = open(sys.argv[3], encoding="utf-8").read().splitlines()[int(open(sys.argv[4]).read()):]
ev = [json.loads(x) for x in lines if x.strip()]
lb, la = b.get("lease") or {}, a.get("lease") or {}
first = lb.get("owner")
rb, ra = b["service"]["running"], a["service"].get("running") or {}
# anything the refused run could have left: a broken or replaced lease, a restart by another owner
traces = [e["event"] for e in ev if e["event"] in ("lease_broken", "break_lease")
          or (e.get("owner") and e.get("owner") != first)]
ok = not traces and la.get("owner") == first and la.get("acquired") == lb.get("acquired") and rb.get("config") == b["kept"]["config"]
same = ra.get("pid") == rb.get("pid")
d = (f"lease still {first}; the refused run wrote no log entry and started or stopped nothing; the kept server (pid {rb['pid']}) "
     + ("untouched" if same else f"was replaced later by the first run itself (now pid {ra.get('pid')})"))
print(json.dumps({"pass": ok, "detail": d if ok else f"the refused run left traces: {traces}; lease before {lb}, after {la}"}))
PYEOF
)
    REC6=$(check_records lease_before lease_after finished)
    row 6 lease_held "second tune, lease held" "the same bin/tune command started again during the first run's baseline" \
        "$RC6" "refused: the lease is held" "$DIAG6" "none" "$OK6" \
        "expected exit 4 naming the holder ($HOLDER): $([ $OK6 = 1 ] && echo yes || echo no)" "$SRV6" "$REC6"
else
    row 6 lease_held "second tune, lease held" "-" "-" "not run" "the first tune never held the lease during its baseline" "" 0 \
        "the first tune did not reach its baseline (see $OUT/tune1.err)" '{"pass": false, "detail": "not run"}' '{"pass": false, "detail": "not run"}'
fi

# fault 5: kill -9 while a trial is in the middle of its benchmark (one finished before it), then the same command again
say "fault 5: waiting for a trial in the middle of its benchmark to kill the tune ($T1) with SIGKILL"
if wait_for "$MAIN" "$T1" 120 'any(t["status"] in FIN for t in s["trials"]) and any(t["status"] == "applied" for t in s["trials"])'; then
    kill -9 "$T1"; wait "$T1" 2>/dev/null; T1=""
    snap kill_before "$MAIN"
    OPENT=$("$PY" - "$SNAP/kill_before.json" <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1]))
c = (s.get("candidate") or {}).get("status")
print(" ".join(f"{t['id']} was {t['status']} (candidate {c})" for t in s["trials"] if t["status"] in ("proposed", "applied")))
PYEOF
)
    say "killed mid-trial: $OPENT; rerunning the same command"
    timeout 180 env VKIT_STATE="$MAIN" "$PY" $B/tune "${TUNE[@]}" > "$OUT/tune3.out" 2> "$OUT/tune3.err"; RC5=$?
    snap kill_after "$MAIN"
    EV5=$(events "$MAIN" kill_before)
    OK5=0; [ "$RC5" = 0 ] && echo "$EV5" | grep -q "lease_broken" && echo "$EV5" | grep -q "converge" && OK5=1
    row 5 kill9_resume "kill -9 mid-trial, resumed" "SIGKILL to bin/tune while $OPENT; the same command rerun" \
        "$RC5" "resumed, $([ "$RC5" = 0 ] && echo converged || echo "exit $RC5")" "$(grep -h -m1 "resuming tuning run" "$OUT/tune3.err"; errline "$OUT/tune3.err")" "$EV5" "$OK5" \
        "expected: the rerun breaks the dead run's lease, finishes the open trial and converges (exit 0): $([ $OK5 = 1 ] && echo yes || echo no)" \
        "$(check_server kill_after "$(verify_rc "$MAIN")")" "$(check_records kill_before kill_after finished)"
else
    wait "$T1" 2>/dev/null; RC=$?; T1=""
    snap kill_after "$MAIN"
    row 5 kill9_resume "kill -9 mid-trial, resumed" "-" "$RC" "not killed" "$(errline "$OUT/tune1.err")" "" 0 \
        "the tune ended (exit $RC) before a trial was mid-benchmark with one finished: nothing was killed" \
        "$(check_server kill_after "$(verify_rc "$MAIN")")" '{"pass": false, "detail": "not run"}'
fi
TUNED=$("$PY" -c 'import json,sys; s=json.load(open(sys.argv[1])); print(len(s["trials"]), "trials,", "kept", s.get("kept_flags") or s["kept"]["config"])' "$SNAP/kill_after.json" 2>/dev/null)
say "tune finished: $TUNED"

# --- candidate faults on the tuned service, through restart_with_rollback --------------------------
rwr() {  # rwr NAME [flags]: restart_with_rollback on the tuned service, JSON result in $OUT/NAME.json
    local name=$1; shift
    timeout 120 env VKIT_STATE="$MAIN" "$PY" $B/restart_with_rollback --sandbox --json "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
}

say "fault 1: a candidate that fails at start-up (--set sim_fail_at_start=true)"
snap start_before "$MAIN"
rwr start_failure --set sim_fail_at_start=true --ready-timeout 30; RC1=$?
snap start_after "$MAIN"
EV1=$(events "$MAIN" start_before); DIAG1=$(verify_json "$OUT/start_failure.json")
OK1=0; [ "$RC1" = 1 ] && echo "$EV1" | grep -q "start_failed" && echo "$EV1" | grep -q "rolled_back" && OK1=1
row 1 start_failure "start failure" "restart_with_rollback --set sim_fail_at_start=true" "$RC1" "$(action_of "$OUT/start_failure.json")" "$DIAG1" "$EV1" "$OK1" \
    "expected exit 1, the log diagnosed and quoted, rolled back to the kept configuration: $([ $OK1 = 1 ] && echo yes || echo no)" \
    "$(check_server start_after "$(verify_rc "$MAIN")")" "$(check_records start_before start_after same)"

say "fault 3: a candidate whose streams stall after 8 tokens (--set sim_stall_stream_after=8), measured with --stall-timeout 1"
snap stall_before "$MAIN"
rwr stall_apply --set sim_stall_stream_after=8 --ready-timeout 30; RCA=$?
S0=$(date +%s)
timeout 120 env VKIT_STATE="$MAIN" "$PY" $B/bench_stream --model sim-8b --dataset-name random --random-input-len 256 --random-output-len 64 \
    --num-prompts 100 --max-concurrency 16 --seed 1 --stall-timeout 1 -q --records "$OUT/stall.jsonl" -o "$OUT/stall.json" \
    > /dev/null 2> "$OUT/stall_bench.err"; RC3=$?
S3=$(( $(date +%s) - S0 ))
"$PY" $B/check_invariants "$OUT/stall.json" --records "$OUT/stall.jsonl" > "$OUT/stall_check.json" 2>/dev/null; RCC=$?
timeout 120 env VKIT_STATE="$MAIN" "$PY" $B/rollback --reason "drill: revert the stalled candidate" --ready-timeout 30 -q \
    > /dev/null 2> "$OUT/stall_rollback.err"; RCR=$?
snap stall_after "$MAIN"
DIAG3=$("$PY" - "$OUT/stall.json" "$OUT/stall_check.json" <<'PYEOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    print("no summary written"); sys.exit()
try:
    c = json.load(open(sys.argv[2]))
except (OSError, ValueError):
    c = {}
errs = d.get("vkit", {}).get("errors") or {}
print(f"{d.get('failed')}/{d.get('num_prompts')} requests failed ({'; '.join(f'{v}x {k}' for k, v in errs.items())}); "
      f"check_invariants {c.get('verdict')} ({', '.join(c.get('findings') or [])})")
PYEOF
)
FAILED3=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["failed"])' "$OUT/stall.json" 2>/dev/null || echo 0)
OK3=0; [ "$RCA" = 0 ] && [ "$RC3" = 0 ] && [ "$FAILED3" = 100 ] && [ "$RCC" = 3 ] && [ "$RCR" = 0 ] && OK3=1
row 3 stalled_stream "stalled stream" "restart_with_rollback --set sim_stall_stream_after=8; bench_stream --stall-timeout 1; rollback" \
    "$RC3" "${FAILED3}/100 failed, no hang (${S3} s)" "bench_stream exit $RC3 in ${S3} s, check_invariants exit $RCC, rollback exit $RCR: $DIAG3" "$(events "$MAIN" stall_before)" "$OK3" \
    "expected: applied (exit $RCA: the 4-token verify passes), bench_stream ends (no hang) with every stalled request failed, check_invariants exit 3 (no verdict), rollback exit 0: $([ $OK3 = 1 ] && echo yes || echo no)" \
    "$(check_server stall_after "$(verify_rc "$MAIN")")" "$(check_records stall_before stall_after same)"

say "fault 4: a candidate whose /health never answers (--set sim_hang_health=true, --ready-timeout 3)"
snap hang_before "$MAIN"
S0=$(date +%s)
rwr health_hang --set sim_hang_health=true --ready-timeout 3; RC4=$?
S4=$(( $(date +%s) - S0 ))
snap hang_after "$MAIN"
EV4=$(events "$MAIN" hang_before); DIAG4=$(verify_json "$OUT/health_hang.json")
OK4=0; [ "$RC4" = 1 ] && echo "$DIAG4" | grep -q "ready_timeout" && echo "$EV4" | grep -q "rolled_back" && OK4=1
row 4 health_hang "health hang" "restart_with_rollback --set sim_hang_health=true --ready-timeout 3" "$RC4" "$(action_of "$OUT/health_hang.json")" "after ${S4} s; $DIAG4" "$EV4" "$OK4" \
    "expected exit 1 after --ready-timeout (ready_timeout), rolled back to the kept configuration: $([ $OK4 = 1 ] && echo yes || echo no)" \
    "$(check_server hang_after "$(verify_rc "$MAIN")")" "$(check_records hang_before hang_after same)"

# --- fault 2: the kept server dies in the middle of a benchmark -----------------------------------------
PORT2=$(free_port)
"$PY" $B/state --state "$CRASH" init --url "http://127.0.0.1:$PORT2" --model sim-8b \
    --set max_num_seqs=4 --set max_num_batched_tokens=2048 -- "${SIM[@]}" --port "$PORT2" --sim-crash-after 150 >/dev/null 2>&1 \
    || { say "state init failed"; exit 2; }
say "fault 2: a tune on a service whose engine dies at request 151 (the second baseline run of the kept server)"
snap crash_before "$CRASH"
timeout 240 env VKIT_STATE="$CRASH" "$PY" $B/tune "${TUNE[@]}" > "$OUT/crash_tune.out" 2> "$OUT/crash_tune.err"; RC2=$?
snap crash_after "$CRASH"
EV2=$(events "$CRASH" crash_before)
DEAD=$(grep -h -m1 -oE "EngineDeadError: [^.]*" "$DIR"/crash/logs/*.log 2>/dev/null | head -1)
# every run vkit recorded (baseline, trials, confirmations) must be a whole measurement: no failed request
CLEAN2=$("$PY" - "$CRASH" <<'PYEOF'
import json, os, sys
st = json.load(open(sys.argv[1])); d = os.path.dirname(sys.argv[1])
runs = list((st.get("baseline") or {}).get("runs") or []) + [p for t in st["trials"] for p in t.get("runs") or []]
runs += [p for c in st.get("confirmations", []) for p in c.get("a_runs", []) + c.get("b_runs", [])]
bad = [p for p in runs if json.load(open(os.path.join(d, p)))["failed"]]
print("yes" if runs and not bad else f"no: {len(bad)} recorded run(s) with failed requests")
PYEOF
)
OK2=0; [ "$RC2" = 0 ] && echo "$EV2" | grep -q "server_died" && [ "$CLEAN2" = yes ] && OK2=1
row 2 crash_mid_benchmark "crash mid-benchmark" "sim_server --sim-crash-after 150 in the launch argv: the kept server dies in baseline run 2" \
    "$RC2" "noticed, restarted, re-measured; exit $RC2" "[server log: ${DEAD:-no engine death logged}] $(grep -m1 -h "died during the measurement" "$OUT/crash_tune.err" | cut -c1-160)" "$EV2" "$OK2" \
    "expected: the dead server noticed after the run (server_died), the run not recorded, the same configuration restarted and measured again, the tune finished: $([ $OK2 = 1 ] && echo yes || echo "no ($CLEAN2)")" \
    "$(check_server crash_after "$(verify_rc "$CRASH")")" "$(check_records crash_before crash_after finished)"

# --- the table ------------------------------------------------------------------------------------------
"$PY" - "$ROWS" "$DIR/drill.json" "$(( $(date +%s) - T0 ))" <<'PYEOF'
import json, sys, textwrap
rows = sorted((json.loads(x) for x in open(sys.argv[1]) if x.strip()), key=lambda r: r["n"])
checks = [c for r in rows for c in r["checks"].values()]
ok = len(rows) == 6 and all(c["pass"] for c in checks)
mark = lambda c: "PASS" if c["pass"] else "FAIL"
doc = {"schema": "vkit.drill/1", "simulated": True, "passed": ok, "seconds": int(sys.argv[3]),
       "checks_passed": sum(c["pass"] for c in checks), "checks": len(checks), "faults": rows}
with open(sys.argv[2], "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
w = print
w(f"\nvkit fault drill (SIMULATED servers): {doc['checks_passed']}/{doc['checks']} checks passed in {doc['seconds']} s")
w(f"{'#':<2} {'fault':<27} {'exit':>4}  {'vkit did':<30} {'decision log':<34} {'react':<5} {'server':<6} {'records':<7}")
w("-" * 124)
for r in rows:
    c, ev = r["checks"], ", ".join(r["events"]) or "-"
    ev = ev if len(ev) <= 34 else ev[:15] + "…" + ev[-18:]
    w(f"{r['n']:<2} {r['fault'][:27]:<27} {str(r['exit']):>4}  {r['did'][:30]:<30} {ev:<34} {mark(c['reaction']):<5} {mark(c['server']):<6} "
      f"{mark(c['records']):<7}")
w("")
for r in rows:
    c = r["checks"]
    w(f"{r['n']}. {r['fault']} — injected: {r['injected']}")
    for label, text in (("vkit did", f"{r['did']}; {r['diagnosis']}"), ("log", ", ".join(r["events"]) or "-"),
                        ("reaction", f"{mark(c['reaction'])}: {c['reaction']['detail']}"), ("server", f"{mark(c['server'])}: {c['server']['detail']}"),
                        ("records", f"{mark(c['records'])}: {c['records']['detail']}")):
        w(textwrap.fill(text, width=118, initial_indent=f"   {label:<9} ", subsequent_indent=" " * 13))
w(f"\ndrill: {'PASS' if ok else 'FAIL'} — table as JSON in {sys.argv[2]}")
sys.exit(0 if ok else 1)
PYEOF
