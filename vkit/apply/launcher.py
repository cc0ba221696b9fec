"""Start and stop the server the state file describes, and diagnose why it did not start.

The launch argv from ``state init`` gets the tuned parameters appended as vLLM flags
(``max_num_seqs=64`` → ``--max-num-seqs 64``; booleans → ``--enable-x``/``--no-enable-x``)
and is started as a child in its own process group, stdout and stderr to a log file
next to the state. Never a shell string built from parameter values.

Hook mode (docker, systemd): ``launch.mode == "hooks"`` runs ``start_hook`` / ``stop_hook``
argvs with the flags in ``$VKIT_SERVE_FLAGS`` (a JSON list) and in the file named by
``$VKIT_SERVE_FLAGS_FILE`` (one argv item per line).

Stop = SIGTERM to the process group, wait, SIGKILL after a grace period. A recorded pid
is only signalled when its start time still matches the one recorded (no pid reuse
accidents); nothing is ever killed by name.

Every server started in argv mode carries ``VKIT_SERVER_TAG`` in its environment: a hash
of the state directory that launched it. A vkit killed between starting a server and
recording its pid leaves a server nobody recorded; ``stop_tagged`` finds it (and only
it: a process of this state's own tag) by reading ``/proc/PID/environ``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable

import requests

from vkit.apply.policy import to_serve_flags
from vkit.errors import UsageError


def serve_argv(launch: dict, config: dict) -> list[str]:
    """The launch argv with the configuration's flags: a flag the configuration sets is removed
    from the launch argv first (``--x V``, ``--x=V``, ``--no-x``), so each appears once."""
    return strip_flags(list(launch.get("argv") or []), config) + to_serve_flags(config)


def strip_flags(argv: list[str], config: dict) -> list[str]:
    names = set()
    for k in config:
        f = "--" + k.replace("_", "-")
        names |= {f, "--" + k, "--no-" + f[2:], "--no-" + k}
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        key = a.split("=", 1)[0]
        if key in names:
            bare_bool = key.startswith("--no-") or "=" in a or i + 1 >= len(argv) or argv[i + 1].startswith("-")
            i += 1 if bare_bool else 2
            continue
        out.append(a)
        i += 1
    return out


def proc_start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks), None if gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rindex(")") + 2 :].split()
    if rest[0] in ("Z", "X"):
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)  # reap our own zombie
        return None
    return int(rest[19])


def alive(pid: int | None, ticks: int | None = None) -> bool:
    if not pid:
        return False
    t = proc_start_ticks(pid)
    if t is None:
        return False
    return ticks is None or t == ticks


@dataclass
class Running:
    """A started server: what the state file records about it."""

    pid: int
    pgid: int
    ticks: int | None
    log: str
    argv: list[str]
    started: float
    proc: subprocess.Popen | None = None
    hook: bool = False  # started by a start hook (systemd, docker): the hook may exit 0 and leave the server running

    def as_state(self) -> dict:
        return {"pid": self.pid, "pgid": self.pgid, "ticks": self.ticks, "log": self.log, "argv": self.argv,
                "started": self.started, "hook": self.hook}

    def is_alive(self) -> bool:
        if self.proc is not None:
            rc = self.proc.poll()
            return rc is None or (self.hook and rc == 0)
        return alive(self.pid, self.ticks)

    def exit_code(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None


def log_path_for(state_dir: str, label: str) -> str:
    os.makedirs(os.path.join(state_dir, "logs"), exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    base = os.path.join(state_dir, "logs", f"server-{stamp}-{label}")
    path, n = base + ".log", 1
    while os.path.exists(path):
        n += 1
        path = f"{base}-{n}.log"
    return path


TAG_VAR = "VKIT_SERVER_TAG"


def tag_for(state_dir: str) -> str:
    """The tag of the servers one state directory launches (stable across vkit processes)."""
    return hashlib.sha256(os.path.realpath(state_dir).encode()).hexdigest()[:24]


def tagged_pids(tag: str) -> list[int]:
    """Live processes whose environment carries ``VKIT_SERVER_TAG=tag`` (own processes only
    where /proc hides others' environments)."""
    needle = f"{TAG_VAR}={tag}".encode()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                items = f.read().split(b"\0")
        except OSError:
            continue
        if needle in items and proc_start_ticks(int(d)) is not None:
            out.append(int(d))
    return sorted(out)


def stop_tagged(tag: str, grace_s: float = 15.0) -> list[str]:
    """Stop every process group holding a process of ``tag``: servers a killed vkit started but
    never recorded. Returns what was done, one line a group."""
    done, groups = [], {}
    for pid in tagged_pids(tag):
        with contextlib.suppress(OSError):
            groups.setdefault(os.getpgid(pid), pid)
    for pgid, pid in sorted(groups.items()):
        leader = pgid if alive(pgid) else pid
        done.append(stop({"pid": leader, "pgid": pgid, "ticks": proc_start_ticks(leader)}, grace_s=grace_s))
    return done


def start(launch: dict, config: dict, log_path: str, env_extra: dict | None = None, tag: str | None = None) -> Running:
    """Start the server for ``config``; returns at once (readiness is ``wait_ready``'s job).
    ``tag`` marks the server's environment (``stop_tagged``); ``launch["env"]`` (a slot's visible
    devices, ``vkit.apply.slots``) and ``env_extra`` are added to it."""
    flags = to_serve_flags(config)
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (launch.get("env") or {}).items()})
    env.update(env_extra or {})
    if tag:
        env[TAG_VAR] = tag
    mode = launch.get("mode", "argv")
    if mode == "hooks":
        hook = launch.get("start_hook")
        if not hook:
            raise UsageError("launch mode 'hooks' needs a start_hook argv in the state file")
        flags_file = log_path + ".flags"
        with open(flags_file, "w", encoding="utf-8") as f:
            f.write("".join(x + "\n" for x in flags))
        env["VKIT_SERVE_FLAGS"] = json.dumps(flags)
        env["VKIT_SERVE_FLAGS_FILE"] = flags_file
        argv = list(hook)
    else:
        argv = serve_argv(launch, config)
        if not argv:
            raise UsageError("the state file has no launch argv; run `state init ... -- SERVE ARGV...`")
    logf = open(log_path, "ab", buffering=0)
    try:
        proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, close_fds=True, **_OWN_GROUP)
    except FileNotFoundError:
        raise UsageError(f"cannot start the server: {argv[0]}: command not found") from None
    except PermissionError:
        raise UsageError(f"cannot start the server: {argv[0]}: permission denied") from None
    finally:
        logf.close()
    return Running(pid=proc.pid, pgid=proc.pid, ticks=proc_start_ticks(proc.pid), log=log_path, argv=argv,
                   started=time.time(), proc=proc, hook=mode == "hooks")


