#!/usr/bin/env bash
# Install the peer benchmark tools (GuideLLM, AIPerf) into a venv of their own, apart from vkit's
# runtime, with CPU-only torch. Idempotent: a finished install (marker file) is left as it is.
#
#   bash tests/peers/install.sh [VENV]                    # from the package index (default .venv-peers)
#   WHEELHOUSE=dir bash tests/peers/install.sh [VENV]     # offline: --no-index --find-links dir
#   bash tests/peers/install.sh --download DIR            # on a connected machine: fill a wheelhouse
#
# The pins are tests/peers/requirements.txt (top level) and tests/peers/constraints.txt (every
# package, as installed and measured here), so an offline install gets the same set.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REQ="$HERE/requirements.txt"
CON="$HERE/constraints.txt"
PYTHON=${PYTHON:-python3}
if [ "${1:-}" = "--download" ]; then
    DIR=${2:?usage: install.sh --download DIR}
    # torch's CPU build is not on PyPI: take it alone from PyTorch's CPU index (or put the wheel in DIR by hand),
    # then everything else from the package index, with DIR as a source so the CPU torch satisfies the pin.
    TORCH=$(grep -E '^torch==' "$REQ")
    "$PYTHON" -m pip download -d "$DIR" --no-deps --extra-index-url https://download.pytorch.org/whl/cpu "$TORCH"
    "$PYTHON" -m pip download -d "$DIR" --find-links "$DIR" -r "$REQ" -c "$CON"
    echo "copy $DIR/ to the target machine, then: make peers WHEELHOUSE=$DIR" >&2
    exit 0
fi
VENV=${1:-.venv-peers}
MARK="$VENV/.vkit-peers-guidellm-0.8.1-aiperf-0.13.0"
if [ -f "$MARK" ]; then
    echo "peers already installed in $VENV" >&2
    exit 0
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
SRC=()
if [ -n "${WHEELHOUSE:-}" ]; then
    SRC=(--no-index --find-links "$WHEELHOUSE")
fi
echo "installing GuideLLM 0.8.1 and AIPerf 0.13.0 into $VENV (CPU torch; about 2-3 minutes, 2.1 GB)..." >&2
t0=$(date +%s)
"$VENV/bin/python" -m pip install -q "${SRC[@]}" -r "$REQ" -c "$CON"
# Refuse a CUDA torch (GBs, useless here) whatever the index offered.
"$VENV/bin/python" - <<'PY'
import importlib.metadata as m, sys
v = m.version("torch")
# nvidia-ml-py (NVML bindings, 0.1 MB, an AIPerf dependency) is no CUDA runtime; the rest come with a CUDA torch.
names = {(d.metadata["Name"] or "").lower() for d in m.distributions()}
cuda = sorted(n for n in names if n.startswith(("nvidia-", "triton", "cuda-")) and n != "nvidia-ml-py")
if not v.endswith("+cpu") or cuda:
    sys.exit(f"peers venv got torch {v} with {cuda}: a CUDA build; expected torch 2.13.0+cpu and no CUDA packages")
print("guidellm", m.version("guidellm"), "aiperf", m.version("aiperf"), "torch", v, file=sys.stderr)
PY
"$VENV/bin/guidellm" --help > /dev/null
"$VENV/bin/aiperf" --help > /dev/null
echo "peers installed in $(( $(date +%s) - t0 )) s; $(du -sh "$VENV" | cut -f1) in $VENV" >&2
touch "$MARK"
