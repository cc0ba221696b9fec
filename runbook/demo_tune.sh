#!/usr/bin/env bash
# make demo: a whole tuning run on the embedded simulator (or on a real server with URL and SERVE).
#   simulator (default): Llama-3.1-70B at tensor parallel 4 on four H100s; noise set to 2% run to run on one
#   process and 1.5% between server starts (the sd the tune measures is in its result); virtual time SIM_SPEED x
#   faster than wall time (8: the 2-core client keeps up with what this server carries; an 8B on one H200 at
#   speed 4 carries more than 400 req/s of wall time at 512 sequences, past what the client can offer for a
#   long run). The objective is SLO capacity (bin/tune --objective capacity): req/s offered open loop while
#   every SLO holds. The search is the twin's (--search twin): the simulator fitted to the baseline's load
#   points ranks every configuration, the server confirms at most --max-restarts 8 starts' worth of them.
#   SEARCH=staged runs steps 2-3 instead (no restart budget).
#   real server: make demo URL=http://127.0.0.1:8000 MODEL=/models/x SERVE="vllm serve /models/x --port 8000"
set -u
PY=${PY:-python3}
DIR=${DEMO_DIR:-vkit-state/demo-tune}
SPEED=${SIM_SPEED:-8}
PORT=${DEMO_PORT:-18089}
URL=${URL:-}
SERVE=${SERVE:-}
MODEL=${MODEL:-}
export VKIT_STATE=$DIR/vkit.json
B=bin

. "$(dirname "$0")/lib.sh"
cleanup() { stop_recorded_server "$VKIT_STATE"; }

if [ -n "$URL" ]; then
    [ -n "$SERVE" ] && [ -n "$MODEL" ] || { echo "demo: with URL=... give MODEL=... and SERVE=\"vllm serve ...\" too" >&2; exit 2; }
    if [ ! -f "$VKIT_STATE" ]; then
        # SERVE is split like a shell would split it, once, here: it is the user's own command line.
        read -r -a ARGV <<< "$SERVE"
        "$PY" $B/state init --url "$URL" --model "$MODEL" -- "${ARGV[@]}" || exit 2
    fi
    exec "$PY" $B/tune --yes --concurrency "${CONCURRENCY:-32}" "$@"
fi

if [ ! -f "$VKIT_STATE" ] || [ "${FRESH:-1}" = 1 ]; then
    cleanup
    rm -rf "$DIR" && mkdir -p "$DIR" || exit 2
    # The kept configuration to start from: a conservative one copied from a smaller GPU's defaults.
    "$PY" $B/state init --url "http://127.0.0.1:$PORT" --model sim-70b --set max_num_batched_tokens=2048 --set max_num_seqs=16 -- \
        "$PY" $B/sim_server sim-70b --port "$PORT" --max-model-len 8192 --sim-gpu "${SIM_GPU:-H100-80G}" \
        --sim-model "${SIM_MODEL:-llama-3.1-70b}" -tp "${TP:-4}" \
        --sim-speed "$SPEED" --sim-startup-s 0.5 --sim-seed 11 --sim-start-file "$(cd "$DIR" && pwd)/sim-starts" || exit 2
fi
trap cleanup EXIT
echo "SIMULATED server: ${SIM_MODEL:-llama-3.1-70b} on ${TP:-4} x ${SIM_GPU:-H100-80G} (vkit sim_server), virtual time ${SPEED}x faster than wall time;" \
     "noise settings 2% run to run on one process, 1.5% more between server starts (the sd measured is the baseline's below)." >&2
echo "Every figure below is simulated; throughputs and latencies are in wall time as a client sees them." >&2
# The question a field engineer is asked: how many requests per second does the box carry with P95 TTFT
# <= 1 s and mean TPOT <= 40 ms of the server's own time (125 ms and 5 ms of wall time at speed 8, the
# client's clock), open loop, and which flags get the most of it. Each configuration's
# measurement is a capacity search, bracketed from the reference load (the first baseline search's
# capacity); short load points (POINT_S wall seconds), the sequential stop per point, no drift sentinel.
# ABLATION=off by default here: step 2 keeps the token budget and max_num_seqs together, and the attribution
# (each alone against the configuration before; `sweep --ablate` afterwards) adds about nine capacity
# searches, past the demo's 5 minutes. A field tune runs it by itself (tune --ablation auto, the default).
RESTARTS=()
[ "${SEARCH:-twin}" = twin ] && RESTARTS=(--max-restarts "${MAX_RESTARTS:-8}")
"$PY" $B/tune --sandbox --objective capacity --concurrency "${CONCURRENCY:-32}" --input-len "${INPUT_LEN:-1024}" --output-len 128 \
    --num-prompts "${PROMPTS:-100}" --slo p95_ttft_ms="${SLO_MS:-125}" --slo mean_tpot_ms="${TPOT_MS:-5}" \
    --steps "${STEPS:-1,2,3}" --budget "${BUDGET:-3}" --baseline-repeats 3 --screen-repeats 1 \
    --confirm-front "${CONFIRM_FRONT:-1}" --point-seconds "${POINT_S:-1}" --capacity-start "${START_RPS:-16}" \
    --capacity-noise 0.03 --max-point-seconds "${MAX_POINT_S:-4}" --verify-seconds "${VERIFY_S:-4}" \
    --ablation "${ABLATION:-off}" --ready-timeout 60 --search "${SEARCH:-twin}" \
    ${RESTARTS[@]+"${RESTARTS[@]}"} "$@"
