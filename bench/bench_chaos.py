#!/usr/bin/env python3
"""Chaos: seeded whole tunes on the simulator with faults at random moments (issue 20).

`make drill` injects six faults, each at one chosen moment. Here every tune draws its faults from
the whole matrix and their moments at random (seeded), then runs the same `bin/tune` command again
until the tune finishes or declares ABNORMAL:

- in the server, through the simulator's fault plan (``--sim-fault-plan``: fault flags given to
  chosen start numbers of ``--sim-start-file``, so a fault lands on whatever that start serves: the
  baseline, a candidate, a confirmation arm, a rollback): a crash mid-benchmark, a start failure, a
  health hang, a stalled stream, a burst of HTTP 5xx, a malformed SSE event;
- from outside, one per run of the command: the server killed between two runs, vkit killed with
  SIGKILL or SIGTERM mid-restart, mid-run, mid-gate or mid-state-write, a second tuner racing for the
  lease, the state directory filling up (``$VKIT_TEST_ENOSPC_FILE``, the test hook of vkit.state's
  atomic write: while the file exists every state write fails with ENOSPC; removed before the rerun).

After every run of the command (so after every fault) and at the end, the invariants are checked and
counted: the server on the last kept configuration or ABNORMAL declared with its reason (once vkit is
at rest); the state file and decision log parse and agree; no finished trial record lost or
duplicated; every kept configuration traces to a gate decision on valid runs; no run with a failed
request or an invalid gauge in a verdict; the recommendation equal to a fault-free tune's with the
same seed, or the difference explained by a trial the faults made invalid. In the same run, security:
every tune measures a dataset whose prompts hold shell metacharacters and a newline (the server's
prompt token counts must be those of the literal text), passes its API key through
``--api-key-env`` (the key must appear in no file under the state directory), and the first
finished tune's service gets a candidate whose ``--set`` value holds the same (it must reach the
server process as one literal argv item, no shell run).

Writes bench/results/chaos.json. Run: python3 bench/bench_chaos.py --tunes 30 --seed 1 (about two
minutes a tune on 2 cores: a fault-free reference tune and the faulted one). Progress and an ETA
on stderr. Exit 0 when every invariant holds in every tune, 1 otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.harness import free_port, revision, write_result  # noqa: E402  (ROOT is on the path: a script here, bench.bench_chaos in tests/test_chaos.py)
from vkit.apply import launcher  # noqa: E402
from vkit.apply.lifecycle import expectations  # noqa: E402
from vkit.apply.policy import Policy  # noqa: E402
from vkit.apply.verify import verify  # noqa: E402
from vkit.errors import VkitError  # noqa: E402
from vkit.jsonio import read_json_lines  # noqa: E402
from vkit.sim.tokenizer import Tokenizer  # noqa: E402
from vkit.state import ENOSPC_HOOK, StateFile  # noqa: E402
from vkit.validate.invariants.verdict import check_file  # noqa: E402

OUT = os.path.join(ROOT, "bench", "results", "chaos.json")
PY, B = sys.executable, os.path.join(ROOT, "bin")
FIN = ("done", "eliminated", "start_failed", "invalid", "skipped")
KEPT0 = {"max_num_seqs": 4, "max_num_batched_tokens": 2048}
KEY_ENV = "VKIT_CHAOS_API_KEY"
# shell metacharacters, a command substitution that would leave a trace, and a newline
EVIL = "; rm -rf x $(id) `x` |& $(touch {canary}) \n; touch {canary}"
VOCAB = 128256  # llama-3.1-8b, the simulated model
TUNE = ["--sandbox", "--objective", "throughput", "--concurrency", "16", "--input-len", "256", "--output-len", "64",
        "--num-prompts", "100", "--baseline-repeats", "3", "--screen-repeats", "1", "--ready-timeout", "10",
        "--stall-timeout", "2", "--slo", "p95_ttft_ms=5000", "--steps", "3", "--budget", "2",
        "--guard", "p95_ttft_ms:-:50%", "--confirm-front", "0", "--api-key-env", KEY_ENV, "--json"]
EPISODE_TIMEOUT_S = 420
MAX_EPISODES = 10

# server faults: the simulator flags a planned start gets (weights: how often each is drawn)
SIM_FAULTS = {
    "crash_mid_benchmark": (2, lambda r: ["--sim-crash-after", str(r.randint(5, 90))]),
    "start_failure": (1, lambda r: ["--sim-fail-at-start"]),
    "health_hang": (1, lambda r: ["--sim-hang-health"]),
    "stalled_stream": (2, lambda r: ["--sim-stall-stream-after", str(r.randint(1, 40))]),
    "http_5xx_burst": (2, lambda r: ["--sim-error-burst", f"{r.randint(0, 90)}:{r.randint(1, 8)}"]),
    "malformed_sse": (2, lambda r: ["--sim-malformed-sse-after", str(r.randint(0, 90))]),
}
# evidence in the server log that a planned fault happened (not only that it was planned)
SIM_FIRED = {
    "crash_mid_benchmark": "EngineDeadError",
    "start_failure": "EngineCore failed to start",
    "health_hang": "fault plan: start",
    "stalled_stream": '"POST /v1/',
    "http_5xx_burst": "simulated 5xx burst",
    "malformed_sse": "simulated malformed SSE event",
}
OUTSIDE_FAULTS = ("server_killed", "vkit_sigkill", "vkit_sigterm", "lease_race", "enospc")
NONFATAL = ("server_killed", "lease_race")  # the command goes on after these: the next fault hits the same run
KILL_MOMENTS = ("restart", "run", "gate", "state_write")
INVARIANTS = ("server_on_kept", "state_and_log", "records", "kept_traces_to_gate", "verdict_runs_valid", "recommendation")
SECURITY = ("argv_literal", "prompt_literal", "api_key_absent", "no_shell_ran")


# -- reading a tune's state ------------------------------------------------------------------------
def load(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def events_of(state_path: str) -> list[dict]:
    """The decision log, strictly: any line but a torn last one that is not JSON raises ValueError."""
    p = os.path.join(os.path.dirname(state_path), "decisions.jsonl")
    return [v for _, v in read_json_lines(p)] if os.path.exists(p) else []


def wait_state(path: str, proc: subprocess.Popen, cond, timeout: float, poll: float = 0.05) -> dict | None:
    """Poll the state file until ``cond(state)``; None when ``proc`` ends first or time runs out."""
    end = time.time() + timeout
    while time.time() < end and proc.poll() is None:
        s = load(path)
        try:
            if s is not None and cond(s):
                return s
        except (KeyError, TypeError, AttributeError):
            pass
        time.sleep(poll)
    return None


# -- the invariants (each returns a list of problems; empty: it holds) ------------------------------
class RunCheck:
    """Whether a recorded run may enter a verdict: no failed request, check_invariants not INVALID."""

    def __init__(self, base: str):
        self.base, self.seen = base, {}

    def problem(self, rel: str) -> str | None:
        if rel not in self.seen:
            p = os.path.join(self.base, rel)
            doc = load(p)
            if doc is None:
                self.seen[rel] = f"{rel}: missing or unreadable"
            elif doc.get("failed"):
                self.seen[rel] = f"{rel}: {doc['failed']} failed request(s)"
            else:
                rec = p[:-5] + ".jsonl"
                try:
                    c = check_file(p, records=rec if os.path.exists(rec) else None)
                    self.seen[rel] = f"{rel}: check_invariants {c.verdict} ({', '.join(c.findings)})" if c.verdict == "invalid" else None
                except VkitError as e:
                    self.seen[rel] = f"{rel}: {e}"
        return self.seen[rel]


def check_state_and_log(st: dict, ev: list[dict]) -> list[str]:
    """Every trial has its propose (or skip) event and every proposal its trial; the kept configuration,
    the kept trials and ABNORMAL are the log's keep and abnormal events."""
    bad, by_id = [], {e.get("id"): e for e in ev}
    logged = {e.get("trial") for e in ev if e.get("event") in ("propose", "skip")}
    ids = [t["id"] for t in st["trials"]]
    bad += [f"trial {t} has no propose/skip event" for t in ids if t not in logged]
    bad += [f"proposal {t} has no trial in the state" for t in sorted(x for x in logged if x) if t not in ids]
    kept = st["kept"]
    keeps = [e for e in ev if e.get("event") == "keep"]
    e = by_id.get(kept.get("decision_id")) or {}
    # the kept configuration comes from `state init` (its init event) or from a keep
    if (e.get("event"), e.get("kept") if e.get("event") == "init" else e.get("config")) not in (("init", kept["config"]), ("keep", kept["config"])):
        bad.append(f"kept.decision_id {kept.get('decision_id')} is not the init or keep event of the kept configuration")
    elif e.get("event") == "init" and keeps:
        bad.append(f"{len(keeps)} keep event(s) but the state's kept configuration is still the initial one")
    if keeps and keeps[-1].get("config") != kept["config"]:
        bad.append("the last keep event's configuration is not the state's kept configuration")
    for t in st["trials"]:
        if t.get("kept") and (by_id.get(t.get("decision_id")) or {}).get("event") != "keep":
            bad.append(f"trial {t['id']} is marked kept without a keep event")
    ab = st.get("abnormal") or {}
    if ab.get("flag"):
        e = by_id.get(ab.get("decision_id")) or {}
        if e.get("event") != "abnormal" or e.get("reason") != ab.get("reason"):
            bad.append("ABNORMAL in the state has no matching abnormal event")
    return bad