def stop(run: dict | Running | None, launch: dict | None = None, grace_s: float = 15.0) -> str:
    """SIGTERM the process group, SIGKILL after ``grace_s``. Returns what was done."""
    if run is None:
        return "nothing recorded to stop"
    r = run.as_state() if isinstance(run, Running) else run
    proc = run.proc if isinstance(run, Running) else None
    if launch and launch.get("mode") == "hooks" and launch.get("stop_hook"):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(list(launch["stop_hook"]), timeout=grace_s + 30, check=False,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid, pgid, ticks = r.get("pid"), r.get("pgid"), r.get("ticks")
    if not pid or not alive(pid, ticks):
        _reap(proc)
        return f"pid {pid} was not running"
    try:
        os.killpg(pgid or pid, signal.SIGTERM)
    except ProcessLookupError:
        return f"pid {pid} was not running"
    deadline = time.time() + grace_s
    while time.time() < deadline:
        _reap(proc)
        if not alive(pid, ticks) and not _group_alive(pgid or pid):
            return f"stopped pid {pid} with SIGTERM"
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid or pid, signal.SIGKILL)
    for _ in range(50):
        _reap(proc)
        if not alive(pid, ticks):
            break
        time.sleep(0.1)
    return f"killed pid {pid} with SIGKILL after {grace_s:g} s"


# The server gets its own process group (stop = signal to the group; Ctrl-C at the terminal does not
# reach it) but stays in the caller's session. A new session (setsid) would also put it in its own
# scheduler autogroup, where `nice` no longer ranks it below the load generator: measured against
# real vLLM on 2 cores, bench_stream's p99 scheduling lag was 107-452 ms (max 974 ms) with the
# server in its own session and 0.4-1.0 ms in the same session, `nice -n 10` in both.
_OWN_GROUP: dict = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}


def _reap(proc: subprocess.Popen | None) -> None:
    if proc is not None:
        with contextlib.suppress(Exception):
            proc.poll()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # members may all be zombies of ours
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat", encoding="utf-8") as f:
                    data = f.read()
                rest = data[data.rindex(")") + 2 :].split()
                if int(rest[2]) == pgid and rest[0] not in ("Z", "X"):
                    return True
            except (OSError, ValueError, IndexError):
                continue
    return False


def tail(path: str, n: int = 200) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return data.splitlines()[-n:]


