#!/usr/bin/env bash
# make what-if: what would the tuner recommend for a deployment you do not have yet? The simulated
# deployment (sim_server's flags: model, accelerator, TP, a calibrated profile) tuned end to end in
# virtual time: no process, no socket, every figure simulated and given in the simulated accelerator's
# seconds (a restart costs RESTART_S of them, as a field engineer pays one).
#   make what-if SIM="--sim-model llama-3.1-70b --sim-gpu H100-80G -tp 4" WHATIF_FLAGS="--slo p95_ttft_ms=2000"
set -u
PY=${PY:-python3}
DIR=${WHATIF_DIR:-vkit-state/what-if}
B=bin
read -r -a SIMFLAGS <<< "${SIM:---sim-model llama-3.1-8b --sim-gpu H200}"
read -r -a EXTRA <<< "${WHATIF_FLAGS:-}"
rm -rf "$DIR" && mkdir -p "$DIR" || exit 2
export VKIT_STATE="$DIR/vkit.json"
# the start: a conservative configuration (a smaller GPU's defaults); the port is never bound
"$PY" $B/state init --url http://127.0.0.1:1 --model what-if --set max_num_batched_tokens=2048 --set max_num_seqs=16 -- \
    "$PY" $B/sim_server what-if --port 1 --max-model-len 8192 --sim-startup-s "${RESTART_S:-60}" --sim-seed "${SEED:-1}" \
    "${SIMFLAGS[@]}" > /dev/null || exit 2
echo "VIRTUAL tune of a SIMULATED deployment (${SIMFLAGS[*]}): no server runs; every figure is simulated," \
     "in the simulated accelerator's time (a restart costs ${RESTART_S:-60} s of it)." >&2
exec "$PY" $B/tune --virtual --sandbox --objective capacity --input-len "${INPUT_LEN:-512}" --output-len "${OUTPUT_LEN:-128}" \
    --num-prompts 100 --slo p95_ttft_ms="${SLO_MS:-1000}" --slo mean_tpot_ms="${TPOT_MS:-50}" --steps "${STEPS:-1,2,3}" \
    --budget "${BUDGET:-3}" --ablation off --energy-axis "${EXTRA[@]}"
