"""Energy under the SLO: the simulated boards' power model, a run's energy block, the figures at the
SLO capacity, the virtual server's energy, and the simulated nvidia-smi read through the real parser."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

from tests.conftest import REPO
from vkit.measure import accel
from vkit.measure.energy import MIN_COVERAGE, MIN_SAMPLES, add_energy, energy_block
from vkit.sim import smi
from vkit.sim.power import BOARDS, K_COMPUTE, K_MEMORY, PowerMeter, board
from vkit.sim.profiles import GPUS, get_gpu, get_model
from vkit.tune import capenergy
from vkit.validate.invariants import energy as energy_checks

pytestmark = pytest.mark.unit


def _power_fit():
    spec = importlib.util.spec_from_file_location("power_fit", os.path.join(REPO, "bench", "power_fit.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# -- the power model -------------------------------------------------------------------------------

def test_the_power_constants_are_the_fit_to_the_measured_h200_loops():
    with open(os.path.join(REPO, "bench", "results", "gpu_steps_h200.json")) as f:
        doc = json.load(f)
    res = _power_fit().fit(doc)
    assert (round(res["k_compute"], 4), round(res["k_memory"], 5)) == (K_COMPUTE, K_MEMORY)
    # two loops, two constants: the model draws what each loop drew
    for loop in res["loops"]:
        assert loop["model_w"] == pytest.approx(loop["measured_w"], rel=1e-3)


def test_every_simulated_accelerator_has_its_board_power_and_a_source():
    # the host CPU (a twin's device with nominal peaks, vkit.sim.profiles) has no board an smi reads: none is made up
    assert set(BOARDS) == set(GPUS) - {"CPU"}
    with pytest.raises(KeyError, match="no power figures for the simulated accelerator CPU"):
        board(GPUS["CPU"])
    for b in BOARDS.values():
        assert 0 < b.idle_w < b.limit_w and b.source


def test_a_step_draws_more_with_more_work_never_past_the_limit_and_idle_between_steps():
    m = PowerMeter(get_model("llama-3.1-8b"), get_gpu("H200"), tp=2)
    assert m.idle_w == pytest.approx(2 * 77.7)
    small = m.step(8, 8 * 2049, 8 * 2050, 8, 0.006, start=0.0)
    big = m.step(128, 128 * 2049, 128 * 2050, 128, 0.014, start=1.0)
    assert m.idle_w < small < big <= 2 * 700.0
    assert m.step(8192, 8192 * 4096, 8192, 1, 1e-4, start=2.0) == pytest.approx(2 * 700.0)  # capped at the limit
    # the counter: idle for the whole time plus each step's draw above idle
    above = (small - m.idle_w) * 0.006 + (big - m.idle_w) * 0.014 + (2 * 700.0 - m.idle_w) * 1e-4
    assert m.energy_j(10.0) == pytest.approx(m.idle_w * 10.0 + above)
    # half-way through the last step, half of its draw above idle is not spent yet
    assert m.energy_j(10.0, now=2.0 + 5e-5) == pytest.approx(m.energy_j(10.0) - (2 * 700.0 - m.idle_w) * 5e-5)


# -- a run's energy block --------------------------------------------------------------------------

def power(**kw) -> dict:
    p = {"available": True, "interval_s": 1.0, "samples": 20, "devices": 1, "covered_s": 19.0, "mean_w": 500.0,
         "min_w": 450.0, "max_w": 550.0, "sampled_j": 9500.0, "counter_j": None, "counter_why": "no counter",
         "counter_s": None}
    p.update(kw)
    return p


def test_the_counter_beats_the_samples_and_energy_is_its_mean_over_the_run():
    e = energy_block(power(counter_j=10_500.0, counter_s=21.0), 20.0, 4000, 100, idle_w=80.0)
    assert (e["source"], e["mean_w"], e["energy_j"]) == ("counter", 500.0, 10_000.0)
    assert (e["j_per_output_token"], e["j_per_request"], e["coverage"]) == (2.5, 100.0, 0.95)
    assert (e["idle_j"], e["load_j"]) == (1600.0, 8400.0)  # idle 80 W for 20 s; the rest is the load's


def test_without_a_counter_the_samples_mean_and_a_backwards_counter_is_kept_for_the_check():
    e = energy_block(power(mean_w=400.0), 10.0, 1000, 10)
    assert (e["source"], e["energy_j"], e["j_per_output_token"]) == ("sampled", 4000.0, 4.0)
    e = energy_block(power(mean_w=400.0, counter_j=-5.0, counter_s=10.0), 10.0, 1000, 10)
    assert (e["source"], e["counter_j"]) == ("sampled", -5.0)


def test_no_power_gives_no_figure_and_says_why():
    e = energy_block({"available": False, "why": "nvidia-smi gave no power.draw ([N/A])"}, 10.0, 1000, 10)
    assert e["available"] is False and e["why"] == "nvidia-smi gave no power.draw ([N/A])"
    assert all(e[k] is None for k in ("energy_j", "mean_w", "j_per_output_token"))


def summary() -> dict:
    return {"duration": 20.0, "total_output_tokens": 4000, "completed": 100, "vkit": {}}


def test_usable_figures_reach_the_top_level_and_thin_samples_do_not():
    s = summary()
    add_energy(s, power(), idle_w=80.0)
    assert (s["j_per_output_token"], s["mean_power_w"], s["vkit"]["energy"]["usable"]) == (2.5, 500.0, True)
    s = summary()
    e = add_energy(s, power(covered_s=10.0, samples=MIN_SAMPLES + 5))  # half the run covered
    assert e["available"] and not e["usable"] and "cover 50%" in e["why"]
    assert "j_per_output_token" not in s and "mean_power_w" not in s
    # the limits are check_invariants' own
    assert (MIN_COVERAGE, MIN_SAMPLES) == (energy_checks.MIN_COVERAGE, energy_checks.MIN_SAMPLES)


# -- at the SLO capacity -----------------------------------------------------------------------------

def test_energy_and_cost_at_the_capacity():
    m = {"mean_w": 2800.0, "j_per_output_token": 0.35, "j_per_request": 70.0, "output_throughput": 8000.0,
         "request_throughput": 40.0}
    e = capenergy.at_capacity(m, 4, capenergy.Prices(per_accelerator_hour=2.0, per_kwh=0.2))
    assert e["output_tok_s_per_kw"] == pytest.approx(8000 / 2.8)
    assert e["w_per_accelerator"] == 700.0
    hours = 1e6 / 8000 / 3600
    c = e["cost_per_m_output_tokens"]
    assert c["accelerators"] == pytest.approx(2.0 * 4 * hours) and c["energy"] == pytest.approx(0.2 * 2.8 * hours)
    assert c["total"] == pytest.approx(c["accelerators"] + c["energy"])
    assert capenergy.document_metrics(e, 20.0)["slo_capacity_per_kw"] == pytest.approx(20.0 / 2.8)


def test_no_power_at_the_capacity_gives_no_energy_figure():
    e = capenergy.at_capacity({"output_throughput": 8000.0}, 4)
    assert e["available"] is False and "no board power" in e["why"]
    assert capenergy.document_metrics(e, 20.0) == {}
    s = summary()
    add_energy(s, power(covered_s=5.0))
    assert capenergy.run_metrics(s) == {}


# -- the simulated nvidia-smi, read by the parser that reads real ones ---------------------------------

DEVICES = [{"index": i, "name": "NVIDIA H200", "memory_total_mib": 143771.0, "memory_used_mib": 132269.0,
            "util_pct": 87.0, "power_w": 452.4, "limit_w": 700.0, "energy_mj": 123456789.0} for i in range(2)]


def test_simulated_nvidia_smi_prints_the_real_formats():
    out, rc = smi.answer(["--query-gpu=index,power.draw,utilization.gpu", "--format=csv"], DEVICES[:1])
    assert (out, rc) == ("index, power.draw [W], utilization.gpu [%]\n0, 452.40 W, 87 %\n", 0)
    out, _ = smi.answer(["--query-gpu=index,power.draw", "--format=csv,nounits"], DEVICES[:1])
    assert out == "index, power.draw\n0, 452.40\n"
    out, rc = smi.answer(["--query-gpu=index,total_energy_consumptions", "--format=csv"], DEVICES)
    assert (out, rc) == ('Field "total_energy_consumptions" is not a valid field to query.\n\n', 2)
    assert smi.answer(["-q"], DEVICES)[1] == 2


def test_the_sampler_parsers_read_the_simulated_output():
    out, _ = smi.answer(accel.NVIDIA_ARGV[1:], DEVICES)
    rows = accel.parse_nvidia(out)
    assert [(r["index"], r["util_pct"], r["mem_used_mib"], r["power_w"]) for r in rows] == [
        (0, 87.0, 132269.0, 452.4), (1, 87.0, 132269.0, 452.4)]
    out, _ = smi.answer(accel.ENERGY_ARGV[1:], DEVICES)
    assert accel.parse_energy(out) == ({0: 123456.789, 1: 123456.789}, None)


def test_the_simulated_boards_report_power_as_the_counter_rises():
    m = PowerMeter(get_model("llama-3.1-8b"), get_gpu("H200"), tp=2)
    boards = smi.SmiBoards(m, "NVIDIA H200", 143771.0, 132269.0, v0=0.0, w0=0.0)
    d0 = boards.devices(0.0, 0.0)
    assert [d["power_w"] for d in d0] == [77.7, 77.7]
    for k in range(100):  # a second of 10-ms steps
        m.step(64, 64 * 1025, 64 * 1026, 64, 0.01, start=k * 0.01)
    d1 = boards.devices(1.0, 1.0)
    assert sum(d["power_w"] for d in d1) == pytest.approx(m.idle_w * 1.0 + m.above_idle_j)  # the counter's rise over 1 s
    assert d1[0]["util_pct"] == pytest.approx(100.0)
    assert d1[0]["energy_mj"] == pytest.approx(1000.0 * m.energy_j(1.0) / 2)
    # at --sim-speed 4 a wall second holds four simulated ones: the watts read four times the board's
    d2 = boards.devices(1.25, 2.0)
    assert sum(d["power_w"] for d in d2) == pytest.approx(4 * m.idle_w)


# -- the virtual server's runs -------------------------------------------------------------------------

def test_the_virtual_server_meters_each_run_and_bigger_batches_spend_fewer_joules_per_token():
    from vkit.measure.gauge import BenchOptions, build_config
    from vkit.sim.config import ServeOptions
    from vkit.sim.settings import SimSettings
    from vkit.sim.virtual import VirtualServer

    opts = ServeOptions(model="m", gpu=get_gpu("H200"), model_profile=get_model("llama-3.1-8b"))
    per_token = []
    for seqs in (8, 64):
        vs = VirtualServer(opts, SimSettings(seed=1, noise=0.0, restart_noise=0.0, startup_s=60.0))
        assert vs.start({"max_num_seqs": seqs}).ok
        o = BenchOptions(random_input_len=512, random_output_len=128, num_prompts=200, seed=3, max_concurrency=seqs)
        s, _ = vs.measure(build_config(o, "virtual://m", []))
        e = s["vkit"]["energy"]
        assert (e["source"], e["usable"], e["idle_w"]) == ("simulated", True, pytest.approx(77.7))
        assert e["energy_j"] == pytest.approx(e["mean_w"] * s["duration"])
        assert e["idle_w"] < e["mean_w"] <= 700.0
        assert s["j_per_output_token"] == pytest.approx(e["energy_j"] / s["total_output_tokens"])
        per_token.append(s["j_per_output_token"])
    assert per_token[1] < 0.6 * per_token[0]
    assert np.isfinite(per_token).all()
