"""The hidden-effects world (vkit.sim.hidden, sim_server --sim-hidden-effects): the effects the
twin's cost model lacks, each where vLLM puts it."""

import math

import pytest

from vkit.cli.sim_server import parse_virtual
from vkit.measure.gauge import BenchOptions, build_config
from vkit.sim.hidden import HiddenCost, HiddenEffects, capture_sizes
from vkit.sim.profiles import get_gpu, get_model
from vkit.sim.steptime import CostModel
from vkit.sim.virtual import VirtualServer

M, G = get_model("llama-3.1-8b"), get_gpu("H200")


def effects(**kw) -> HiddenEffects:
    base = dict(seed=0, eager_launch_s=0.0, cpu_per_seq_s=0.0, detok_per_token_s=0.0, attn_ctx_c=0.0)
    return HiddenEffects(**{**base, **kw})


def test_capture_sizes_are_vllms_defaults_up_to_twice_max_num_seqs():
    assert capture_sizes(16) == [1, 2, 4, 8, 16, 24, 32]
    big = capture_sizes(512)
    assert big[-1] == 512 and 248 in big and 256 in big and 272 in big and 264 not in big and 250 not in big
    assert capture_sizes(300)[-1] == 512  # min(2 x 300, 512)


def test_a_step_runs_the_next_captured_size_and_past_the_largest_pays_eager_launches():
    inner = CostModel(M, G)
    c = HiddenCost(inner, effects(eager_launch_s=0.002), max_num_seqs=16, model=M, gpu=G)
    # a decode step of 9 requests runs the graph of 16 rows (still a decode step)
    assert c.step_time(9, 0, 9 * 300, 9, 9) == pytest.approx(inner.step_time(16, 0, 9 * 300, 9, 16))
    # a mixed step of 100 tokens is past the largest size (32): no padding, the eager launches on top
    assert c.step_time(100, 5000, 4000, 2, 2) == pytest.approx(inner.step_time(100, 5000, 4000, 2, 2) + 0.002)
    # a compute-bound prefill step of 30 tokens pads to 32: longer than its own
    assert c.step_time(30, 400, 30, 1, 1) > inner.step_time(30, 400, 30, 1, 1)


def test_attention_costs_more_per_kv_token_as_the_context_grows_and_cpu_terms_add_per_row():
    inner = CostModel(M, G)
    c = HiddenCost(inner, effects(attn_ctx_c=0.4), max_num_seqs=512, model=M, gpu=G)

    def extra_per_kv(context: int) -> float:
        n = 32
        return (c.step_time(n, 0, n * context, n, n) - inner.step_time(n, 0, n * context, n, n)) / (n * context)

    short, mid, long_ = extra_per_kv(256), extra_per_kv(1024), extra_per_kv(8192)
    assert 0 < short < mid < long_
    assert mid / long_ == pytest.approx(math.log2(2) / math.log2(9))
    cpu = HiddenCost(inner, effects(cpu_per_seq_s=20e-6, detok_per_token_s=5e-6), max_num_seqs=512, model=M, gpu=G)
    assert cpu.step_time(32, 0, 3200, 32, 32) - inner.step_time(32, 0, 3200, 32, 32) == pytest.approx(32 * 25e-6)


def test_each_seed_draws_its_own_world_within_the_documented_ranges():
    a, b = HiddenEffects.draw(1), HiddenEffects.draw(2)
    assert a == HiddenEffects.draw(1) and a != b
    for e in (HiddenEffects.draw(s) for s in range(40)):
        assert 1e-3 <= e.eager_launch_s <= 3e-3 and 10e-6 <= e.cpu_per_seq_s <= 40e-6
        assert 2e-6 <= e.detok_per_token_s <= 10e-6 and 0.1 <= e.attn_ctx_c <= 0.6


def _tpot(extra: list[str]) -> tuple[float, dict]:
    opts, settings = parse_virtual(["m", "--sim-noise", "0", "--sim-restart-noise", "0", "--max-model-len", "1024",
                                    *extra], 1)
    vs = VirtualServer(opts, settings)
    assert vs.start({"max_num_seqs": 32}).ok
    o = BenchOptions(random_input_len=512, random_output_len=128, num_prompts=120, max_concurrency=32, seed=3,
                     vocab_size=2000)
    summary = vs.measure(build_config(o, "virtual://", []))[0]
    return summary["mean_tpot_ms"], summary


def test_sim_server_hidden_effects_slow_decode_and_say_so_in_the_version_info():
    plain, _ = _tpot([])
    hidden, summary = _tpot(["--sim-hidden-effects", "3"])
    e = HiddenEffects.draw(3)
    # 32 rows a step: at least the two CPU terms per row on top of every decode step
    assert hidden - plain >= 0.9 * 32 * (e.cpu_per_seq_s + e.detok_per_token_s) * 1e3
    info = ((summary.get("vkit") or {}).get("server") or {}).get("version_info") or {}
    assert info.get("sim_hidden_effects") == 3

