#!/usr/bin/env bash
# make demo-broken: the seeds' story end to end on the simulated NPU (Ascend-910B).
#  1. the report as it came from the field, streaming off: vkit refuses to analyse it (TTFT ≡ E2EL,
#     exit 3) and explains its "prefill < decode" (the seed's 7.07 vs 16.78 tok/s): with TTFT ≡ E2EL
#     the two figures are input/E2EL and output/E2EL, so the order follows from 63 < 159 tokens;
#  2. streaming on, chunked prefill off, the short-prefill pathology (the simulator slows a step that
#     prefills prompts of <= 512 tokens: short_prefill_slowdown in vkit/sim/engine.py): prefill judged
#     with phase-isolated definitions against decode, and flagged (exit 1) when it lands below decode;
#  3. the fix (chunked prefill on) through restart_with_rollback: prefill recovers (the seed saw
#     +895%), and the throughput gain agrees with the E2E latency drop (consistency);
#  4. why step 2 landed where it did, from steps 2 and 3's per-request records: prefill over decode
#     by the number of prompts in the prefill step a request's prompt was computed in (how a wave of
#     16 falls into steps changes from run to run, and with it the p50).
# Every figure printed is this run's, computed from the files it wrote in DEMO_DIR.
# Workload of the seed: about 63 input and 159 output tokens, 16 in flight. Steps 2 and 3 replay
# one request set (seed 1), each on a cold prefix cache (step 3 runs on a restarted server); the
# field's report of step 1 is another run (seed 2). Replaying step 1's prompts on the server that
# just served them found 48 of each prompt's 63 tokens (3 full 16-token blocks) in the prefix
# cache: step 2 then timed 15-token prefills (5.7x decode) against step 3's 63-token ones.
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

bench() {  # bench NAME SEED [flags]
    local name=$1 seed=$2; shift 2
    "$PY" $B/bench_stream --model npu-model --dataset-name random --random-input-len 63 --random-output-len 159 \
        --num-prompts 200 --max-concurrency 16 --seed "$seed" -q --records "$DIR/$name.jsonl" "$@" > "$DIR/$name.json" || fail "bench_stream failed"
}
phase() {  # phase FILE: prefill vs decode per request, phase-isolated
    "$PY" - "$1" <<'PYEOF' >&2 || fail "the phase summary of $1 failed"
import json, sys
d = json.load(open(sys.argv[1])); ph = d["vkit"]["phase"]
pre = (ph.get("prefill_isolated_tok_s") or ph.get("prefill_tok_s") or {}).get("p50")
dec = (ph.get("decode_tok_s") or {}).get("p50")
print(f"  TTFT mean {d['mean_ttft_ms']:.1f} ms, E2EL mean {d['mean_e2el_ms']:.1f} ms, output {d['output_throughput']:.0f} tok/s;"
      f" prefill {pre:.1f} tok/s vs decode {dec:.1f} tok/s per request (p50): ratio {pre / dec:.2f}x")
PYEOF
}

finding() {  # finding NAME CHECK... : check_invariants on NAME.json (+ its records, + --compare before.json for after);
             # prints the verdict and each named check's finding in full; returns check_invariants' exit status
    local name=$1; shift
    local extra=(); [ -f "$DIR/$name.jsonl" ] && extra=(--records "$DIR/$name.jsonl")
    [ "$name" = after ] && extra+=(--compare "$DIR/before.json")
    "$PY" $B/check_invariants "$DIR/$name.json" "${extra[@]}" > "$DIR/$name.verdict.json" 2>/dev/null
    local rc=$?
    "$PY" - "$DIR/$name.verdict.json" "$@" <<'PYEOF' >&2
import json, sys, textwrap
d = json.load(open(sys.argv[1]))
bad = [c["id"] for c in d["checks"] if c["status"] == "fail"]
print(f"  check_invariants: {d['verdict'].upper()}" + (f" ({', '.join(bad)})" if bad else ""))
for c in d["checks"]:
    if c["id"] in sys.argv[2:]:
        st = {"pass": "pass", "fail": "FAIL", "not_applicable": "n/a"}[c["status"]]
        head = f"  {st:4} {c['severity'] if c['status'] == 'fail' else '':7} {c['id']}: "
        print(textwrap.fill(c["explanation"], 150, initial_indent=head, subsequent_indent=" " * 15))
PYEOF
    return $rc
}

say "SIMULATED Ascend-910B serving an 8B model, chunked prefill OFF, with the seed's short-prompt prefill pathology (virtual time ${SPEED}x)"
"$PY" $B/state init --url "http://127.0.0.1:$PORT" --model npu-model --set enable_chunked_prefill=false -- \
    "$PY" $B/sim_server npu-model --port "$PORT" --sim-gpu Ascend-910B --sim-model llama-3.1-8b --max-model-len 4096 \
    --sim-pathology short-prefill --sim-speed "$SPEED" --sim-startup-s 0.5 --sim-seed 3 || exit 2
"$PY" $B/rollback --reason "start the configuration as found in the field" --ready-timeout 60 -q >/dev/null || fail "the simulator did not start"

say "1. the report as it came from the field: streaming OFF"
bench nostream 2 --no-stream 2>/dev/null
finding nostream ttft_e2el_identity phase_order; rc=$?
[ "$rc" -eq 3 ] || fail "a non-streaming report was not refused (check_invariants exit $rc, expected 3)"
echo "  -> exit 3: no verdict may be drawn from it; TTFT is the whole latency. Fix the gauge first." >&2

