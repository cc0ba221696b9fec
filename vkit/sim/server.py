"""``vkit.sim.server``: the simulator's server under its first name, a façade.

The code lives beside it by concern: ``vkit.sim.http`` (connections, request parsing,
chunked SSE framing, error bodies), ``vkit.sim.api`` (the OpenAI-compatible endpoints and
the request → engine mapping) and ``vkit.sim.settings`` (the simulator's own settings), ``vkit.sim.serve`` (start-up, the asyncio loop,
the engine loop in virtual time, crash and shutdown). Their public names are re-exported here.
"""

from __future__ import annotations

from vkit.sim.api import ENGINE_DEAD_MSG, SIM_VERSION, VLLM_VERSION, FullSink, Live, SimApi
from vkit.sim.http import BadRequest, Conn, StreamSink, error_body
from vkit.sim.serve import (
    CRASH_EXIT_DELAY_S,
    MAX_BEHIND_S,
    REGIME_GAP_WALL_S,
    OnLoop,
    SimApp,
    build_engine,
    report_startup_error,
    serve,
)
from vkit.sim.settings import STATS_LOG_INTERVAL_S, SimSettings

__all__ = [
    "CRASH_EXIT_DELAY_S", "ENGINE_DEAD_MSG", "MAX_BEHIND_S", "REGIME_GAP_WALL_S", "SIM_VERSION",
    "STATS_LOG_INTERVAL_S", "VLLM_VERSION", "BadRequest", "Conn", "FullSink", "Live", "OnLoop", "SimApi",
    "SimApp", "SimSettings", "StreamSink", "build_engine", "error_body", "report_startup_error", "serve",
]
