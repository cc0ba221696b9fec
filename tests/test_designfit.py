"""vkit.sim.designfit: the designed calibration runs' concurrencies, and the closed-loop runs fitted beside a
capacity search's open-loop points separating the engine's fixed costs that the points alone confound."""

from __future__ import annotations

import random

import pytest

from tests.test_loadfit import tiny_model
from vkit.sim.calibrate import Run
from vkit.sim.calibrated import CostParams
from vkit.sim.designfit import JointProblem, concurrencies, requests_for
from vkit.sim.loadfit import CPU_FREE, LoadPoint, PointProblem, fit_points
from vkit.sim.predict import _poisson_arrivals

pytestmark = pytest.mark.unit


def test_the_designed_concurrencies_are_one_and_the_kv_bound_one():
    """1 and max_num_seqs, capped by the whole requests the KV cache holds: vLLM's "Maximum concurrency for 2,048
    tokens per request: 10.0" holds 20,480 tokens, 32 requests of 512 + 128; without the startup line, max_num_seqs
    (vLLM's 256 when unset); one sequence is one run."""
    kv = {"max_concurrency": 10.0, "max_concurrency_tokens_per_request": 2048}
    assert concurrencies({"max_num_seqs": 256}, kv, 512, 128) == [1, 32]
    assert concurrencies({"max_num_seqs": 16}, kv, 512, 128) == [1, 16]
    assert concurrencies({}, {}, 512, 128) == [1, 256]
    assert concurrencies({"max_num_seqs": 1}, kv, 512, 128) == [1]
    assert concurrencies({"max_num_seqs": 64}, {"max_concurrency": 0.1, "max_concurrency_tokens_per_request": 2048},
                         4096, 4096) == [1]
    assert requests_for(1) == 8 and requests_for(16) == 48


def test_the_long_prompt_run_fits_the_model_length_or_is_left_out():
    """One request at a time at 8 x the workload's prompt, within the model length less the output: 128 in, 64 out
    and 2,048 tokens give 1,024; 512 in, 128 out and 1,024 tokens leave 895, under twice the workload's own prompt,
    so the workload's prompts already are the long ones and the run is left out."""
    from vkit.sim.designfit import design, long_prompt

    assert long_prompt({"max_model_len": 2048}, {}, 128, 64) == 1024
    assert long_prompt({}, {"max_model_len": 900}, 128, 64) == 835  # the startup's model length when unset
    assert design({"max_num_seqs": 3, "max_model_len": 2048}, {}, 128, 64) == [(1, 128), (3, 128), (1, 1024)]
    assert design({"max_num_seqs": 16, "max_model_len": 1024}, {}, 512, 128) == [(1, 512), (16, 512)]


def test_the_design_reads_the_model_length_from_the_launch_when_the_tuned_configuration_lacks_it():
    """A tune of max_num_batched_tokens x max_num_seqs whose server was launched with --max-model-len 1024 (and a
    startup that logged no model length: the simulator's): the designed runs are planned on the launch's flags under
    the kept values, so 8 x 512 prompt tokens, which would not fit 1,024 less 256 out, are left out. Planned on the
    kept values alone they were sent, and every request of the run failed."""
    from vkit.sim.designfit import design, serving

    state = {"service": {"launch": {"argv": ["sim_server", "m", "--max-model-len", "1024", "--max-num-seqs", "4"]}}}
    kept = {"max_num_batched_tokens": 2048, "max_num_seqs": 16}
    cfg = serving(state, kept)
    assert cfg["max_model_len"] == 1024 and cfg["max_num_seqs"] == 16  # the kept value over the launch's
    assert design(cfg, {"ready_s": 60.0}, 512, 256) == [(1, 512), (16, 512)]
    assert design(kept, {"ready_s": 60.0}, 512, 256)[-1] == (1, 4096)  # what was sent before


def test_closed_loop_runs_at_1_and_the_kv_bound_concurrency_pin_down_what_the_load_points_confound(tmp_path):
    """The tiny Llama on the host CPU with hidden engine costs (mfu 0.3, per decode step 0.6 ms, per mixed step
    4 ms, per scheduled request 0.1 ms) at 16 sequences: three open-loop loads replayed as the capacity search
    would measure them, and two closed-loop runs (1 and 16 concurrent requests) of the same configuration. Fitted
    with the CPU's free parameters from the defaults, the points alone trade the compute fraction against the
    step time (a value more than 10 % off); with the closed-loop runs every hidden value comes back within 5 %."""
    model = tiny_model(tmp_path)
    hidden = CostParams(mfu=0.3, decode_step_overhead_s=6e-4, mixed_step_overhead_s=4e-3, per_req_overhead_s=1e-4)
    serve = {"max_model_len": 2048, "max_num_batched_tokens": 2048, "max_num_seqs": 16}
    pts = []
    for k, rate in enumerate((5.0, 15.0, 30.0)):
        arr = _poisson_arrivals(random.Random(k), rate, 80, exact=True)
        pts.append(LoadPoint(source=f"cpu-{rate:g}", model=model, gpu="CPU", tp=1, quantization=None, serve=dict(serve),
                             rate=rate, arrivals=[a - arr[0] for a in arr], prompt_lens=[128] * 80, output_lens=[64] * 80,
                             measured=[True] * 80, ttft_s=0.0, tpot_s=0.0))
    for p, (ttft, tpot) in zip(pts, PointProblem(pts).predict(hidden), strict=True):
        p.ttft_s, p.tpot_s = float(ttft), float(tpot)
    runs = [Run(model=model, gpu="CPU", tp=1, quantization=None, isl=128, osl=64, concurrency=c, ttft_s=0.0, tpot_s=0.0,
                serve=dict(serve), num_prompts=requests_for(c)) for c in (1, 16)]
    joint = JointProblem(PointProblem(pts), runs)
    for r, (ttft, tpot) in zip(runs, joint.closed.predict(hidden), strict=True):
        r.ttft_s, r.tpot_s = float(ttft), float(tpot)
    assert runs[1].tpot_s > 2 * runs[0].tpot_s  # a full batch's decode step carries 16 requests' CPU time
    joint = JointProblem(PointProblem(pts), runs)
    assert len(joint.points) == 5 and joint.measured().shape == (5, 2)

    def worst(res) -> float:
        return max(abs(res["table"][n]["value"] / getattr(hidden, n) - 1) for n in CPU_FREE)

    alone = fit_points(PointProblem(pts), names=CPU_FREE, max_nfev=30)
    both = fit_points(joint, names=CPU_FREE, max_nfev=30)
    assert worst(both) < 0.05 and all(both["table"][n]["identified"] for n in CPU_FREE), both["table"]
    assert worst(alone) > 0.10, alone["table"]
