#!/usr/bin/env python3
"""How often does the real `tune` keep a candidate that is truly no better, and how often one that
is truly 6 % better? Seeded tunes on two surfaces of the simulator, with its realistic noise (2 %
run to run on one process, 1.5 % more between server starts).

- flat: the simulated 8B on one H200 at 8 closed-loop streams of 128-token prompts and 32-token
  outputs, kept at 2048 batched tokens and 16 sequences. Step 2's candidates (4096, 8192, 16384
  batched tokens at 64 sequences) cannot change a step: at most 8 x 128 = 1,024 prompt tokens are
  ever scheduled at once and at most 8 sequences run, so every candidate is the kept
  configuration in all but its flags (``predict``: identical throughput).
- plus6: the same at 16 streams, kept at 14 sequences: every candidate (64 sequences) runs all 16.
  The true gain is the live simulator's own, its noise off, at the tunes' speed, client, workload
  and 100 prompts (``live_gain``, 3 runs of each measured in the same run: +5.1 % at e418775; +7.4 %
  at speed 1, ``live_gain_speed1``, where the client's turnaround weighs less). The virtual-time predictor's figure for
  the same client (every stream's first request at once, the whole run counted) is reported beside
  it (``true_gains``: +9.3 %). With 100 fixed-length prompts a gain at a queue's edge is set by how
  many waves of requests a run takes, so it moves by points from one surface to the next.
- plus10: 20 streams kept at 18 sequences, a larger true gain (live +13.1 % when measured); the
  surface was chosen, as plus6, by the predictor's steady state (a ramped start, the first 40
  requests left out: +6.0 %), which is not what a 100-prompt closed-loop run measures.
- plus8: 12 streams kept at 11 sequences: +7.6 % for the tunes' client in virtual time, the
  smallest gain of these surfaces there (plus6 reads +9.3 % in virtual time against +5.1 % live).

``--virtual`` runs the same tunes on the virtual backend (``tune --virtual``: the simulator's engine,
its noise and its restarts in virtual time, a few seconds a tune): hundreds of tunes where the live
path affords twenty; its true gain is ``true_gains`` (the live gain is not measured).

Each tune is ``bin/tune --sandbox --objective throughput --steps 2 --budget 3`` with the default
statistics (4 baseline repeats over three server starts; screening runs sized from σ's two parts, at
most 2; B A A B blocks planned by the sequential rule's power analysis at the measured σ, at most 4),
``--sim-seed`` = 1000 + i (``--confirm-blocks N`` passes tune a larger confirmation budget). A keep is a tune whose step 2 kept a candidate. Targets: on flat, at
most 5 % of tunes keep (the one-sided 95 % Clopper-Pearson upper bound is reported beside the
count); on plus6, at least 80 % keep.

Writes bench/results/tune_false_keep.json. Run: python3 bench/bench_tune_false_keep.py [--tunes 20]
(about 20 s a tune on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np
from scipy import stats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from harness import free_port, write_result  # noqa: E402

OUT = os.path.join(ROOT, "bench", "results", "tune_false_keep.json")
PY, B = sys.executable, os.path.join(ROOT, "bin")
SURFACES = {"flat": {"concurrency": 8, "kept_seqs": 16}, "plus6": {"concurrency": 16, "kept_seqs": 14},
            "plus10": {"concurrency": 20, "kept_seqs": 18}, "plus8": {"concurrency": 12, "kept_seqs": 11}}
EXTRA: list[str] = []  # further tune flags (--confirm-blocks)
SLOTS = [1]  # --slots: simulator slots per tune (1: the default path, no slots)
VIRTUAL = [False]  # --virtual: the tunes on the virtual backend (tune --virtual: the simulator's engine in virtual time)
GUARD = "p95_ttft_ms:-:50%"
TUNE = ["--sandbox", "--objective", "throughput", "--steps", "2", "--budget", "3",
        "--input-len", "128", "--output-len", "32", "--num-prompts", "100", "--confirm-front", "0",
        "--ready-timeout", "30", "--slo", "p95_ttft_ms=2000", "--json"]



def true_gains(surface: dict) -> list[float]:
    """Each step-2 candidate's relative difference in predicted output throughput from the kept
    configuration on this surface (noise-free virtual time), for the tunes' client: every stream's
    first request sent at once (no ramp) and the whole run counted (no warm-up left out), as
    bench_stream measures it."""
    from vkit.sim.predict import Scenario, predict

    def tp(tokens: int, seqs: int) -> float:
        sc = Scenario(model="llama-3.1-8b", gpu="H200", isl=128, osl=32, concurrency=surface["concurrency"], num_prompts=100,
                      warmup=0, ramp_steps=0,
                      serve={"max_model_len": 1024, "max_num_batched_tokens": tokens, "max_num_seqs": seqs})
        return predict(sc)["output_throughput_tok_s"]

    base = tp(2048, surface["kept_seqs"])
    return [tp(t, 64) / base - 1 for t in (4096, 8192, 16384)]


def live_gain(surface: dict, work: str, runs: int = 3, speed: float = 8.0) -> dict:
    """The step-2 candidate's gain on the live simulator as the tunes meet it (the same speed,
    workload and client, the simulator's noise off): ``runs`` bench_stream runs of the kept
    configuration and of the 8192-token candidate, one process each. Beside the predictor's
    virtual-time answer, it says what the live path (HTTP, the client's turnaround, this host)
    adds; a host under load moves it too, so it is measured in the same run as the tunes."""
    out = {}
    for name, tokens, seqs in (("kept", 2048, surface["kept_seqs"]), ("candidate", 8192, 64)):
        port = free_port()
        sim = [PY, os.path.join(B, "sim_server"), "sim-8b", "--port", str(port), "--sim-speed", f"{speed:g}", "--sim-startup-s", "0.2",
               "--sim-noise", "0", "--sim-restart-noise", "0", "--sim-seed", "1", "--max-model-len", "1024", "--sim-gpu", "H200",
               "--sim-model", "llama-3.1-8b", "--max-num-batched-tokens", str(tokens), "--max-num-seqs", str(seqs)]
        with open(os.path.join(work, f"live-{name}.log"), "w") as log:
            srv = subprocess.Popen(sim, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            vals = []
            deadline = time.time() + 30
            while time.time() < deadline:
                try:
                    if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                        break
                except OSError:
                    time.sleep(0.2)
            for r in range(runs):
                bs = [PY, os.path.join(B, "bench_stream"), "--url", f"http://127.0.0.1:{port}", "--model", "sim-8b", "--json",
                      "--num-prompts", "100", "--max-concurrency", str(surface["concurrency"]), "--random-input-len", "128",
                      "--random-output-len", "32", "--seed", str(r + 1)]
                p = subprocess.run(bs, capture_output=True, text=True)
                if p.returncode == 0:
                    vals.append(json.loads(p.stdout)["output_throughput"])
            out[name] = vals
        finally:
            os.killpg(srv.pid, 15)
            srv.wait()
    k, c = out.get("kept") or [], out.get("candidate") or []
    gain = float(np.mean(c) / np.mean(k) - 1) if k and c else None
    return {"kept_tok_s": k, "candidate_tok_s": c, "gain": gain}


def one_tune(i: int, work: str, surface: dict, guard: list[str]) -> dict:
    d = os.path.join(work, f"tune-{i:02d}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    state = os.path.join(d, "vkit.json")
    env = dict(os.environ, VKIT_STATE=state)
    port = free_port()
    sim = [PY, os.path.join(B, "sim_server"), "sim-8b", "--port", str(port), "--sim-speed", "8", "--sim-startup-s", "0.2",
           "--sim-seed", str(1000 + i), "--max-model-len", "1024", "--sim-gpu", "H200", "--sim-model", "llama-3.1-8b",
           "--sim-start-file", os.path.join(d, "sim-starts")]
    init = [PY, os.path.join(B, "state"), "init", "--url", f"http://127.0.0.1:{port}", "--model", "sim-8b"]
    init += ["--set", "max_num_batched_tokens=2048", "--set", f"max_num_seqs={surface['kept_seqs']}"]
    if SLOTS[0] > 1:
        # each slot its own simulator: its own noise seed and start count (identical "devices")
        spec = os.path.join(d, "slots.json")
        with open(spec, "w", encoding="utf-8") as f:
            json.dump([{"name": f"s{j}", "devices": [j], "port": port if j == 0 else free_port(),
                        "argv_extra": ["--sim-seed", str((1000 + i) * 10 + j), "--sim-start-file", os.path.join(d, f"sim-starts-{j}")]}
                       for j in range(SLOTS[0])], f)
        init += ["--slots-file", spec]
    subprocess.run([*init, "--", *sim], env=env, check=True, capture_output=True)
    t0 = time.time()
    p = subprocess.run([PY, os.path.join(B, "tune"), *TUNE, *guard, *EXTRA, "--concurrency", str(surface["concurrency"]),
                        *(["--virtual"] if VIRTUAL[0] else [])], env=env, capture_output=True, text=True)
    wall = time.time() - t0
    st = json.load(open(state))
    for doc in [] if VIRTUAL[0] else [st] + [json.load(open(os.path.join(d, s["state"]))) for s in st.get("slots") or []]:
        run = (doc.get("service") or {}).get("running") or {}
        if run.get("pid"):
            try:
                os.killpg(run.get("pgid") or run["pid"], 15)
            except OSError:
                pass
    if p.returncode != 0:
        return {"seed": 1000 + i, "error": f"exit {p.returncode}: {p.stderr[-400:]}"}
    confs = st.get("confirmations") or []
    kept = [c["trial_id"] for c in confs if c.get("decision") == "kept"]
    comp = (st.get("sigma_components") or {}).get("output_throughput") or {}
    first = next((json.loads(x) for x in open(os.path.join(d, "decisions.jsonl")) if '"event": "baseline"' in x), {})
    return {"seed": 1000 + i, "keep": bool(kept), "kept": kept,
            "confirmed": [{"trial": c["trial_id"], "decision": c.get("decision"), "why": (c.get("why") or "")[:160]} for c in confs],
            "screened_accept": sum(1 for t in st["trials"] if t.get("verdict") == "accept"),
            "sigma_within": comp.get("within"), "sigma_between": comp.get("between"),
            "first_baseline_sigma": (first.get("sigma") or {}).get("output_throughput"),
            "refused": next((x["plan"]["why"] for x in st.get("steps") or [] if not (x.get("plan") or {}).get("fits", True)), None),
            "screen_runs": [len(t.get("runs") or []) for t in st["trials"]],
            "planned_blocks": [(c.get("plan") or {}).get("blocks") for c in confs],
            "measurements": sum(len(t.get("runs") or []) for t in st["trials"]) + len((st.get("baseline") or {}).get("runs") or [])
            + sum(len(c.get("a_runs") or []) + len(c.get("b_runs") or []) for c in confs),
            "restarts": sum(1 for log in [os.path.join(d, "decisions.jsonl")]
                            + [os.path.join(d, os.path.dirname(s["state"]), "decisions.jsonl") for s in st.get("slots") or []]
                            if os.path.exists(log) for x in open(log)
                            if any(f'"event": "{k}"' in x for k in ("applied", "rolled_back", "start_failed"))),
            "wall_s": round(wall, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tunes", type=int, default=20, help="seeded tunes per surface (default 20)")
    ap.add_argument("--surfaces", default=",".join(SURFACES))
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--guard", default=GUARD,
                    help=f"tune's --guard (default {GUARD.replace('%', '%%')}: at these unqueued streams P95 TTFT is timing jitter and tune's own "
                         "default 15 %% guard makes the step rightly refused up front, which measures no verdict); "
                         "'default' passes none")
    ap.add_argument("--confirm-blocks", type=int, default=None, metavar="N",
                    help="tune's --confirm-blocks (default: tune's own, 6); at the simulator's noise the power analysis asks "
                         "for 5 to 8 blocks and refuses a step up front with less")
    ap.add_argument("--slots", type=int, default=1, metavar="N",
                    help="tunes on N simulator slots (A/A pass, screening N at a time, confirmations round the slots); "
                         "the results go under '<surface>-slotsN' (default 1: no slots)")
    ap.add_argument("--virtual", action="store_true",
                    help="the tunes on the virtual backend (tune --virtual: the same tune, the simulator's engine and noise "
                         "in virtual time, seconds a tune); the results go under '<surface>-virtual', the live gains not measured")
    a = ap.parse_args(argv)
    SLOTS[0] = a.slots
    VIRTUAL[0] = a.virtual
    guard = [] if a.guard == "default" else ["--guard", a.guard]
    EXTRA[:] = [] if a.confirm_blocks is None else ["--confirm-blocks", str(a.confirm_blocks)]
    work = tempfile.mkdtemp(prefix="vkit-false-keep-")
    # surfaces measured earlier (the file this writes) are kept; the ones run now replace theirs
    out = (json.load(open(a.out)).get("surfaces") or {}) if os.path.exists(a.out) else {}
    try:
        for name in a.surfaces.split(","):
            surface = SURFACES[name]
            gains = true_gains(surface)
            live = {"gain": None} if a.virtual else live_gain(surface, work)
            live1 = {"gain": None} if a.virtual else live_gain(surface, work, runs=1, speed=1.0)  # deterministic at speed 1
            print(f"{name}: predicted gain {gains[1]:+.1%}, live noise-free {live['gain']:+.1%}" if live["gain"] is not None
                  else f"{name}: predicted gain {gains[1]:+.1%}, live gain not measured", file=sys.stderr)
            rows = []
            for i in range(a.tunes):
                r = one_tune(i, work, surface, guard)
                rows.append(r)
                print(f"{name} tune {i + 1}/{a.tunes}: {json.dumps(r)[:300]}", file=sys.stderr)
            done = [r for r in rows if "error" not in r]
            k, n = sum(r["keep"] for r in done), len(done)
            dec = [r for r in done if not r.get("refused")]
            kd, nd = sum(r["keep"] for r in dec), len(dec)
            key = name if SLOTS[0] == 1 else f"{name}-slots{SLOTS[0]}"
            out[key + ("-virtual" if a.virtual else "")] = {
                "guard": a.guard, "refused_up_front": n - nd, "decided": nd, "keeps_decided": kd,
                "keep_rate_decided": kd / nd if nd else None,
                "keep_rate_decided_upper95": float(stats.beta.ppf(0.95, kd + 1, nd - kd)) if nd and kd < nd else 1.0,
                "keep_rate_decided_lower95": float(stats.beta.ppf(0.05, kd, nd - kd + 1)) if nd and kd > 0 else 0.0,
                "surface": surface, "true_gains": gains, "live_gain": live, "live_gain_speed1": live1, "confirm_blocks": a.confirm_blocks or 6, "tunes": n, "errors": len(rows) - n, "keeps": k,
                "keep_rate": k / n if n else None,
                # Clopper-Pearson, one-sided 95 %: the upper bound on flat, the lower one on plus6
                "keep_rate_upper95": float(stats.beta.ppf(0.95, k + 1, n - k)) if n and k < n else 1.0,
                "keep_rate_lower95": float(stats.beta.ppf(0.05, k, n - k + 1)) if n and k > 0 else 0.0,
                "target": "keep rate <= 0.05" if name == "flat" else "keep rate >= 0.80 (issue 18: at a true +6 %)",
                "median_restarts": sorted(r["restarts"] for r in done)[n // 2] if done else None,
                "median_wall_s": sorted(r["wall_s"] for r in done)[n // 2] if done else None,
                "median_measurements": sorted(r["measurements"] for r in done)[n // 2] if done else None,
                "rows": rows, "command": f"python3 bench/bench_tune_false_keep.py --tunes {a.tunes} --surfaces {name} --guard {a.guard}"
                + (f" --confirm-blocks {a.confirm_blocks}" if a.confirm_blocks else "") + (f" --slots {SLOTS[0]}" if SLOTS[0] > 1 else "")
                + (" --virtual" if a.virtual else ""),
                "backend": "virtual" if a.virtual else "process",
                "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc = {"benchmark": "tune_false_keep", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": f"{platform.machine()}, {os.cpu_count()} cpus", "surfaces": out}
    write_result(a.out, doc, "tune_false_keep")
    for name, r in out.items():
        print(f"{name}: {r['keeps']}/{r['tunes']} kept (95 % bounds {r['keep_rate_lower95']:.2f}-{r['keep_rate_upper95']:.2f}; "
              f"{r.get('refused_up_front')} refused up front, guard {r.get('guard')}), "
              f"true gains {', '.join(f'{g:+.1%}' for g in r['true_gains'])}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
