"""The simulated engine on constructed queues, and its physics in virtual time (no HTTP)."""

from __future__ import annotations

import math

import pytest

from tests.sim_fixtures import req, small_engine
from vkit.sim.config import ServeOptions, SimStartupError, batch_defaults, resolve
from vkit.sim.engine import FINISHED, PREEMPTED, RUNNING, CostModel, Noise
from vkit.sim.harness import SimRequest, engine_for, percentile, simulate
from vkit.sim.metrics import build_1_2_5_buckets, go_float
from vkit.sim.profiles import GPUS, MODELS, get_gpu, get_model
from vkit.sim.tokenizer import OUTPUT_WORDS, Tokenizer, render_chat

pytestmark = pytest.mark.unit


def distinct_prompts(n: int, length: int, salt: int = 0) -> list[list[int]]:
    return [[256 + (k * 7919 + salt * 104729 + i) % 30000 for i in range(length)] for k in range(n)]


# -- scheduler ------------------------------------------------------------------------------

def test_budget_is_respected_and_filled_by_chunks():
    e = small_engine(budget=64, seqs=8)
    for i in range(4):
        e.add_request(req(f"r{i}", 50, start=1000 * i))
    res = e.step(0.0)
    assert res.num_tokens == 64  # 50 + a 14-token chunk of the second prompt
    assert [n for n in res.scheduled.values()] == [50, 14]
    assert [r.req_id for r in res.token_reqs] == ["r0"]  # the partial prefill samples nothing
    for _ in range(20):
        res = e.step(0.0)
        assert res.num_tokens <= 64


def test_running_decodes_are_scheduled_before_waiting_prefill():
    e = small_engine(budget=64, seqs=8)
    for i in range(3):
        e.add_request(req(f"d{i}", 10, start=1000 * i))
    e.step(0.0)  # three prefills, all now decoding
    e.add_request(req("long", 200, start=9000))
    res = e.step(0.0)
    items = list(res.scheduled.items())
    assert [(r.req_id, n) for r, n in items[:3]] == [("d0", 1), ("d1", 1), ("d2", 1)]
    assert items[3][0].req_id == "long" and items[3][1] == 61  # what the decodes left of the budget


def test_chunked_prefill_off_blocks_admission_of_a_prompt_larger_than_the_budget_left():
    e = small_engine(budget=64, seqs=8, chunked=False)
    e.add_request(req("a", 40, start=0))
    e.add_request(req("b", 40, start=1000))
    res = e.step(0.0)
    assert [r.req_id for r in res.scheduled] == ["a"]  # b (40) > 24 left: stop, no chunking
    e2 = small_engine(budget=64, seqs=8, chunked=True)
    e2.add_request(req("a", 40, start=0))
    e2.add_request(req("b", 40, start=1000))
    res2 = e2.step(0.0)
    assert [(r.req_id, n) for r, n in res2.scheduled.items()] == [("a", 40), ("b", 24)]


def test_long_prefill_token_threshold_caps_a_prompt_per_step():
    e = small_engine(budget=64, seqs=8, threshold=16)
    e.add_request(req("a", 40))
    assert list(e.step(0.0).scheduled.values()) == [16]


def test_max_num_seqs_caps_running():
    e = small_engine(budget=1000, seqs=3)
    for i in range(5):
        e.add_request(req(f"r{i}", 5, start=100 * i))
    e.step(0.0)
    assert e.num_running() == 3 and e.num_waiting() == 2


def test_preemption_by_recompute_newest_first_under_fcfs():
    # 9 usable blocks of 16 tokens; three 40-token prompts need 3 blocks each.
    e = small_engine(num_blocks=10, budget=512, seqs=8, caching=False)
    for i in range(3):
        e.add_request(req(f"r{i}", 40, max_tokens=100, start=1000 * i))
    e.step(0.0)
    assert e.num_running() == 3 and e.pool.num_free() == 0
    for _ in range(20):  # decode until a request crosses into a 4th block
        res = e.step(0.0)
        if res.num_preempted:
            break
    assert res.num_preempted == 1
    victim = e.waiting.peek()
    assert victim.req_id == "r2" and victim.status == PREEMPTED  # the most recently admitted
    assert victim.num_computed == 0 and victim.blocks == [] and victim.num_preemptions == 1
    assert [r.req_id for r in e.running] == ["r0", "r1"]
    assert e.total_preemptions == 1
    # No admission in a step that preempted; later the victim recomputes prompt + outputs.
    n_tokens = len(victim.token_ids)
    assert n_tokens > 40
    for _ in range(200):
        e.step(0.0)
        if victim.status == RUNNING:
            break
    assert victim.status == RUNNING and victim.num_computed >= n_tokens  # recomputed prompt + outputs