say "2. the gauge fixed (streaming on): prefill vs decode judged with phase-isolated definitions"
bench before 1
phase "$DIR/before.json"
finding before phase_order; rc=$?
case $rc in
    1) echo "  -> exit 1 (anomaly): phase_order flags prefill below decode: wrong, not slow; tune refuses steps 2-4 on such a baseline." >&2 ;;
    0) echo "  -> exit 0: phase_order passes: prefill is still above decode (the ratio above), and an invariant catches wrong, not slow." >&2 ;;
    *) fail "check_invariants exit $rc on the streaming run" ;;
esac

say "3. the fix: chunked prefill ON, applied with automatic rollback"
"$PY" $B/restart_with_rollback --set enable_chunked_prefill=true --sandbox --ready-timeout 60 -q >/dev/null || fail "the fix did not apply"
bench after 1
phase "$DIR/after.json"
finding after phase_order throughput_latency_consistency; rc=$?
[ "$rc" -eq 0 ] || fail "the fixed configuration's run is not valid (check_invariants exit $rc)"
"$PY" - "$DIR/before.json" "$DIR/after.json" <<'PYEOF' >&2 || fail "the recovery figures failed"
import json, sys
b, a = (json.load(open(p)) for p in sys.argv[1:3])
pre = lambda d: d["vkit"]["phase"]["prefill_isolated_tok_s"]["p50"]
dec = a["vkit"]["phase"]["decode_tok_s"]["p50"]
print(f"  prefill recovered {pre(a) / pre(b):.1f}x: {pre(b):.1f} -> {pre(a):.1f} tok/s per request (p50), "
      f"{pre(a) / dec:.1f}x decode ({dec:.1f} tok/s)")
g = a["output_throughput"] / b["output_throughput"] - 1
e = 1 - a["mean_e2el_ms"] / b["mean_e2el_ms"]
print(f"  throughput {g:+.1%}, mean E2E latency {-e:+.1%}: on the same request set the gain and the drop agree "
      f"(|(T/T0)(E/E0) - 1| = {abs((1 + g) * (1 - e) - 1):.1%})")
PYEOF
say "4. why step 2's prefill sat where it did: prefill/decode per request, by the prefill step its prompt was computed in"
"$PY" - "$DIR/before.jsonl" "$DIR/after.jsonl" "$DIR/before.json" "$DIR/after.json" <<'PYEOF' >&2 || fail "the per-step analysis failed"
import json, statistics, sys, textwrap

def by_step(path):
    """{prompts in the step: [prefill/decode of each request whose prompt it computed]}. First tokens
    out of one step reach the client together: a gap of more than half a decode step (p50 TPOT / 2)
    between consecutive first tokens starts the next step."""
    rs = [json.loads(x) for x in open(path) if x.strip()]
    rs = sorted((r for r in rs if r.get("ok") and not r.get("warmup")), key=lambda r: r["start_s"] * 1e3 + r["ttft_ms"])
    tol = statistics.median(r["tpot_ms"] for r in rs) / 2
    steps, last = [], None
    for r in rs:
        t = r["start_s"] * 1e3 + r["ttft_ms"]
        if last is None or t - last > tol:
            steps.append([])
        steps[-1].append(r)
        last = t
    out = {}
    for s in steps:  # a request whose TTFT is below the run's mean queue time has no isolated prefill
        out.setdefault(len(s), []).extend(r["prefill_isolated_tok_s"] / r["decode_tok_s"] for r in s if "prefill_isolated_tok_s" in r)
    return {k: v for k, v in out.items() if v}, sum("prefill_isolated_tok_s" not in r for r in rs)

def row(name, grouped):  # the three step sizes that hold the most requests
    groups, unisolated = grouped
    top = sorted(groups, key=lambda k: (-len(groups[k]), k))[:3]
    parts = [f"{statistics.median(groups[k]):.2f}x {'alone' if k == 1 else f'in steps of {k} prompts'} ({len(groups[k])} requests)"
             for k in top]
    rest = sum(len(v) for k, v in groups.items() if k not in top)
    return (f"{name}: " + ", ".join(parts) + (f"; {rest} requests in steps of other sizes" if rest else "")
            + (f"; {unisolated} with TTFT below the mean queue time (no isolated prefill)" if unisolated else ""))

b, a = (json.load(open(p))["vkit"]["phase"] for p in sys.argv[3:5])
p50 = b["prefill_isolated_tok_s"]["p50"] / b["decode_tok_s"]["p50"]
rec = a["prefill_isolated_tok_s"]["p50"] / b["prefill_isolated_tok_s"]["p50"]
lines = [row("step 2, chunked prefill off (before.jsonl)", by_step(sys.argv[1])),
         row("step 3, chunked prefill on (after.jsonl)", by_step(sys.argv[2])),
         "A prompt's prefill time is its step's, which computes every prompt in it, plus the wait for the step before it; the "
         f"pathology slows the step, and prefill recovered {rec:.1f}x (p50) without it. Step 2's p50 over all its requests, "
         f"{p50:.2f}x decode (before.json), is the ratio of the steps that hold most of them: below 1.0 when those are slow steps "
         "of a whole wave's prompts, or wait behind one."]
for line in lines:
    print(textwrap.fill(line, 150, initial_indent="  ", subsequent_indent="    "))
PYEOF
echo >&2
echo "Files: $DIR (summaries, per-request records, decision log)" >&2
