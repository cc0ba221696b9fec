#!/usr/bin/env bash
# The vkit chain on the embedded simulator, as a field engineer would type it:
# register the service -> start and verify -> measure with the streaming gauge -> validate ->
# see a broken gauge refused -> apply a candidate with rollback -> see a failing candidate
# rolled back -> decide with the gate. `make demo` runs it; every step is a bin/ tool.
#
# Variables: PY (python with vkit's dependencies), DEMO_DIR (state and results), DEMO_PORT,
# SIM_SPEED (virtual time speed-up of the simulator), PROMPTS (requests per measurement),
# REPEATS (measurements per configuration).
set -u
PY=${PY:-python3}
DIR=${DEMO_DIR:-vkit-state/demo}
PORT=${DEMO_PORT:-18088}
SPEED=${SIM_SPEED:-4}
PROMPTS=${PROMPTS:-200}
REPEATS=${REPEATS:-4}
URL=http://127.0.0.1:$PORT
export VKIT_STATE=$DIR/vkit.json
B=bin
rm -rf "$DIR" && mkdir -p "$DIR" || exit 2

say() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }
fail() { printf 'demo: %s\n' "$*" >&2; exit 1; }
. "$(dirname "$0")/lib.sh"
cleanup() { stop_recorded_server "$VKIT_STATE"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# Repeat k of every configuration uses seed k: the same request sets on both sides, and no repeat
# finds its prompts already in the server's prefix cache from the repeat before it.
bench() {  # bench NAME SEED [extra flags]: one measurement, summary to $DIR/NAME.json
    local name=$1 seed=$2; shift 2
    "$PY" $B/bench_stream --url "$URL" --model sim-8b --dataset-name random --random-input-len 512 \
        --random-output-len 128 --num-prompts "$PROMPTS" --max-concurrency 32 --seed "$seed" -q \
        --records "$DIR/$name.jsonl" "$@" > "$DIR/$name.json"
}
line() {  # line FILE: one line of the summary
    "$PY" - "$1" <<'PYEOF' >&2
import json, os, sys
d = json.load(open(sys.argv[1]))
print(f"  {os.path.basename(sys.argv[1]):<12} {d['output_throughput']:8.0f} out tok/s   TTFT mean {d['mean_ttft_ms']:7.1f} ms"
      f"  p95 {d['p95_ttft_ms']:7.1f} ms   TPOT mean {d['mean_tpot_ms']:6.2f} ms")
PYEOF
}

say "SIMULATED server: an 8B model on one H200, noise settings 2% run to run and 1.5% between starts, virtual time ${SPEED}x faster than wall time (every figure below is simulated)"
"$PY" $B/state init --url "$URL" --model sim-8b --set max_num_seqs=8 -- \
    "$PY" $B/sim_server sim-8b --port "$PORT" --max-model-len 8192 --sim-speed "$SPEED" --sim-startup-s 1 --sim-seed 7 \
    || fail "state init failed"

say "1. start the kept configuration (max_num_seqs=8) and verify it really serves"
"$PY" $B/rollback --reason "first start of the kept configuration" --ready-timeout 60 || fail "the simulator did not start"
"$PY" $B/post_start_verify || fail "post_start_verify failed"

say "2. the streaming gauge: $REPEATS baseline measurements of $PROMPTS requests, 32 in flight"
for i in $(seq 1 "$REPEATS"); do bench "base$i" "$i" || fail "bench_stream failed"; line "$DIR/base$i.json"; done

say "3. validate before any analysis"
"$PY" $B/check_invariants "$DIR/base1.json" --records "$DIR/base1.jsonl" --human > /dev/null 2>"$DIR/check_base1.txt"
rc=$?; tail -n 1 "$DIR/check_base1.txt" >&2; head -n 1 "$DIR/check_base1.txt" >&2
[ $rc -eq 0 ] || fail "the baseline is not valid (exit $rc): see $DIR/check_base1.txt"

say "4. a broken gauge: the same benchmark with streaming off is refused"
bench nostream 1 --no-stream 2>/dev/null
"$PY" $B/check_invariants "$DIR/nostream.json" 2>&1 >/dev/null | grep -E "INVALID|ttft_e2el_identity|streaming" | head -n 3 >&2
"$PY" $B/check_invariants "$DIR/nostream.json" >/dev/null 2>&1
[ $? -eq 3 ] || fail "a non-streaming run was not refused"

say "5. apply a candidate (max_num_seqs=32) with automatic rollback on failure"
"$PY" $B/restart_with_rollback --set max_num_seqs=32 --sandbox --ready-timeout 60 || fail "the candidate did not apply"
for i in $(seq 1 "$REPEATS"); do bench "cand$i" "$i" || fail "bench_stream failed"; line "$DIR/cand$i.json"; done

say "6. decide with statistics: threshold max(2 sigma, 3%), power analysis, always-valid test"
if [ -x $B/gate ]; then
    "$PY" $B/gate --baseline "$DIR"/base*.json --candidate "$DIR"/cand*.json --primary output_throughput:+ \
        --guard p95_ttft_ms:-:10% > "$DIR/gate.json"
    echo "  gate exit $? (0 accept, 1 reject, 6 undecided): $("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get("decision"), "-", d.get("why"))' "$DIR/gate.json")" >&2
else
    echo "  (the gate is not installed in this build)" >&2
fi

say "7. a candidate that cannot start (batched tokens < max-model-len with chunked prefill off): automatic rollback"
"$PY" $B/restart_with_rollback --set max_num_batched_tokens=2048 --set enable_chunked_prefill=false --sandbox --ready-timeout 60
[ $? -eq 1 ] || fail "the failing candidate was not rolled back"
"$PY" $B/post_start_verify -q > /dev/null || fail "the kept configuration does not serve after the rollback"

say "8. where things stand"
"$PY" $B/state show
echo >&2
echo "Results and logs: $DIR   (decision log: $DIR/decisions.jsonl)" >&2
echo "These steps chained into a whole tuning run: make demo (bin/tune; one step at a time: bin/sweep)." >&2