def test_preemption_under_priority_policy_takes_the_lowest_priority():
    e = small_engine(num_blocks=10, budget=512, seqs=8, caching=False, policy="priority")
    e.add_request(req("low", 40, start=0, priority=5, arrival=0.0))
    e.add_request(req("high", 40, start=1000, priority=0, arrival=1.0))
    e.add_request(req("mid", 40, start=2000, priority=1, arrival=2.0))
    e.step(0.0)
    assert [r.req_id for r in e.running] == ["high", "mid", "low"]  # admitted by priority
    for _ in range(20):
        if e.step(0.0).num_preempted:
            break
    assert e.waiting.peek().req_id == "low"


def test_prefix_cache_hits_on_full_blocks_and_never_the_last_token():
    e = small_engine(budget=512)
    shared = list(range(5000, 5000 + 50))  # 3 full blocks + 2 tokens
    a = req("a", 0, max_tokens=1)
    a.token_ids = shared + [1, 2, 3]
    a.prompt_len = len(a.token_ids)
    e.add_request(a)
    res = e.step(0.0)
    assert res.prefix_queries == 53 and res.prefix_hits == 0
    b = req("b", 0, max_tokens=1)
    b.token_ids = shared + [7, 8]
    b.prompt_len = len(b.token_ids)
    e.add_request(b)
    res = e.step(0.0)
    assert res.prefix_queries == 52 and res.prefix_hits == 48
    assert res.scheduled[b] == 52 - 48
    # A prompt that is exactly 3 blocks: the last block is recomputed to get logits.
    c = req("c", 0, max_tokens=1)
    c.token_ids = shared[:48]
    c.prompt_len = 48
    e.add_request(c)
    res = e.step(0.0)
    assert res.prefix_hits == 32 and res.scheduled[c] == 16


def test_prefix_cache_off_counts_nothing():
    e = small_engine(budget=512, caching=False)
    e.add_request(req("a", 64, max_tokens=1))
    e.step(0.0)
    e.add_request(req("b", 64, max_tokens=1))
    res = e.step(0.0)
    assert res.prefix_queries == 0 and res.prefix_hits == 0 and res.scheduled


def test_free_cached_blocks_are_evicted_lru_tail_first():
    e = small_engine(num_blocks=9, budget=512, seqs=4)  # 8 usable blocks
    e.add_request(req("a", 64, max_tokens=1, start=0))  # 4 full blocks, finishes at once
    e.step(0.0)
    assert e.pool.num_free() == 8 and len(e.pool.cached) == 4  # freed but still cached
    e.add_request(req("b", 90, max_tokens=1, start=50000))  # 6 blocks: evicts 2 of a's
    e.step(0.0)
    e.add_request(req("a2", 64, max_tokens=1, start=0))
    res = e.step(0.0)
    # a's tail blocks were evicted first, so a2 still hits a's first two blocks.
    assert res.prefix_hits == 32


def test_stop_conditions():
    e = small_engine(budget=512)
    a = req("len", 10, max_tokens=3)
    b = req("eos", 10, max_tokens=50, start=100, ignore_eos=False, natural_len=4)
    c = req("min", 10, max_tokens=50, start=200, ignore_eos=False, natural_len=2, min_tokens=6)
    d = req("ign", 10, max_tokens=5, start=300, ignore_eos=True, natural_len=2)
    for r in (a, b, c, d):
        e.add_request(r)
    while e.has_work():
        e.step(0.0)
    assert (a.finish_reason, a.num_output) == ("length", 3)
    assert (b.finish_reason, b.num_output, b.token_ids[-1]) == ("stop", 4, 2)
    assert (c.finish_reason, c.num_output) == ("stop", 6)
    assert (d.finish_reason, d.num_output) == ("length", 5)
    assert all(r.status == FINISHED and r.blocks == [] for r in (a, b, c, d))
    assert e.pool.num_free() == e.pool.num_blocks - 1


def test_max_model_len_ends_a_request():
    e = small_engine(budget=512, max_model_len=20)
    r = req("r", 15, max_tokens=100)
    e.add_request(r)
    while e.has_work():
        e.step(0.0)
    assert r.finish_reason == "length" and len(r.token_ids) == 20