def check_records(before: dict | None, after: dict) -> list[str]:
    """No finished trial lost or changed, none twice; no run recorded twice; the baseline's runs kept in order."""
    bad = []
    ids = [t["id"] for t in after["trials"]]
    bad += [f"trial id {i} twice" for i in sorted({i for i in ids if ids.count(i) > 1})]
    measured = [json.dumps(t["config"], sort_keys=True) for t in after["trials"] if t["status"] in ("done", "eliminated")]
    bad += [f"configuration measured by two finished trials: {c}" for c in sorted({c for c in measured if measured.count(c) > 1})]
    runs = [p for t in after["trials"] for p in t.get("runs") or []]
    bad += [f"run {p} in two places" for p in sorted({p for p in runs if runs.count(p) > 1})]
    if before:
        now = {t["id"]: t for t in after["trials"]}
        for t in before["trials"]:
            if t["status"] not in FIN:
                continue
            a = now.get(t["id"])
            if a is None:
                bad.append(f"finished trial {t['id']} lost")
            elif any(a.get(k) != t.get(k) for k in ("status", "runs", "verdict", "config")):
                bad.append(f"finished trial {t['id']} changed ({t['status']} -> {a['status']})")
        b0, b1 = before.get("baseline") or {}, after.get("baseline") or {}
        if b0.get("generation") == b1.get("generation") and b0.get("runs") and b1.get("runs", [])[:len(b0["runs"])] != b0["runs"]:
            bad.append("the baseline's recorded runs changed")
    return bad