# Known start-up failures: (regex over the log, kind, what to do). The diagnosis quotes vLLM's own line.
DIAGNOSES: list[tuple[re.Pattern, str, str]] = [
    (re.compile(r"estimated maximum model length is (\d+)"), "kv_cache_too_small",
     "lower --max-model-len to at most the estimate, or raise --gpu-memory-utilization"),
    (re.compile(r"larger than the maximum number of tokens that can be stored in KV cache"), "kv_cache_too_small",
     "lower --max-model-len or raise --gpu-memory-utilization"),
    (re.compile(r"No available memory for the cache blocks"), "no_kv_memory", "raise --gpu-memory-utilization or use a smaller model"),
    (re.compile(r"max_num_batched_tokens \(\d+\) is smaller than max_model_len \(\d+\)"), "batched_tokens_lt_max_model_len",
     "raise --max-num-batched-tokens to at least --max-model-len, or enable chunked prefill"),
    (re.compile(r"max_num_batched_tokens \(\d+\) must be greater than or equal to max_num_seqs \(\d+\)"),
     "batched_tokens_lt_max_num_seqs", "raise --max-num-batched-tokens or lower --max-num-seqs"),
    (re.compile(r"is greater than the derived max_model_len"), "max_model_len_above_model",
     "lower --max-model-len to the model's maximum (or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 if you know why)"),
    (re.compile(r"Free memory on device .* is less than desired GPU memory utilization"), "gpu_memory_taken",
     "another process holds accelerator memory: free it or lower --gpu-memory-utilization"),
    (re.compile(r"(CUDA out of memory|OutOfMemoryError|Failed to load model - not enough GPU memory)"), "oom",
     "lower --gpu-memory-utilization, --max-num-seqs or --max-num-batched-tokens"),
    (re.compile(r"(Address already in use|address already in use)"), "port_in_use",
     "another process listens on the port: stop it or change --port in the launch argv"),
    (re.compile(r"error: (argument|unrecognized arguments)"), "bad_argument", "fix the flag or its value"),
    (re.compile(r"Concurrent Partial Prefill is not supported"), "unsupported", "leave --max-num-partial-prefills at 1"),
]


def _quote(line: str, at: int, width: int = 420) -> str:
    """vLLM's own words around a match: from the start of the message that holds it
    (after the last ``Error: ``-style prefix) when that is near, else a little before it."""
    line = line.strip()
    colon = line.rfind(": ", 0, at)
    start = colon + 2 if colon >= 0 and at - colon <= 400 else max(0, at - 120)
    text = line[start : start + width]
    return text + ("…" if start + width < len(line) else "")


def diagnose(lines: list[str]) -> dict:
    """The known failure in the log: kind, vLLM's own line, and what to do.

    Patterns are tried in order of precedence over the whole log, so a warning that merely
    mentions a condition (e.g. a long max-model-len allowed by VLLM_ALLOW_LONG_MAX_MODEL_LEN)
    does not mask the error that followed it; warnings count only when no error matched."""
    errors = [ln for ln in lines if " WARNING " not in ln]
    for pool in (errors, lines):
        for rx, kind, advice in DIAGNOSES:
            for line in pool:
                mo = rx.search(line)
                if mo:
                    out = {"kind": kind, "quote": _quote(line, mo.start()), "advice": advice}
                    m = re.search(r"estimated maximum model length is (\d+)", line)
                    if m:
                        out["estimated_max_model_len"] = int(m.group(1))
                    return out
    errs = [ln.strip() for ln in lines if re.search(r"(Error|error:|Exception|Traceback)", ln)]
    last = errs[-1] if errs else (lines[-1].strip() if lines else "(empty log)")
    return {"kind": "unknown", "quote": last[-400:], "advice": "read the server log"}


_KV = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
_CONC = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
_MML = re.compile(r"Using max model len (\d+)")


def startup_facts(lines: list[str]) -> dict:
    out: dict = {}
    for line in lines:
        if m := _KV.search(line):
            out["kv_cache_tokens"] = int(m.group(1).replace(",", ""))
        if m := _CONC.search(line):
            out["max_concurrency_tokens_per_request"] = int(m.group(1).replace(",", ""))
            out["max_concurrency"] = float(m.group(2))
        if m := _MML.search(line):
            out["max_model_len"] = int(m.group(1))
    return out


@dataclass
class ReadyResult:
    ok: bool
    seconds: float
    why: str = ""
    diagnosis: dict | None = None
    exit_code: int | None = None


def wait_ready(url: str, run: Running, timeout_s: float, poll_s: float = 0.5,
               on_wait: Callable[[float], None] | None = None, stop_flag: Callable[[], bool] | None = None) -> ReadyResult:
    """Poll /health until 200 while watching the process: a dead process is noticed at once
    and its log diagnosed; no 200 within ``timeout_s`` is a failure too."""
    t0 = time.time()
    sess = requests.Session()
    last_report = t0
    while True:
        el = time.time() - t0
        if not run.is_alive():
            code = run.exit_code()
            d = diagnose(tail(run.log))
            return ReadyResult(False, el, f"the server exited during start-up (exit {code}): {d['quote']}", d, code)
        try:
            r = sess.get(url.rstrip("/") + "/health", timeout=min(5.0, max(1.0, poll_s * 4)))
            if r.status_code == 200:
                return ReadyResult(True, el)
        except requests.RequestException:
            pass
        if el >= timeout_s:
            last = (tail(run.log, 1) or ["(empty log)"])[0].strip()
            return ReadyResult(False, el, f"/health did not answer 200 within {timeout_s:g} s",
                               {"kind": "ready_timeout", "quote": f"no error in the server log; its last line: {last[-200:]}",
                                "advice": "raise --ready-timeout if the model loads slowly, else read the server log"})
        if stop_flag and stop_flag():
            return ReadyResult(False, el, "interrupted")
        if on_wait and time.time() - last_report >= 10:
            last_report = time.time()
            on_wait(el)
        time.sleep(poll_s)
