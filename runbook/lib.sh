# Shared by the runbook scripts (sourced, not run): stop the server that the state file says vkit
# started — by its recorded pid and start time, never by name.
stop_recorded_server() {  # stop_recorded_server STATE_FILE
    "$PY" - "$1" <<'PYEOF' >/dev/null 2>&1
import sys
from vkit.apply import launcher
from vkit.state import StateFile
try:
    launcher.stop(StateFile(sys.argv[1]).read()["service"].get("running"), grace_s=10)
except Exception:
    pass
PYEOF
}