def test_abort_frees_blocks():
    e = small_engine(budget=512)
    r = req("r", 100)
    e.add_request(r)
    e.step(0.0)
    assert e.pool.num_free() < e.pool.num_blocks - 1
    assert e.abort(r) and r.finish_reason == "abort"
    assert e.pool.num_free() == e.pool.num_blocks - 1 and not e.has_work()
    assert not e.abort(r)


# -- the cost model ---------------------------------------------------------------------------

def test_prefill_is_compute_bound_and_decode_memory_bound():
    m, g = get_model("llama-3.1-8b"), get_gpu("H200")
    c = CostModel(m, g)
    decode1 = c.step_time(1, 1000, 1001, 1, 1)
    weights_s = c.weight_bytes / c.achieved_bw
    assert decode1 == pytest.approx(weights_s + c.step_overhead_s + c.per_req_overhead_s, rel=0.1)
    assert c.step_time(1, 100000, 100001, 1, 1) > 1.5 * decode1  # a long context: KV reads dominate
    prefill = c.step_time(8192, 8192 * 8193 // 2, 2 * 8192, 1, 1)
    assert prefill > 20 * decode1
    assert 8192 / prefill > 10 * (1 / decode1)  # prefill tokens/s >> decode tokens/s per request
    # Decoding 64 requests (1k context each) costs well under 2x one: batching pays.
    assert decode1 < c.step_time(64, 64 * 1000, 64 * 1001, 64, 64) < 2 * decode1


def test_tensor_parallel_and_fp8_kv_change_what_they_should():
    m, g = get_model("llama-3.1-70b"), get_gpu("H100-80G")
    c1, c4 = CostModel(m, g, tp=4), CostModel(m, g, tp=2)
    assert c1.step_time(1, 10, 11, 1, 1) < c4.step_time(1, 10, 11, 1, 1)
    assert CostModel(m, g, kv_dtype_bytes=1).kv_bytes_per_token == CostModel(m, g).kv_bytes_per_token / 2


def test_noise_is_seeded_and_about_the_requested_size():
    assert Noise(0.0).factor(1.0) == 1.0
    a, b = Noise(0.02, seed=3), Noise(0.02, seed=3)
    assert [a.factor(t) for t in range(5)] == [b.factor(t) for t in range(5)]
    # Run means over 20 s "runs" separated by idle gaps differ by about 2 %.
    n = Noise(0.02, seed=11)
    means = []
    t = 0.0
    for _ in range(200):
        fs = []
        for _ in range(400):
            fs.append(n.factor(t))
            t += 0.05
            n.note_end(t)
        means.append(sum(fs) / len(fs))
        t += 5.0  # idle gap: a new run
    diffs = [abs(x - y) / y for x, y in zip(means[1:], means, strict=False)]
    mean_diff = sum(diffs) / len(diffs)
    # E|X - Y| for two runs with sd 2 % each is 2 x 2 % / sqrt(pi) = 2.26 %.
    assert 0.018 < mean_diff < 0.027
    drift = Noise(0.0, drift_per_hour=0.1)
    drift.factor(0.0)
    assert drift.factor(3600.0) == pytest.approx(1.1)


def test_a_slowdown_is_one_step_at_its_age_and_a_restart_does_not_undo_it():
    step = Noise(0.0, slowdown=1.3, slowdown_after_s=10.0)
    assert [step.factor(t) for t in (5.0, 14.99, 15.0, 500.0)] == [1.0, 1.0, 1.3, 1.3]  # ages from the first step
    # a process started 12 s into the drift's clock is slow from its first step
    assert Noise(0.0, drift_offset_s=12.0, slowdown=1.3, slowdown_after_s=10.0).factor(100.0) == 1.3


def test_restart_noise_is_a_draw_per_start_deterministic_given_seed_and_start():
    one, again = Noise(0.02, seed=11, restart_sigma=0.015, start_index=1), Noise(0.02, seed=11, restart_sigma=0.015, start_index=1)
    two = Noise(0.02, seed=11, restart_sigma=0.015, start_index=2)
    assert one.start_factor == again.start_factor != two.start_factor
    assert [one.factor(t) for t in range(5)] == [again.factor(t) for t in range(5)]
    assert Noise(0.02, seed=11, start_index=1).start_factor == 1.0  # restart_sigma 0: no between part
    levels = [math.log(Noise(0.0, seed=11, restart_sigma=0.015, start_index=k).start_factor) for k in range(1, 2001)]
    sd = (sum(x * x for x in levels) / len(levels)) ** 0.5
    assert 0.014 < sd < 0.016  # 2,000 draws: the sd's own sd is 0.015 / sqrt(4000) = 0.00024


def test_realised_noise_components_match_the_settings_in_virtual_time():
    """80 starts x 4 back-to-back runs (distinct prompts, 1 s idle between runs) on the engine:
    the variance-components estimate of log output throughput recovers 2 % within, 1.5 % between
    (plus the slow wander's 0.5 %, which stays put over one start's few runs)."""
    from vkit.decide.stats import variance_components
    from vkit.sim.harness import random_prompts

    groups = []
    for k in range(80):
        eng = engine_for(noise=Noise(0.02, seed=7, regime_gap_s=0.5, restart_sigma=0.015, start_index=k + 1))
        t, vals = 0.0, []
        for j in range(4):
            prompts = random_prompts(32, 256, seed=100 * k + j)
            out = simulate(eng, [SimRequest(prompt_ids=p, max_tokens=32, arrival=t) for p in prompts], concurrency=16)
            vals.append(math.log(out["output_tok_s"]))
            t = max(tm.token_times[-1] for tm in out["timings"]) + 1.0
        groups.append(vals)
    vc = variance_components(groups)
    assert vc.within_ci[0] < 0.02 < vc.within_ci[1]
    assert vc.between_ci[0] < (0.015 ** 2 + 0.005 ** 2) ** 0.5 < vc.between_ci[1]
    assert 0.0175 < vc.within < 0.0225 and 0.012 < vc.between < 0.021


# -- configuration and start-up failures --------------------------------------------------------

def opts(**kw) -> ServeOptions:
    return ServeOptions(model="m", gpu=get_gpu(kw.pop("gpu", "H200")), model_profile=get_model(kw.pop("model", "llama-3.1-8b")), **kw)


def test_v1_defaults_per_device():
    assert batch_defaults(GPUS["H200"]) == (8192, 1024)
    assert batch_defaults(GPUS["H100-80G"]) == (8192, 1024)
    assert batch_defaults(GPUS["A100-80G"]) == (2048, 256)
    assert batch_defaults(GPUS["L40S"]) == (2048, 256)
    r = resolve(opts())
    assert (r.max_model_len, r.max_num_batched_tokens, r.max_num_seqs) == (131072, 8192, 1024)
    assert r.enable_chunked_prefill and r.enable_prefix_caching and r.gpu_memory_utilization == 0.92
    r = resolve(opts(enable_chunked_prefill=False, max_model_len=16384))
    assert r.max_num_batched_tokens == 16384
    r = resolve(opts(enable_chunked_prefill=False, max_model_len=4096))
    assert r.max_num_batched_tokens == 8192


def test_kv_capacity_follows_the_memory_model():
    r = resolve(opts())
    m = get_model("llama-3.1-8b")
    per_token = 2 * m.layers * m.kv_heads * m.head_dim * 2
    assert r.kv_cache_tokens == r.available_kv_bytes_per_gpu // (per_token * 16) * 16
    assert 850_000 < r.kv_cache_tokens < 1_000_000  # ~112 GiB of KV at 128 KiB/token
    r2 = resolve(opts(gpu_memory_utilization=0.8))
    assert r2.kv_cache_tokens < r.kv_cache_tokens
    r3 = resolve(opts(kv_cache_dtype="fp8"))
    assert r3.kv_cache_tokens == pytest.approx(2 * r.kv_cache_tokens, rel=0.001)


def test_max_model_len_above_the_model_fails_like_vllm():
    with pytest.raises(SimStartupError) as ei:
        resolve(opts(max_model_len=200000))
    e = ei.value
    assert e.stage == "frontend" and e.exc_type == "pydantic_core._pydantic_core.ValidationError"
    assert "User-specified max_model_len (200000) is greater than the derived max_model_len " \
           "(max_position_embeddings=131072.0 or model_max_length=None in model's config.json)" in e.message
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in e.message
    r = resolve(opts(max_model_len=200000, allow_long_max_model_len=True))
    assert r.max_model_len == 200000 and r.warnings


def test_kv_cache_too_small_gives_the_estimated_maximum_model_length():
    with pytest.raises(SimStartupError) as ei:
        resolve(opts(model="llama-3.1-70b", gpu="H100-80G", tensor_parallel_size=2))
    e = ei.value
    assert e.stage == "engine" and e.exc_type == "ValueError"
    assert e.message.startswith("To serve at least one request with the model's max seq len (131072), (")
    assert "GiB KV cache is needed, which is larger than the available KV cache memory (" in e.message
    est = int(e.message.split("the estimated maximum model length is ")[1].split(".")[0])
    assert 0 < est < 131072 and est % 16 == 0
    ok = resolve(opts(model="llama-3.1-70b", gpu="H100-80G", tensor_parallel_size=2, max_model_len=est))
    assert ok.kv_cache_tokens >= est
    with pytest.raises(SimStartupError):
        resolve(opts(model="llama-3.1-70b", gpu="H100-80G", tensor_parallel_size=2, max_model_len=est + 16))


def test_auto_max_model_len_fits_the_kv_cache():
    r = resolve(opts(model="llama-3.1-70b", gpu="H100-80G", tensor_parallel_size=2, max_model_len=-1))
    assert r.max_model_len < 131072 and r.max_concurrency >= 1.0


def test_weights_that_do_not_fit_leave_no_memory_for_the_cache():
    with pytest.raises(SimStartupError) as ei:
        resolve(opts(model="llama-3.1-70b", gpu="H200"))
    assert ei.value.message.startswith("No available memory for the cache blocks.")
    with pytest.raises(SimStartupError) as ei:
        resolve(opts(model="llama-3.1-70b", gpu="L40S"))
    assert ei.value.exc_type == "torch.OutOfMemoryError"


def test_scheduler_config_validation_errors():
    with pytest.raises(SimStartupError) as ei:
        resolve(opts(max_model_len=2048, max_num_batched_tokens=1024, enable_chunked_prefill=False))
    assert "1 validation error for SchedulerConfig" in ei.value.message
    assert "max_num_batched_tokens (1024) is smaller than max_model_len (2048)." in ei.value.message
    with pytest.raises(SimStartupError) as ei:
        resolve(opts(max_num_batched_tokens=100, max_num_seqs=256))
    assert "max_num_batched_tokens (100) must be greater than or equal to max_num_seqs (256)." in ei.value.message
    with pytest.raises(SimStartupError) as ei:
        resolve(opts(tensor_parallel_size=3))
    assert "must be divisible by tensor parallel size (3)" in ei.value.message


def test_profiles_are_consistent():
    for m in MODELS.values():
        assert m.heads * m.head_dim >= m.hidden * 0.99
        assert 0 < m.body_params < m.params
    datasheets = [g for g in GPUS.values() if g.name != "CPU"]  # the host CPU's peaks are nominal (profiles.py)
    assert len(datasheets) == len(GPUS) - 1
    for g in datasheets:
        assert g.memory_bytes > 40 * (1 << 30) and g.peak_bf16_flops > 1e14 and g.hbm_bytes_per_s > 5e11
    cpu = GPUS["CPU"]
    assert cpu.peak_bf16_flops < min(g.peak_bf16_flops for g in datasheets) and cpu.peak_fp8_flops == 0


# -- tokenizer and metric helpers ---------------------------------------------------------------

def test_tokenizer_is_deterministic_and_self_consistent():
    t = Tokenizer(128256)
    assert t.pieces("Hello world") == ["Hell", "o", " worl", "d"]
    assert t.encode("a b") == t.encode("a b") and len(t.encode("  x\n")) == 3
    assert all(len(t.pieces(w)) == 1 for w in OUTPUT_WORDS)
    text = "".join(t.text_of(t.output_token(5, i)) for i in range(40))
    assert len(t.encode(text)) == 40
    assert render_chat([{"role": "user", "content": "hi"}]) == "<|user|>\nhi\n<|assistant|>\n"
    assert all(256 <= i < 128256 for i in t.encode("some text, with punctuation!"))


def test_bucket_helpers_match_vllm():
    assert build_1_2_5_buckets(100) == [1, 2, 5, 10, 20, 50, 100]
    assert go_float(1.0) == "1.0" and go_float(float("inf")) == "+Inf"
    assert go_float(1732900000.5) == "1.7329000005e+09"


# -- physics in virtual time: the seeds' behaviour emerges -----------------------------------------

def test_knee_throughput_plateaus_while_p95_ttft_rises():
    """Default profile (8B, H200, V1 defaults), a concurrency sweep: tokens/s stops rising
    while P95 TTFT keeps growing, and too many sequences bring preemptions."""
    rows = {}
    for s in (32, 128, 256, 512, 1024):
        eng = engine_for(max_num_seqs=s)
        reqs = [SimRequest(p, 256) for p in distinct_prompts(2 * s, 2048, salt=s)]
        rows[s] = simulate(eng, reqs, concurrency=s)
    thr = {s: r["output_tok_s"] for s, r in rows.items()}
    ttft = {s: r["ttft_p95_s"] for s, r in rows.items()}
    assert thr[128] > 1.2 * thr[32]  # below the knee, more sequences pay
    assert abs(thr[1024] / thr[256] - 1) < 0.05  # past it, throughput is flat
    assert abs(thr[512] / thr[256] - 1) < 0.05
    assert ttft[1024] > 3 * ttft[256] and ttft[512] > 1.5 * ttft[256]  # while P95 TTFT rises
    assert rows[256]["preemptions"] == 0 and rows[1024]["preemptions"] > 0


def test_larger_budget_helps_ttft_and_hurts_itl():
    import random

    def workload(seed):
        rng = random.Random(seed)
        t, out = 0.0, []
        for k in range(240):
            t += rng.expovariate(8.0)
            out.append(SimRequest(distinct_prompts(1, rng.choice([128, 512, 2048, 6000]), salt=k)[0], 128, arrival=t))
        return out

    res = {}
    for b in (1024, 8192):
        r = simulate(engine_for(max_num_seqs=64, max_num_batched_tokens=b), workload(3))
        itl = [y - x for tm in r["timings"] for x, y in zip(tm.token_times, tm.token_times[1:], strict=False)]
        res[b] = (r["ttft_p50_s"], percentile(itl, 99.5), r["output_tok_s"])
    assert res[8192][0] < 0.95 * res[1024][0]  # TTFT better with the larger budget
    assert res[8192][1] > 2 * res[1024][1]  # ITL tail worse: long prefill steps stall decodes
    assert res[8192][2] == pytest.approx(res[1024][2], rel=0.05)


def test_short_prefill_pathology_is_fixed_by_chunked_prefill():
    def ttft(chunked, patho):
        eng = engine_for(gpu="Ascend-910B", max_num_seqs=64, max_model_len=4096,
                         enable_chunked_prefill=chunked, pathology=patho)
        reqs = [SimRequest(p, 64, arrival=i * 1.0) for i, p in enumerate(distinct_prompts(10, 63))]
        return simulate(eng, reqs)["ttft_p50_s"]

    healthy, sick, fixed = ttft(False, False), ttft(False, True), ttft(True, True)
    assert sick == pytest.approx(10 * healthy, rel=0.15)
    assert fixed == pytest.approx(healthy, rel=0.01)


def test_simulation_is_deterministic_without_noise():
    def run():
        r = simulate(engine_for(max_num_seqs=16), [SimRequest(p, 32) for p in distinct_prompts(32, 300)], concurrency=16)
        return r["duration_s"], r["steps"]

    assert run() == run()
    assert math.isfinite(run()[0])


def test_the_block_pool_hands_out_blocks_in_vllms_free_queue_order():
    """The pool keeps the never-used blocks as a count: under random takes, frees and prefix-cache
    touches it hands out the same blocks in the same order as vLLM's queue of every block, here one
    OrderedDict entry per block (front: taken first; a freed block joins the end)."""
    import random
    from collections import OrderedDict

    from vkit.sim.engine import BlockPool

    rng = random.Random(7)
    pool, queue = BlockPool(40, enable_caching=True), OrderedDict((b, None) for b in range(1, 40))
    held: list[list[int]] = []
    freed: list[int] = []  # freed blocks a prefix-cache hit may take back out of the queue
    for _ in range(3000):
        op = rng.random()
        if op < 0.45 and pool.num_free():
            n = rng.randint(1, min(5, pool.num_free()))
            want = [queue.popitem(last=False)[0] for _ in range(n)]
            got = pool.take(n)
            assert got == want
            held.append(got)
        elif op < 0.85 and held:
            blocks = held.pop(rng.randrange(len(held)))
            pool.release(reversed(blocks))
            for b in reversed(blocks):
                queue[b] = None
            freed.extend(blocks)
        elif freed:
            b = freed.pop(rng.randrange(len(freed)))
            if b in queue and pool.ref[b] == 0:
                pool.touch([b])
                del queue[b]
                held.append([b])
        assert pool.num_free() == len(queue)
    assert pool.usage() == pytest.approx(1 - len(queue) / 39)
    assert BlockPool(1, False).num_free() == 0 and BlockPool(0, False).num_free() == 0
