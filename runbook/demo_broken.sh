#!/usr/bin/env bash
# make demo-broken: the seeds' story end to end on the simulated NPU (Ascend-910B).
#  1. a benchmark with streaming off: vkit refuses to analyse it (TTFT ≡ E2EL);
#  2. streaming on, chunked prefill off, short prompts: the phase-isolated prefill rate is only a
#     few times the decode rate (the simulator's short-prefill pathology: 10x slower short prefills);
#  3. the fix (chunked prefill on) through restart_with_rollback: prefill recovers, and the
#     throughput gain agrees with the drop in E2E latency (the consistency check).
# Workload of the seed: about 63 input and 159 output tokens, 16 in flight.
set -u
PY=${PY:-python3}
DIR=${DEMO_DIR:-vkit-state/demo-broken}
PORT=${DEMO_PORT:-18090}
SPEED=${SIM_SPEED:-4}
export VKIT_STATE=$DIR/vkit.json
B=bin
say() { printf '\n== %s\n' "$*" >&2; }
fail() { printf 'demo-broken: %s\n' "$*" >&2; exit 1; }
. "$(dirname "$0")/lib.sh"
cleanup() { stop_recorded_server "$VKIT_STATE"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
rm -rf "$DIR" && mkdir -p "$DIR" || exit 2

bench() {  # bench NAME [flags]
    local name=$1; shift
    "$PY" $B/bench_stream --model npu-model --dataset-name random --random-input-len 63 --random-output-len 159 \
        --num-prompts 200 --max-concurrency 16 --seed 1 -q --records "$DIR/$name.jsonl" "$@" > "$DIR/$name.json" || fail "bench_stream failed"
}
phase() {  # phase FILE: prefill vs decode per request, phase-isolated
    "$PY" - "$1" <<'PYEOF' >&2
import json, sys
d = json.load(open(sys.argv[1])); ph = d["vkit"]["phase"]
pre = (ph.get("prefill_isolated_tok_s") or ph.get("prefill_tok_s") or {}).get("p50")
dec = (ph.get("decode_tok_s") or {}).get("p50")
print(f"  TTFT mean {d['mean_ttft_ms']:.1f} ms, E2EL mean {d['mean_e2el_ms']:.1f} ms, output {d['output_throughput']:.0f} tok/s;"
      f" prefill {pre:.1f} tok/s vs decode {dec:.1f} tok/s per request (p50): ratio {pre / dec:.1f}x")
PYEOF
}

say "SIMULATED Ascend-910B serving an 8B model, chunked prefill OFF, with the seed's short-prompt prefill pathology (virtual time ${SPEED}x)"
"$PY" $B/state init --url "http://127.0.0.1:$PORT" --model npu-model --set enable_chunked_prefill=false -- \
    "$PY" $B/sim_server npu-model --port "$PORT" --sim-gpu Ascend-910B --sim-model llama-3.1-8b --max-model-len 4096 \
    --sim-pathology short-prefill --sim-speed "$SPEED" --sim-startup-s 0.5 --sim-seed 3 || exit 2
"$PY" $B/rollback --reason "start the configuration as found in the field" --ready-timeout 60 -q >/dev/null || fail "the simulator did not start"

say "1. the report as it came from the field: streaming OFF"
bench nostream --no-stream 2>/dev/null
"$PY" $B/check_invariants "$DIR/nostream.json" --human 2>/dev/null | grep -E "INVALID|streaming |ttft_e2el_identity|phase_order" | cut -c1-160 >&2
"$PY" $B/check_invariants "$DIR/nostream.json" >/dev/null 2>&1
[ $? -eq 3 ] || fail "a non-streaming report was not refused"
echo "  -> exit 3: no verdict may be drawn from it; TTFT is the whole latency. Fix the gauge first." >&2

say "2. the gauge fixed (streaming on): prefill vs decode judged with phase-isolated definitions"
bench before
phase "$DIR/before.json"
"$PY" $B/check_invariants "$DIR/before.json" --records "$DIR/before.jsonl" --human 2>/dev/null | grep -E "ANOMALY|VALID|phase_order" | cut -c1-160 >&2
echo "  -> prefill should be compute-bound and many times faster than decode; here the short-prompt prefill path is slow" >&2
echo "     (chunked prefill off). Had it fallen below decode, check_invariants would flag it and tune would refuse steps 2-4." >&2

say "3. the fix: chunked prefill ON, applied with automatic rollback"
"$PY" $B/restart_with_rollback --set enable_chunked_prefill=true --sandbox --ready-timeout 60 -q >/dev/null || fail "the fix did not apply"
bench after
phase "$DIR/after.json"
"$PY" $B/check_invariants "$DIR/after.json" --records "$DIR/after.jsonl" --compare "$DIR/before.json" --human 2>/dev/null \
    | grep -E "VALID|ANOMALY|phase_order|throughput_latency_consistency" | cut -c1-170 >&2
"$PY" - "$DIR/before.json" "$DIR/after.json" <<'PYEOF' >&2
import json, sys
b, a = (json.load(open(p)) for p in sys.argv[1:3])
g = a["output_throughput"] / b["output_throughput"] - 1
e = 1 - a["mean_e2el_ms"] / b["mean_e2el_ms"]
print(f"  throughput {g:+.1%}, mean E2E latency {-e:+.1%}: on the same request set the gain and the drop agree "
      f"(|(T/T0)(E/E0) - 1| = {abs((1 + g) * (1 - e) - 1):.1%})")
PYEOF
echo >&2
echo "Files: $DIR (summaries, per-request records, decision log)" >&2
