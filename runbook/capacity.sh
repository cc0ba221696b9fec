#!/usr/bin/env bash
# make capacity: the SLO capacity of a server. With URL=... the running server; without, a
# simulated 70B at TP 4 on H100 started here (virtual time SIM_SPEED x faster) and stopped after.
#   make capacity URL=http://127.0.0.1:8000 MODEL=m CAPACITY_FLAGS="--random-input-len 1024 --slo p95_ttft_ms=1000"
set -u
PY=${PY:-python3}
URL=${URL:-}
MODEL=${MODEL:-}
SPEED=${SIM_SPEED:-4}
PORT=${CAPACITY_PORT:-18093}
B=bin
if [ -n "$URL" ]; then
    read -r -a EXTRA <<< "${CAPACITY_FLAGS:-}"
    exec "$PY" $B/capacity --url "$URL" ${MODEL:+--model "$MODEL"} "${EXTRA[@]}"
fi
DIR=${CAPACITY_DIR:-vkit-state/capacity}
mkdir -p "$DIR" || exit 2
"$PY" $B/sim_server sim-70b --port "$PORT" --sim-gpu H100-80G --sim-model llama-3.1-70b -tp 4 --max-model-len 4096 \
    --sim-speed "$SPEED" --sim-startup-s 0 --sim-seed 21 --sim-start-file "$(cd "$DIR" && pwd)/sim-starts" \
    > "$DIR/server.log" 2>&1 &
SIM=$!
trap 'kill "$SIM" 2>/dev/null; wait "$SIM" 2>/dev/null' EXIT
for _ in $(seq 100); do "$PY" -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=1)" \
    "http://127.0.0.1:$PORT/health" 2>/dev/null && break; sleep 0.1; done
echo "SIMULATED server: llama-3.1-70b, TP 4 on H100 (vkit sim_server), virtual time ${SPEED}x faster than wall time:" \
     "rates and latencies below are wall-clock, as the client sees them." >&2
"$PY" $B/capacity --url "http://127.0.0.1:$PORT" --model sim-70b --random-input-len 1024 --random-output-len 128 \
    --num-prompts 200 --point-seconds 10 --slo p95_ttft_ms="${SLO_MS:-250}" --slo mean_tpot_ms="${TPOT_MS:-25}" \
    --start 8 --accelerators 4 --run-dir "$DIR/runs-$(date +%Y%m%dT%H%M%S)" -o "$DIR/capacity.json" "$@" > /dev/null || rc=$?
"$PY" - "$DIR/capacity.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"{'load':>8} {'verdict':8} {'runs':>4} {'req/s':>7} {'P95 TTFT':>9} {'mean TPOT':>9}  binding")
for p in d["curve"]:
    m = p["metrics"]
    print(f"{p['load']:8g} {p['verdict']:8} {p['runs']:4d} {m.get('request_throughput', float('nan')):7.1f} "
          f"{m.get('p95_ttft_ms', float('nan')):7.0f}ms {m.get('mean_tpot_ms', float('nan')):7.1f}ms  {p['binding'] or '-'}")
cap = d["capacity"]
print(f"capacity: {cap:g} req/s offered, {d['capacity_output_tok_s'] or 0:.0f} output tok/s"
      f" ({(d.get('per_accelerator') or {}).get('output_tok_s') or 0:.0f} per accelerator); fails by {d['upper']:g} req/s;"
      f" binding SLO {d['binding_slo']}" if cap is not None and d["upper"] is not None else f"no capacity: {d['stop']}")
print(f"stop rule: {d['stop']} ({d['runs']} runs)")
PYEOF
exit "${rc:-0}"