def check_kept_traces(st: dict, ev: list[dict], runs: RunCheck) -> list[str]:
    """The kept configuration is the initial one, or a gate's accept on fresh runs that may enter a verdict."""
    kept = st["kept"]
    if kept["config"] == KEPT0 and not any(x.get("event") == "keep" for x in ev):
        return []
    confs = {c.get("decision_id"): c for c in st.get("confirmations") or [] if c.get("decision_id")}
    bad = []
    for e in (x for x in ev if x.get("event") == "keep"):
        c = confs.get(e["id"])
        if c is None or c.get("decision") != "kept":
            bad.append(f"keep {e['id']} traces to no confirmation the gate accepted")
            continue
        bad += [f"keep {e['id']}: {p}" for p in (runs.problem(r) for r in c.get("a_runs", []) + c.get("b_runs", [])) if p]
    return bad


def check_verdict_runs(st: dict, runs: RunCheck) -> list[str]:
    """Every run behind a verdict (the baseline, a screened trial, a decided confirmation) may enter one."""
    used = list((st.get("baseline") or {}).get("runs") or [])
    used += [p for t in st["trials"] if t.get("verdict") not in (None, "invalid") for p in t.get("runs") or []]
    used += [p for c in st.get("confirmations") or [] if c.get("decision") in ("accept", "reject", "kept", "undecided")
             for p in c.get("a_runs", []) + c.get("b_runs", [])]
    return [p for p in (runs.problem(r) for r in dict.fromkeys(used)) if p]


def check_server(st: dict, api_key: str | None = None) -> list[str]:
    """The server runs the kept configuration and passes post_start_verify, or ABNORMAL is declared with its reason."""
    ab = st.get("abnormal") or {}
    if ab.get("flag"):
        return [] if ab.get("reason") else ["ABNORMAL declared without a reason"]
    run, kept = st["service"].get("running") or {}, st["kept"]["config"]
    if run.get("config") != kept:
        return [f"the server runs {run.get('config')}, not the kept {kept}"]
    if not launcher.alive(run.get("pid"), run.get("ticks")):
        return [f"the kept server (pid {run.get('pid')}) is dead"]
    v = verify(st["service"]["url"], st["service"]["model"], expectations(kept), timeout_s=10, api_key=api_key)
    return [] if v.ok else [f"post_start_verify: {v.summary_line()}"]


def rec_config(ev: list[dict]) -> dict | None:
    conv = [e for e in ev if e.get("event") == "converge"]
    rec = (conv[-1].get("recommendation") if conv else None) or {}
    return rec.get("config") if isinstance(rec, dict) else None


def lost_trials(st: dict | None) -> dict[str, str]:
    """The configurations a tune lost: its trials (or their confirmations) invalid or failed to start, by config."""
    st = st or {}
    trials = st.get("trials") or []
    lost = {json.dumps(t["config"], sort_keys=True): t["id"] for t in trials
            if t["status"] in ("invalid", "start_failed") or t.get("verdict") == "invalid"}
    lost.update({json.dumps(next(t["config"] for t in trials if t["id"] == c["trial_id"]), sort_keys=True): c["trial_id"]
                 for c in st.get("confirmations") or [] if c.get("decision") in ("invalid", "start_failed")})
    return lost


def done_trials(st: dict | None) -> set[str]:
    """The configurations a tune measured to a verdict (trials done), as :func:`lost_trials` keys them."""
    return {json.dumps(t["config"], sort_keys=True) for t in (st or {}).get("trials", []) if t["status"] == "done"}


def check_recommendation(ref: dict | None, got: dict | None, st: dict, ref_st: dict | None) -> list[str]:
    """The recommendation a fault-free tune with the same seed gave, or a lost trial explains the difference: one
    the faults made invalid that the reference finished, or one the reference itself lost (a run on a loaded
    machine can time out with no fault injected) that the faulted tune finished."""
    if ref == got:
        return []
    if lost_trials(st).keys() & done_trials(ref_st) or lost_trials(ref_st).keys() & done_trials(st):
        return []
    seen = "; ".join(f"{t['id']} {t['config']} {t['status']}/{t.get('verdict')}" for t in (ref_st or {}).get("trials", []))
    return [f"recommendation {got} differs from the fault-free {ref} with no trial made invalid by a fault "
            f"(the reference's trials: {seen or 'none'})"]


# -- one tune ----------------------------------------------------------------------------------------

