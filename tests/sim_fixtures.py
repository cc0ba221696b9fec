"""Shared helpers of the sim_server tests: small engines, a running server process, SSE parsing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import requests

from bench.harness import free_port  # one definition, bench's and the tests'
from vkit.sim.engine import CostModel, Engine, EngineConfig, Request
from vkit.sim.profiles import get_gpu, get_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIM_BIN = os.path.join(ROOT, "bin", "sim_server")


def small_engine(num_blocks: int = 1000, budget: int = 64, seqs: int = 8, chunked: bool = True,
                 caching: bool = True, policy: str = "fcfs", block_size: int = 16, max_model_len: int = 4096,
                 threshold: int = 0) -> Engine:
    cfg = EngineConfig(max_model_len=max_model_len, max_num_seqs=seqs, max_num_batched_tokens=budget,
                       num_gpu_blocks=num_blocks, block_size=block_size, enable_chunked_prefill=chunked,
                       enable_prefix_caching=caching, policy=policy, long_prefill_token_threshold=threshold)
    cost = CostModel(get_model("llama-3.1-8b"), get_gpu("H200"))
    return Engine(cfg, cost, lambda r: 1000 + r.num_output, eos_token_id=2)


def req(rid: str, n_prompt: int, max_tokens: int = 100, start: int = 0, **kw) -> Request:
    """A request whose prompt is ``start, start+1, ...`` (distinct starts share no prefix)."""
    return Request(rid, list(range(start, start + n_prompt)), max_tokens, **kw)


class SimProcess:
    """``bin/sim_server`` as a subprocess on a free loopback port."""

    def __init__(self, *flags: str, wait: bool = True, env: dict | None = None, timeout: float = 20.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, SIM_BIN, "sim-model", "--port", str(self.port), *flags]
        if not any(f.startswith("--sim-startup-s") for f in flags):
            args += ["--sim-startup-s", "0"]
        if not any(f.startswith("--sim-seed") for f in flags):
            args += ["--sim-seed", "7"]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        if wait:
            self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sim_server exited {self.proc.returncode}: {self.proc.stderr.read()}")
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.05)
        raise RuntimeError("sim_server did not become ready")

    def stop(self) -> tuple[int, str, str]:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            out, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
        return self.proc.returncode, out, err

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def sse_events(resp: requests.Response) -> list[str]:
    """Split an SSE body into its ``data:`` payloads, checking the framing on the way."""
    raw = resp.content.decode()
    assert raw.endswith("\n\n"), raw[-50:]
    events = []
    for block in raw.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        assert "\n" not in block, block
        events.append(block[len("data: "):])
    return events


def sse_json(resp: requests.Response) -> tuple[list[dict], bool]:
    evs = sse_events(resp)
    done = bool(evs) and evs[-1] == "[DONE]"
    return [json.loads(e) for e in evs if e != "[DONE]"], done