def write_inputs(work: str) -> tuple[str, str, str, list[str]]:
    """The site policy (shipped table plus a string parameter the security check sets), the dataset of
    hostile prompts, the canary the shell would create, and the hostile prompts."""
    canary = os.path.join(work, "CANARY-shell-ran")
    evil = EVIL.format(canary=canary)
    d = json.loads(json.dumps(Policy.load().data))
    d["situational"].append({"id": "S1", "param": "generation_config", "type": "choice", "choices": [evil], "step": 9,
                             "why": "chaos: a value with shell metacharacters must reach the server as one argv item"})
    policy = os.path.join(work, "policy.json")
    with open(policy, "w", encoding="utf-8") as f:
        json.dump(d, f)
    words = "the quick brown fox jumps over a lazy dog while seven tired engineers read the server log again".split()
    prompts = [f"{evil} row {i}: " + " ".join(words[(i + j) % len(words)] for j in range(150 + 7 * i)) for i in range(8)]
    dataset = os.path.join(work, "prompts.jsonl")
    with open(dataset, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"prompt": p}) + "\n" for p in prompts)
    return policy, dataset, canary, prompts


class Tune:
    """One seeded tune: its directory, state, simulator command and tune command."""

    def __init__(self, work: str, name: str, seed: int, policy: str, dataset: str, plan: dict | None):
        self.dir = os.path.join(work, name)
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.state = os.path.join(self.dir, "vkit.json")
        self.enospc = os.path.join(self.dir, "disk-full")
        self.key = f"sk-chaos-{random.Random(seed * 7919 + len(name)).getrandbits(64):016x}"
        self.policy, self.n = policy, 0
        self.args = [*TUNE, "--dataset-path", dataset]
        port = free_port()
        sim = [PY, os.path.join(B, "sim_server"), "sim-8b", "--port", str(port), "--sim-speed", "8", "--sim-startup-s", "0.2",
               "--sim-seed", str(seed), "--max-model-len", "4096", "--sim-start-file", os.path.join(self.dir, "sim-starts")]
        if plan:
            path = os.path.join(self.dir, "fault-plan.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(plan, f)
            sim += ["--sim-fault-plan", path]
        sets = [a for k, v in KEPT0.items() for a in ("--set", f"{k}={v}")]
        subprocess.run([PY, os.path.join(B, "state"), "--state", self.state, "init", "--url", f"http://127.0.0.1:{port}",
                        "--model", "sim-8b", *sets, "--", *sim], check=True, capture_output=True, env=self.env())

    def env(self) -> dict:
        e = {k: v for k, v in os.environ.items() if k not in ("VKIT_STATE", "VKIT_LEASE_OWNER")}
        return dict(e, VKIT_STATE=self.state, VKIT_POLICY=self.policy, **{KEY_ENV: self.key, ENOSPC_HOOK: self.enospc})

    def start(self) -> tuple[subprocess.Popen, str]:
        self.n += 1
        base = os.path.join(self.dir, f"episode-{self.n}")
        with open(base + ".out", "w") as out, open(base + ".err", "w") as err:
            p = subprocess.Popen([PY, os.path.join(B, "tune"), *self.args], env=self.env(), stdout=out, stderr=err, cwd=ROOT)
        return p, base

    def stop_servers(self) -> None:
        st = load(self.state) or {}
        run = (st.get("service") or {}).get("running")
        if run:
            launcher.stop(run, st["service"].get("launch"), grace_s=5)
        launcher.stop_tagged(launcher.tag_for(self.dir), grace_s=5)


# -- faults from outside -----------------------------------------------------------------------------
def inject(t: Tune, p: subprocess.Popen, kind: str, r: random.Random) -> dict | None:
    """Inject ``kind`` into the tune command ``p`` runs; the fault as it happened, or None if the command ended first."""
    s0 = load(t.state) or {}
    n0 = len(s0.get("run_starts") or {})
    if kind == "server_killed":
        target = n0 + r.randint(1, 4)
        s = wait_state(t.state, p, lambda s: len(s.get("run_starts") or {}) >= target, 300)
        run = (s or {}).get("service", {}).get("running") or {}
        if not s or not launcher.alive(run.get("pid"), run.get("ticks")):
            return None
        os.kill(run["pid"], signal.SIGKILL)
        return {"kind": kind, "moment": f"after run {target}", "detail": f"SIGKILL to the {run.get('role')} server pid {run['pid']}"}
    if kind in ("vkit_sigkill", "vkit_sigterm"):
        moment = r.choice(KILL_MOMENTS)
        if not wait_for_moment(t, p, moment, n0, r):
            return None
        sig = signal.SIGKILL if kind == "vkit_sigkill" else signal.SIGTERM
        p.send_signal(sig)
        return {"kind": kind, "moment": moment, "detail": f"{sig.name} to bin/tune pid {p.pid} mid-{moment}"}
    if kind == "lease_race":
        return lease_race(t, p)
    if kind == "enospc":
        end = time.time() + r.uniform(1, 20)
        while time.time() < end and p.poll() is None:
            time.sleep(0.1)
        if p.poll() is not None:
            return None
        open(t.enospc, "w").close()
        return {"kind": kind, "moment": f"{time.time() - (os.path.getmtime(t.state)):.1f} s after the last state write",
                "detail": f"every state write fails with ENOSPC ({ENOSPC_HOOK})"}
    raise ValueError(kind)


def wait_for_moment(t: Tune, p: subprocess.Popen, moment: str, n0: int, r: random.Random) -> bool:
    if moment == "restart":  # a restart under way: the candidate recorded as applying, its server starting
        ok = wait_state(t.state, p, lambda s: (s.get("candidate") or {}).get("status") == "applying"
                        and s["candidate"].get("owner_pid") == p.pid, 300, poll=0.01)
        time.sleep(r.uniform(0, 0.3))
        return ok is not None and p.poll() is None
    if moment == "run":  # a trial in the middle of its benchmark
        ok = wait_state(t.state, p, lambda s: any(x["status"] == "applied" for x in s["trials"]), 300)
        time.sleep(r.uniform(0.2, 2.0))
        return ok is not None and p.poll() is None
    if moment == "gate":  # a run just recorded: the gate (or the next decision) is being computed
        target = n0 + r.randint(2, 6)
        return wait_state(t.state, p, lambda s: len(s.get("run_starts") or {}) >= target, 300, poll=0.02) is not None
    # a state write under way: its temp file beside the state exists
    end, skip = time.time() + 120, r.randint(0, 30)
    while time.time() < end and p.poll() is None:
        if any(f.startswith(".vkit.json.") and f.endswith(".tmp") for f in os.listdir(t.dir)):
            if skip == 0:
                return True
            skip -= 1
            time.sleep(0.02)
        time.sleep(0.002)
    return False


def lease_race(t: Tune, p: subprocess.Popen) -> dict | None:
    s = wait_state(t.state, p, lambda s: (s.get("lease") or {}).get("pid") == p.pid, 120)
    if s is None:
        return None
    n_ev = len(events_of(t.state))
    q = subprocess.run([PY, os.path.join(B, "tune"), *t.args], env=t.env(), capture_output=True, text=True, timeout=120, cwd=ROOT)
    after = events_of(t.state)[n_ev:]
    holder = s["lease"]["owner"]
    traces = [e["event"] for e in after if e.get("event") in ("lease_broken", "break_lease")
              or (e.get("owner") and e.get("owner") != holder) or (e.get("by") and e.get("by") != holder)]
    ok = q.returncode == 4 and holder in q.stderr and not traces
    if not ok and p.poll() is not None and not any(e == "lease_broken" for e in traces):
        # the holder ended (finished, or declared ABNORMAL) before the second tune asked for the lease: the second
        # ran after it, not against it; no race took place, and none is counted
        return None
    return {"kind": "lease_race", "moment": f"while {holder} held the lease",
            "detail": f"second tune exit {q.returncode}" + (f"; traces: {traces}" if traces else "; wrote nothing"),
            "reaction": {"pass": ok, "detail": q.stderr.strip().splitlines()[-1][:200] if q.stderr.strip() else ""}}


# -- security ----------------------------------------------------------------------------------------
def check_key_absent(t: Tune) -> list[str]:
    key = t.key.encode()
    bad = []
    for d, _, files in os.walk(t.dir):
        for f in files:
            try:
                with open(os.path.join(d, f), "rb") as fh:
                    if key in fh.read():
                        bad.append(os.path.relpath(os.path.join(d, f), t.dir))
            except OSError:
                pass
    return [f"the API key appears in {', '.join(bad[:5])}"] if bad else []


def check_prompts(t: Tune, prompts: list[str]) -> tuple[list[str], int]:
    """Every answered request's prompt token count is that of the literal hostile prompt."""
    tok = Tokenizer(VOCAB)
    want = [len(tok.encode(p)) for p in prompts]
    bad, n = [], 0
    for rec in glob.glob(os.path.join(t.dir, "runs", "**", "*.jsonl"), recursive=True):
        for _, r in read_json_lines(rec, skip_bad=True):
            if r.get("prompt_tokens") is None or r.get("warmup"):
                continue
            n += 1
            if r["prompt_tokens"] != want[r["i"] % len(want)]:
                bad.append(f"{os.path.relpath(rec, t.dir)} request {r['i']}: {r['prompt_tokens']} prompt tokens, "
                           f"the literal text has {want[r['i'] % len(want)]}")
    return (bad[:3] if bad else ([] if n else ["no answered request to check"])), n


def check_argv(t: Tune, canary: str) -> list[str]:
    """A candidate whose --set value holds shell metacharacters and a newline: one literal argv item in the server."""
    evil = EVIL.format(canary=canary)
    env = t.env()
    q = subprocess.run([PY, os.path.join(B, "restart_with_rollback"), "--sandbox", "--json", "--ready-timeout", "10",
                        "--set", f"generation_config={evil}"], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    run = ((load(t.state) or {}).get("service") or {}).get("running") or {}
    bad = []
    try:
        with open(f"/proc/{run.get('pid')}/cmdline", "rb") as f:
            argv = f.read().decode().split("\0")
        if evil not in argv or argv[argv.index(evil) - 1] != "--generation-config":
            bad.append(f"the value is not one argv item after --generation-config: {argv[-4:]}")
    except (OSError, ValueError) as e:
        bad.append(f"restart_with_rollback exit {q.returncode}; cannot read the candidate's argv ({e})")
    r = subprocess.run([PY, os.path.join(B, "rollback"), "--reason", "chaos: security candidate done", "--ready-timeout", "10", "-q"],
                       env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    if r.returncode != 0:
        bad.append(f"rollback after the security candidate: exit {r.returncode}: {r.stderr.strip()[-200:]}")
    return bad


# -- driving ----------------------------------------------------------------------------------------
class Tally:
    def __init__(self):
        self.inv = {k: [0, 0] for k in INVARIANTS}
        self.sec = {k: [0, 0] for k in SECURITY}
        self.reaction = [0, 0]
        self.failures: list[str] = []

    def count(self, table: dict, name: str, problems: list[str], where: str) -> dict:
        table[name][1] += 1
        table[name][0] += not problems
        if problems:
            self.failures.append(f"{where}: {name}: {'; '.join(problems[:3])}")
        return {"name": name, "pass": not problems, "problems": problems[:3]}


def after_episode(t: Tune, before: dict | None, tally: Tally, where: str, at_rest: bool) -> tuple[dict | None, list[dict]]:
    """The invariants after one run of the command (the server's only once vkit is at rest)."""
    out = []
    try:
        st = StateFile(t.state).read()
        ev = events_of(t.state)
        parse = []
    except (VkitError, ValueError, OSError) as e:
        st, ev, parse = None, [], [f"does not parse: {e}"]
    if st is None:
        out.append(tally.count(tally.inv, "state_and_log", parse, where))
        return None, out
    runs = RunCheck(t.dir)
    out.append(tally.count(tally.inv, "state_and_log", check_state_and_log(st, ev), where))
    out.append(tally.count(tally.inv, "records", check_records(before, st), where))
    out.append(tally.count(tally.inv, "kept_traces_to_gate", check_kept_traces(st, ev, runs), where))
    out.append(tally.count(tally.inv, "verdict_runs_valid", check_verdict_runs(st, runs), where))
    if at_rest:
        out.append(tally.count(tally.inv, "server_on_kept", check_server(st, t.key), where))
    return st, out


def sim_plan(r: random.Random, n: int, allowed: tuple[str, ...]) -> tuple[dict, dict]:
    kinds = [k for k, (w, _) in SIM_FAULTS.items() if k in allowed for _ in range(w)]
    if not kinds:
        return {}, {}
    starts = sorted(r.sample(range(2, 11), n))
    plan, kind_of = {}, {}
    for s in starts:
        k = r.choice(kinds)
        plan[str(s)], kind_of[str(s)] = SIM_FAULTS[k][1](r), k
    return plan, kind_of


def fired_sim_faults(t: Tune, kind_of: dict) -> list[dict]:
    out = []
    for log in sorted(glob.glob(os.path.join(t.dir, "logs", "*.log"))):
        with open(log, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for start, kind in kind_of.items():
            if f"fault plan: start {start} gets" in text and SIM_FIRED[kind] in text:
                line = next(x for x in text.splitlines() if f"fault plan: start {start} gets" in x)
                out.append({"kind": kind, "moment": f"server start {start} ({os.path.basename(log)})",
                            "detail": line.split("gets", 1)[1].strip()})
    return out


def reference(work: str, seed: int, policy: str, dataset: str) -> tuple[dict | None, dict | None, int]:
    t = Tune(work, f"ref-{seed}", seed, policy, dataset, None)
    p, _ = t.start()
    try:
        rc = p.wait(timeout=EPISODE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        if p.poll() is None:
            p.kill()
            rc = p.wait()
        t.stop_servers()
    st = load(t.state)
    try:
        rec = rec_config(events_of(t.state)) if rc == 0 else None
    except ValueError:
        rec = None
    return rec, st, rc


def one_tune(i: int, seed: int, work: str, policy: str, dataset: str, canary: str, prompts: list[str], tally: Tally,
             security_argv: bool, allowed: tuple[str, ...]) -> dict:
    r = random.Random(seed * 1000003 + 17)
    ref_rec, ref_st, ref_rc = reference(work, seed, policy, dataset)
    plan, kind_of = sim_plan(r, 5, allowed)
    out_kinds = [k for k in OUTSIDE_FAULTS if k in allowed]
    outside = [r.choice(out_kinds) for _ in range(4)] if out_kinds else []
    t = Tune(work, f"tune-{seed}", seed, policy, dataset, plan)
    row: dict = {"tune": i, "seed": seed, "sim_plan": plan, "faults": [], "episodes": [], "checks": []}
    before, st, rc, refused, live = None, None, None, None, []
    try:
        for _ in range(MAX_EPISODES):
            p, base = t.start()
            live.append(p)
            injected, kind, fault = [], None, None
            while outside and p.poll() is None:
                kind = outside.pop(0)
                fault = inject(t, p, kind, r)
                if fault:
                    injected.append(fault)
                    row["faults"].append(fault)
                if kind not in NONFATAL:
                    break  # the command ends (or is told to): the next fault goes to the rerun
            try:
                rc = p.wait(timeout=EPISODE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait()
                tally.failures.append(f"tune {seed} episode {t.n}: no end within {EPISODE_TIMEOUT_S} s")
            hit = os.path.exists(t.enospc + ".hit")  # a state write met the full disk
            for f in (t.enospc, t.enospc + ".hit"):
                if os.path.exists(f):
                    os.unlink(f)  # the space is back for the rerun
            with open(base + ".err", encoding="utf-8", errors="replace") as f:
                err = f.read()
            for fault in injected:
                kind = fault["kind"]
                fault["exit"] = rc
                if kind == "vkit_sigterm":
                    fault["reaction"] = {"pass": rc in (130, 0), "detail": f"exit {rc} (130: interrupted, the step under way finished safely)"}
                elif kind == "enospc" and not hit:  # the tune ended without another state write: nothing to react to
                    fault["fired"] = False
                    fault["detail"] += f"; no state write met it before the episode ended (exit {rc})"
                elif kind == "enospc":
                    ok = rc == 4 and "No space left on device" in err
                    fault["reaction"] = {"pass": ok, "detail": f"exit {rc}: " + (err.strip().splitlines() or [""])[-1][:200]}
                if "reaction" in fault:
                    tally.reaction[1] += 1
                    tally.reaction[0] += fault["reaction"]["pass"]
                    if not fault["reaction"]["pass"]:
                        tally.failures.append(f"tune {seed} {kind}: reaction: {fault['reaction']['detail']}")
            killed = rc == -signal.SIGKILL
            abnormal = bool(((load(t.state) or {}).get("abnormal") or {}).get("flag"))
            at_rest = rc == 0 or abnormal
            st, checks = after_episode(t, before, tally, f"tune {seed} episode {t.n}", at_rest and not killed)
            row["episodes"].append({"n": t.n, "outside_faults": [f["kind"] for f in injected], "exit": rc,
                                    "last_error": (err.strip().splitlines() or [""])[-1][:240], "checks": checks})
            before = st or before
            if rc == 0 or abnormal:
                break
            prev = row["episodes"][-2] if len(row["episodes"]) > 1 else None
            if not injected and prev and (prev["exit"], prev["last_error"]) == (rc, row["episodes"][-1]["last_error"]):
                refused = row["episodes"][-1]["last_error"]
                break  # the same refusal twice with no fault between: a documented stop, not progress
        row["faults"] += fired_sim_faults(t, kind_of)
        ab = ((st or {}).get("abnormal") or {})
        row["outcome"] = ("finished" if rc == 0 else "abnormal" if ab.get("flag") else "refused" if refused
                          else f"stopped (exit {rc})")
        row["abnormal_reason"], row["refusal"] = ab.get("reason"), refused
        if rc != 0 and not ab.get("flag") and not refused:
            tally.failures.append(f"tune {seed}: neither finished nor ABNORMAL after {t.n} runs (last exit {rc})")
        ev = events_of(t.state)
        w = f"tune {seed} end"
        if rc == 0 and ref_rc == 0:
            row["checks"].append(tally.count(tally.inv, "recommendation", check_recommendation(ref_rec, rec_config(ev), st, ref_st), w))
        row["recommendation"], row["reference_recommendation"] = (rec_config(ev) if rc == 0 else None), ref_rec
        if security_argv and rc == 0:
            row["checks"].append(tally.count(tally.sec, "argv_literal", check_argv(t, canary), w))
            _, checks = after_episode(t, before, tally, w + " (after the security candidate)", True)
            row["checks"] += checks
        bad, n = check_prompts(t, prompts)
        row["prompts_checked"] = n
        row["checks"].append(tally.count(tally.sec, "prompt_literal", bad, w))
        row["checks"].append(tally.count(tally.sec, "api_key_absent", check_key_absent(t), w))
        row["checks"].append(tally.count(tally.sec, "no_shell_ran", [f"{canary} exists"] if os.path.exists(canary) else [], w))
    finally:
        for q in live:
            if q.poll() is None:  # the harness itself was stopped: leave nothing running
                q.kill()
                q.wait()
        t.stop_servers()
    return row


def summary(rows: list[dict], tally: Tally) -> dict:
    kinds = {k: 0 for k in [*SIM_FAULTS, *OUTSIDE_FAULTS]}
    for r in rows:
        for f in r["faults"]:
            kinds[f["kind"]] += f.get("fired", True)
    why: dict[str, int] = {}
    for r in rows:
        if r["outcome"] == "abnormal":
            key = (r.get("abnormal_reason") or "").split(":")[0][:120]
            why[key] = why.get(key, 0) + 1
    refusals: dict[str, int] = {}
    for r in rows:
        if r["outcome"] == "refused":
            key = (r.get("refusal") or "").replace("tune: error: ", "").split(":")[0][:120]
            refusals[key] = refusals.get(key, 0) + 1
    inv = {k: {"passed": p, "total": n} for k, (p, n) in tally.inv.items()}
    sec = {k: {"passed": p, "total": n} for k, (p, n) in tally.sec.items()}
    return {"tunes": len(rows), "faults": sum(kinds.values()), "faults_by_kind": kinds,
            "invariants": inv, "invariant_checks": {"passed": sum(v["passed"] for v in inv.values()), "total": sum(v["total"] for v in inv.values())},
            "security": sec, "reactions": {"passed": tally.reaction[0], "total": tally.reaction[1]},
            "finished": sum(r["outcome"] == "finished" for r in rows), "abnormal": sum(r["outcome"] == "abnormal" for r in rows),
            "abnormal_why": why, "refused": sum(r["outcome"] == "refused" for r in rows), "refused_why": refusals,
            "stopped": sum(r["outcome"].startswith("stopped") for r in rows),
            "episodes": sum(len(r["episodes"]) for r in rows)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Seeded tunes on the simulator with faults at random moments; invariants counted.")
    ap.add_argument("--tunes", type=int, default=30, help="tunes (default 30)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the first tune; tune i uses seed + i (default 1)")
    ap.add_argument("--work", default=None, help="where the tunes' state goes (default: a temporary directory, removed)")
    ap.add_argument("--faults", default=",".join([*SIM_FAULTS, *OUTSIDE_FAULTS]), metavar="K,K",
                    help="the fault kinds to draw from (default: all)")
    ap.add_argument("-o", "--output", default=OUT, help=f"results JSON (default {os.path.relpath(OUT, ROOT)})")
    ap.add_argument("--table", action="store_true", help="print the results tables of --output as Markdown and exit")
    args = ap.parse_args(argv)
    if args.table:
        with open(args.output, encoding="utf-8") as f:
            print(markdown(json.load(f)), end="")
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(130))  # stopped: the tune under way and its servers end too
    allowed = tuple(k.strip() for k in args.faults.split(",") if k.strip())
    unknown = [k for k in allowed if k not in SIM_FAULTS and k not in OUTSIDE_FAULTS]
    if unknown:
        ap.error(f"unknown fault kind(s): {', '.join(unknown)}")
    work = os.path.abspath(args.work) if args.work else None
    tmp = work is None
    if tmp:
        import tempfile

        work = tempfile.mkdtemp(prefix="vkit-chaos-")
    os.makedirs(work, exist_ok=True)
    policy, dataset, canary, prompts = write_inputs(work)
    tally, rows, t0 = Tally(), [], time.time()
    try:
        for i in range(args.tunes):
            seed = args.seed + i
            argv_done = any(x["name"] == "argv_literal" for r in rows for x in r["checks"])
            row = one_tune(i, seed, work, policy, dataset, canary, prompts, tally, security_argv=not argv_done,
                           allowed=allowed)
            rows.append(row)
            el = time.time() - t0
            eta = el / (i + 1) * (args.tunes - i - 1)
            s = summary(rows, tally)
            print(f"chaos: tune {i + 1}/{args.tunes} (seed {seed}): {row['outcome']}, {len(row['faults'])} faults "
                  f"({', '.join(f['kind'] for f in row['faults'])}); invariants {s['invariant_checks']['passed']}/"
                  f"{s['invariant_checks']['total']}; {el / 60:.1f} min, ETA {eta / 60:.1f} min", file=sys.stderr, flush=True)
    finally:
        if tmp:
            shutil.rmtree(work, ignore_errors=True)
    s = summary(rows, tally)
    ok = not tally.failures and s["invariant_checks"]["passed"] == s["invariant_checks"]["total"]
    doc = {"schema": "vkit.chaos/1", "simulated": True, "passed": ok, "command": " ".join(["python3", "bench/bench_chaos.py", *(argv or sys.argv[1:])]),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "revision": revision(),
           "python": platform.python_version(), "cpus": os.cpu_count(), "seconds": round(time.time() - t0),
           "tune_args": TUNE, "summary": s, "failures": tally.failures, "tunes": rows}
    write_result(args.output, doc, "chaos")
    print(render(doc), file=sys.stderr)
    return 0 if ok else 1


def markdown(doc: dict) -> str:
    """The results tables of runbook/chaos.md and runbook/drill.md: ``python3 bench/bench_chaos.py --table``."""
    s = doc["summary"]
    out = [f"`{doc['command']}` — {doc['date'][:10]}, revision {doc['revision']}, {doc['cpus']} CPUs, "
           f"{doc['seconds'] / 60:.0f} min: {s['tunes']} tunes, {s['faults']} faults, {s['episodes']} runs of the tune command.", "",
           "| fault | injected |", "| --- | ---: |"]
    out += [f"| {k} | {v} |" for k, v in s["faults_by_kind"].items()] + [f"| **all** | **{s['faults']}** |", ""]
    out += ["| invariant | passed / total |", "| --- | ---: |"]
    out += [f"| {k} | {v['passed']} / {v['total']} |" for k, v in s["invariants"].items()]
    c = s["invariant_checks"]
    out += [f"| **all invariants** | **{c['passed']} / {c['total']}** |"]
    out += [f"| security: {k} | {v['passed']} / {v['total']} |" for k, v in s["security"].items()]
    out += [f"| reactions (lease race exit 4, ENOSPC exit 4, SIGTERM exit 130) | {s['reactions']['passed']} / {s['reactions']['total']} |", ""]
    out += ["| outcome | tunes | why |", "| --- | ---: | --- |", f"| finished | {s['finished']} | |"]
    out += [f"| ABNORMAL | {n} | {w} |" for w, n in s["abnormal_why"].items()]
    out += [f"| refused | {n} | {w} |" for w, n in s.get("refused_why", {}).items()]
    if s["stopped"]:
        out.append(f"| neither | {s['stopped']} | see `failures` |")
    return "\n".join(out) + "\n"


def render(doc: dict) -> str:
    s = doc["summary"]
    lines = [f"chaos: {s['tunes']} tunes, {s['faults']} faults, {doc['seconds']} s — {'PASS' if doc['passed'] else 'FAIL'}",
             "| fault | injected |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in s["faults_by_kind"].items()]
    lines += ["", "| invariant | passed / total |", "| --- | --- |"]
    lines += [f"| {k} | {v['passed']} / {v['total']} |" for k, v in s["invariants"].items()]
    lines += [f"| security: {k} | {v['passed']} / {v['total']} |" for k, v in s["security"].items()]
    lines += ["", f"finished {s['finished']}, ABNORMAL {s['abnormal']}, refused {s['refused']}, neither {s['stopped']}"]
    lines += [f"  ABNORMAL: {n}x {w}" for w, n in s["abnormal_why"].items()]
    lines += [f"  refused: {n}x {w}" for w, n in s["refused_why"].items()]
    lines += [f"  FAIL {x}" for x in doc["failures"][:30]]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
