"""The search library: Pareto, dominance, knee, hypervolume, GP/EI/EHVI, staged plan, proposals, replay.

Known answers on constructed inputs; every random draw has a fixed seed.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import optimize, stats

from vkit.apply.policy import Policy
from vkit.errors import UsageError
from vkit.search import (
    GP,
    Objective,
    Observation,
    Param,
    StagedPlan,
    ablation_configs,
    deliver,
    dominance_rate,
    ehvi_2d,
    ei,
    flag_variants,
    grid_levels,
    hypervolume_2d,
    key_of,
    knee_of_sweep,
    knee_point,
    log_ei,
    log_record,
    nondominated_probability,
    pareto_indices,
    propose,
    recommend,
    replay,
    replay_mismatches,
    space_from_policy,
)

pytestmark = pytest.mark.unit

OBJ = [Objective("goodput", "max"), Objective("p95_ttft_ms", "min")]
SPACE = [
    Param("max_num_batched_tokens", "int", 512, 32768, log=True, candidates=[2048, 4096, 8192, 16384]),
    Param("max_num_seqs", "int", 8, 512, log=True, candidates=[8, 16, 32, 64, 128]),
]
BASE = {"max_model_len": 4096}


def obs(goodput, p95, config=None, repeats=None, **kw):
    return Observation(config=config or {}, objectives={"goodput": goodput, "p95_ttft_ms": p95}, repeats=repeats or [], **kw)


# -- a deterministic synthetic surface: throughput saturates in seqs, P95 rises past a knee --
def surface(cfg):
    b, s = cfg["max_num_batched_tokens"], cfg["max_num_seqs"]
    if b < s:
        return None  # vLLM refuses max_num_batched_tokens < max_num_seqs
    thr = 3000.0 * (1 - math.exp(-s / 20.0)) * (1 - 0.05 * abs(math.log2(b / 8192)))
    p95 = 400.0 * (1 + (s / 64.0) ** 2) * (8192.0 / b) ** 0.25
    return {"goodput": thr, "p95_ttft_ms": p95}


def measured(cfg, step=None, rng=None, n=3, sigma=0.02):
    t = surface(cfg)
    if t is None:
        return Observation(config=cfg, feasible=False, step=step)
    reps = []
    for _ in range(n):
        reps.append({k: v * (math.exp(sigma * rng.standard_normal()) if rng is not None else 1.0) for k, v in t.items()})
    agg = {k: float(np.mean([r[k] for r in reps])) for k in t}
    return Observation(config=cfg, objectives=agg, repeats=reps, step=step)


def run_mode(mode, budget=14, seed=3, slo=None, **opts):
    rng = np.random.default_rng(seed)
    hist, props = [], []
    while True:
        p = propose(mode, SPACE, hist, BASE, OBJ, slo, budget, seed, **opts)
        if p is None:
            return hist, props
        props.append(p)
        hist.append(measured(p.config, p.step, rng))


# -- Pareto, dominance, knee, hypervolume ---------------------------------------------------
def test_pareto_indices_constructed_front():
    pts = np.array([[10, 100], [20, 200], [15, 300], [20, 200], [5, 50], [25, 400], [12, 100]])
    # max goodput, min latency: [15,300] is dominated by [20,200]; [10,100] by [12,100]
    assert pareto_indices(pts, ["max", "min"]) == [1, 3, 4, 5, 6]
    assert pareto_indices(pts, ["min", "min"]) == [4]
    assert pareto_indices(np.empty((0, 2)), ["max", "min"]) == []


def test_dominance_rate_counts_what_each_config_beats():
    hist = [obs(100, 10), obs(90, 20), obs(80, 30), obs(110, 40), obs(70, 5),
            Observation(config={}, feasible=False)]
    rate = dominance_rate(hist, OBJ)
    assert set(rate) == {0, 1, 2, 3, 4}  # the failed start has no rate
    assert rate[0] == pytest.approx(2 / 4)  # beats 1 and 2
    assert rate[1] == pytest.approx(1 / 4)  # beats 2
    assert rate[2] == 0.0 and rate[3] == 0.0 and rate[4] == 0.0


def test_nondominated_probability_reflects_repeat_noise():
    def reps(g, p):  # three repeats ±1% around (g, p)
        return [{"goodput": g * f, "p95_ttft_ms": p * f} for f in (0.99, 1.0, 1.01)]
    hist = [
        obs(100, 10, repeats=reps(100, 10)),
        obs(100.2, 10.0, repeats=reps(100.2, 10.0)),  # a noise-level twin of 0: dominates it by the means
        obs(50, 40, repeats=reps(50, 40)),  # clearly dominated
    ]
    p = nondominated_probability(hist, OBJ, seed=0)
    assert p == nondominated_probability(hist, OBJ, seed=0)  # deterministic
    assert p[2] == 0.0 and p[1] > 0.5 and 0.1 < p[0] < 0.9
    no_noise = nondominated_probability([obs(100, 10), obs(90, 20), obs(80, 5)], OBJ)
    assert no_noise == {0: 1.0, 1: 0.0, 2: 1.0}


def test_knee_on_a_front_with_an_obvious_knee():
    # minimise both: the bend at (0.1, 0.2)
    pts = np.array([[0.0, 1.0], [0.1, 0.2], [0.5, 0.1], [1.0, 0.0], [0.6, 0.6]])
    for method in ("emu", "distance", "hv"):
        idx, how = knee_point(pts, ["min", "min"], method)
        assert idx == 1, method
        assert how
    # the same front as throughput (max) vs latency (min)
    thr = np.column_stack([1.0 - pts[:, 0], pts[:, 1]])
    assert knee_point(thr, ["max", "min"])[0] == 1
    assert "Branke" in knee_point(thr, ["max", "min"])[1]
    with pytest.raises(ValueError):
        knee_point(pts, ["min", "min"], "bogus")


def test_hypervolume_of_constructed_fronts():
    front = np.array([[1.0, 3.0], [2.0, 2.0], [3.0, 1.0]])
    assert hypervolume_2d(front, ["min", "min"], [4.0, 4.0]) == pytest.approx(6.0)
    # a dominated point and a point beyond the reference change nothing
    more = np.vstack([front, [[3.5, 3.5], [5.0, 0.5]]])
    assert hypervolume_2d(more, ["min", "min"], [4.0, 4.0]) == pytest.approx(6.0)
    # throughput (max) vs latency (min): the mirror image has the same area
    mirrored = np.column_stack([-front[:, 0], front[:, 1]])
    assert hypervolume_2d(mirrored, ["max", "min"], [-4.0, 4.0]) == pytest.approx(6.0)
    assert hypervolume_2d(np.empty((0, 2)), ["min", "min"], [1, 1]) == 0.0


# -- GP, EI, EHVI ----------------------------------------------------------------------------
def test_gp_interpolates_noiseless_data_and_shrinks_variance():
    X = np.array([[0.1], [0.3], [0.5], [0.7], [0.9]])
    y = np.sin(6 * X[:, 0])
    gp = GP().fit(X, y, seed=0)
    mu, var = gp.predict(X)
    assert np.max(np.abs(mu - y)) < 0.02 * np.ptp(y)
    _, var_far = gp.predict(np.array([[0.2], [0.4], [3.0]]))
    assert var.max() < var_far[:2].min() < var_far[2]
    assert gp.sn2 < 1e-2  # it learned that the data are (nearly) noiseless


def test_gp_marginal_likelihood_gradient_is_exact():
    rng = np.random.default_rng(1)
    X = rng.random((10, 2))
    y = np.sin(3 * X[:, 0]) + X[:, 1]
    gp = GP()
    ys = (y - y.mean()) / y.std()
    theta = np.array([-1.0, 0.3, 0.2, -3.0])
    err = optimize.check_grad(lambda t: gp._nlp(t, X, ys)[0], lambda t: gp._nlp(t, X, ys)[1], theta)
    assert err < 1e-4


def test_log_ei_matches_the_closed_form_and_does_not_underflow():
    mu = np.array([0.0, 0.5, 1.0, -2.0, 3.0])
    sd = np.array([1.0, 0.3, 2.0, 0.5, 1.0])
    best = 0.8
    closed = (mu - best) * stats.norm.cdf((mu - best) / sd) + sd * stats.norm.pdf((mu - best) / sd)
    np.testing.assert_allclose(np.exp(log_ei(mu, sd, best)), closed, rtol=1e-9)
    np.testing.assert_allclose(ei(mu, sd, best), closed, rtol=1e-12)
    # far below the incumbent EI underflows to 0 in floating point; log EI stays finite and ordered
    far = log_ei(np.array([-20.0, -40.0, -400.0]), np.ones(3), 0.0)
    assert np.all(np.isfinite(far)) and far[0] > far[1] > far[2]
    assert far[0] == pytest.approx(math.log(stats.norm.pdf(20.0)) - 2 * math.log(20.0), abs=0.01)


def test_ehvi_matches_monte_carlo():
    front = np.array([[1.0, 4.0], [2.0, 2.5], [3.5, 1.0]])
    ref = np.array([5.0, 5.0])
    mu = np.array([[2.2, 2.0], [0.5, 4.5], [4.0, 4.0]])
    sd = np.array([[0.6, 0.8], [0.3, 0.4], [0.5, 0.5]])
    exact = ehvi_2d(front, ref, mu, sd)
    rng = np.random.default_rng(0)
    base = hypervolume_2d(front, ["min", "min"], ref)
    for j in range(len(mu)):
        ys = mu[j] + sd[j] * rng.standard_normal((20000, 2))
        hvi = np.array([hypervolume_2d(np.vstack([front, y]), ["min", "min"], ref) - base for y in ys])
        se = hvi.std() / math.sqrt(len(hvi))
        assert abs(exact[j] - hvi.mean()) < 4 * se + 1e-9, (j, exact[j], hvi.mean(), se)
    assert exact[0] > exact[2]


# -- staged ----------------------------------------------------------------------------------
def test_knee_of_sweep_known_answers():
    xs = [8, 16, 32, 64, 128]
    k = knee_of_sweep(xs, [1000, 1800, 2600, 2650, 2660], [100, 110, 130, 200, 400], 0.03, name="max_num_seqs")
    assert (k["index"], k["x"], k["found"], k["kind"]) == (2, 32, True, "knee")
    assert "knee at max_num_seqs=32" in k["why"] and "+1.9% throughput (< 3%)" in k["why"] and "+53.8% P95" in k["why"]
    slo = knee_of_sweep(xs, [1000, 1800, 2600, 3400, 4000], [100, 110, 130, 200, 400], 0.03, slo=150)
    assert (slo["x"], slo["kind"]) == (32, "slo")
    rising = knee_of_sweep(xs, [1000, 1800, 2600, 3400, 4000], [100, 110, 130, 200, 400], 0.03)
    assert not rising["found"] and rising["x"] == 128
    # a plateau where latency improves is not a knee: latency still pays for the extra sequences
    improving = knee_of_sweep([32, 64, 128], [2000, 2010, 2020], [900, 600, 300], 0.03)
    assert not improving["found"]


def test_staged_plan_walks_steps_2_3_4_on_a_deterministic_surface():
    plan = StagedPlan(SPACE, BASE, OBJ, slo={"p95_ttft_ms": 1500}, gain_threshold=0.03)
    hist, steps = [], []
    while (p := plan.next(hist)) is not None:
        steps.append((p.step, p.config["max_num_batched_tokens"], p.config["max_num_seqs"]))
        hist.append(measured(p.config, p.step))
        assert len(hist) < 30
    # step 2: the policy's token candidates at max_num_seqs 64
    assert steps[:4] == [("2", 2048, 64), ("2", 4096, 64), ("2", 8192, 64), ("2", 16384, 64)]
    # all four meet the SLO at seqs 64 (P95 1131 … 673 ms); the highest throughput is at 8192.
    # Step 3 sweeps seqs from 8 up at 8192, reusing the step-2 measurement at 64
    assert [s for s in steps if s[0] == "3"] == [("3", 8192, 8), ("3", 8192, 16), ("3", 8192, 32), ("3", 8192, 128)]
    st = plan.state(hist)
    assert st["best_tokens"] == 8192
    # 64 → 128: +4.1% throughput, but P95 800 → 2000 ms breaks the 1500 ms SLO: SLO-bound knee at 64
    assert st["knee"]["x"] == 64 and st["knee"]["kind"] == "slo"
    # step 4: midpoints around the knee: seqs {48, 96} x tokens {6144, 12288}
    assert sorted(s[1:] for s in steps if s[0] == "4") == [(6144, 48), (6144, 96), (12288, 48), (12288, 96)]
    reason = plan.stop_reason(hist)
    assert reason.startswith("plan done") and "max_num_seqs=64" in reason and "max_num_batched_tokens=8192" in reason
    # resumable: the plan re-derives its place from any prefix of the history
    assert plan.next(hist[:6]).config == {**BASE, "max_num_batched_tokens": 8192, "max_num_seqs": 32}


def test_staged_plan_knee_without_slo_and_single_step():
    plan = StagedPlan(SPACE, {**BASE, "max_num_batched_tokens": 8192}, OBJ, slo=None, steps=("3",))
    hist, reasons = [], []
    while (p := plan.next(hist)) is not None:
        assert p.step == "3" and p.config["max_num_batched_tokens"] == 8192
        hist.append(measured(p.config, p.step))
        reasons.append(p.reason)
    knee = plan.state(hist)["knee"]
    # 64 → 128 adds +4.1% throughput: not yet the knee at 3%, so the sweep goes on past the
    # candidates (x2: 256), where the gain is +0.2%: the knee is 128
    assert [h.config["max_num_seqs"] for h in hist] == [8, 16, 32, 64, 128, 256]
    assert "past the candidates: 128 still gained +4.1%" in reasons[-1]
    assert knee["x"] == 128 and knee["found"] and knee["kind"] == "knee"
    # with a 5% threshold the knee is 64, and the sweep never leaves the candidates
    plan5 = StagedPlan(SPACE, {**BASE, "max_num_batched_tokens": 8192}, OBJ, slo=None, steps=("3",), gain_threshold=0.05)
    assert plan5.state(hist)["knee"]["x"] == 64
    assert "knee at max_num_seqs=64: 128 adds +4.1% throughput (< 5%) for +150.0% P95" in plan5.stop_reason(hist)


def test_staged_sweep_past_the_candidates_stops_at_the_range_and_after_three_doublings():
    """A sweep still gaining at 128 doubles at most three times (256, 512, 1024), inside the range."""
    rising = lambda cfg, step: Observation(config=cfg, step=step, objectives={  # noqa: E731
        "goodput": 100.0 * cfg["max_num_seqs"], "p95_ttft_ms": 500.0}, repeats=[])
    wide = [SPACE[0], Param("max_num_seqs", "int", 8, 4096, log=True, candidates=[8, 16, 32, 64, 128])]
    for space, tail in ((wide, [256, 512, 1024]), (SPACE, [256, 512])):
        plan = StagedPlan(space, {**BASE, "max_num_batched_tokens": 8192}, OBJ, slo=None, steps=("3",))
        hist = []
        while (p := plan.next(hist)) is not None:
            hist.append(rising(p.config, p.step))
        assert [h.config["max_num_seqs"] for h in hist] == [8, 16, 32, 64, 128, *tail]
        assert plan.state(hist)["knee"]["x"] == tail[-1] and not plan.state(hist)["knee"]["found"]


def test_staged_safe_seqs_follow_the_load():
    assert StagedPlan(SPACE, BASE, OBJ).safe == 64
    assert StagedPlan(SPACE, BASE, OBJ, load_concurrency=100).safe == 128
    assert StagedPlan(SPACE, BASE, OBJ, tokens_candidates="octaves").tok_c == [512, 1024, 2048, 4096, 8192, 16384, 32768]


def test_flag_variants_and_ablation():
    space = [Param("enable_prefix_caching", "bool"), Param("scheduling_policy", "choice", choices=["fcfs", "priority"])]
    base = {"enable_prefix_caching": True, "scheduling_policy": "fcfs"}
    assert [lab for lab, _ in flag_variants(base, space)] == ["enable_prefix_caching=False", "scheduling_policy=priority"]
    abl = ablation_configs({"a": 1, "b": 2}, {"a": 5, "b": 7})
    assert abl == [("a", {"a": 5, "b": 2}), ("b", {"a": 1, "b": 7})]
    assert ablation_configs({"a": 1}, {"a": 2}) == []  # one change: nothing to attribute


# -- propose -----------------------------------------------------------------------------------
def test_bo_never_repeats_and_is_deterministic():
    hist, props = run_mode("bo", budget=14, seed=3, slo={"p95_ttft_ms": 1500})
    keys = [key_of(p.config, SPACE) for p in props]
    assert len(keys) == 14 and len(set(keys)) == 14
    phases = [p.audit["phase"] for p in props]
    assert phases[:4] == ["sobol"] * 4  # n0 = max(4, 14 // 4)
    assert phases[8] == "random" and props[8].step == "random"  # every 5th after the start
    acq = props[4].audit
    assert acq["acquisition"]["runner_up"] is not None and "lengthscales" in acq["surrogate"]["goodput"]
    assert acq["inputs_digest"] and acq["seed"] == 3 and acq["random"] is False
    again = [p.config for p in run_mode("bo", budget=14, seed=3, slo={"p95_ttft_ms": 1500})[1]]
    assert again == [p.config for p in props]
    other = [p.config for p in run_mode("bo", budget=14, seed=4, slo={"p95_ttft_ms": 1500})[1]]
    assert other != again
    json.dumps([p.to_dict() for p in props])  # audits are JSON-able


def test_replay_reproduces_logged_proposals():
    rng = np.random.default_rng(0)
    hist, records = [], []
    for _ in range(7):
        p = propose("bo", SPACE, hist, BASE, OBJ, {"p95_ttft_ms": 1500}, 10, 11, n_init=4)
        records.append(json.loads(json.dumps(log_record("bo", SPACE, hist, BASE, OBJ, {"p95_ttft_ms": 1500}, 10, 11, p, n_init=4))))
        hist.append(measured(p.config, p.step, rng))
    again = replay(records)
    assert [p.config for p in again] == [r["proposal"]["config"] for r in records]
    assert replay_mismatches(records) == []
    records[5]["proposal"]["config"]["max_num_seqs"] = 3
    assert [m["record"] for m in replay_mismatches(records)] == [5]


def test_random_grid_and_budget():
    hist, props = run_mode("random", budget=10, seed=1)
    assert len({key_of(p.config, SPACE) for p in props}) == 10
    levels = grid_levels(SPACE, 20)
    assert [len(lv) for lv in levels] == [5, 4] or [len(lv) for lv in levels] == [4, 5]
    assert [len(lv) for lv in grid_levels(SPACE, 40)] == [6, 6]
    hist, props = run_mode("grid", budget=40, seed=1)
    assert len(props) == 36 and {p.step for p in props} == {"grid"}  # the 6 x 6 grid, then exhausted
    assert propose("bo", SPACE, hist, BASE, OBJ, None, len(hist), 1) is None  # budget spent
    small = [Param("max_num_seqs", "int", 8, 16, log=True)]
    h = []
    while (p := propose("grid", small, h, BASE, [Objective("goodput", "max")], None, 10, 0)) is not None:
        h.append(Observation(p.config, {"goodput": 1.0}))
    assert sorted(o.config["max_num_seqs"] for o in h) == [8, 12, 16]  # grid exhausted → None


def test_infeasible_points_steer_proposals_away():
    """Goodput rises with max_num_seqs, but every start at max_num_seqs >= 192 failed. Without
    the failures in the history the acquisition heads for the large values; with them it stays below."""
    rng = np.random.default_rng(5)
    hist = []
    for b in (512, 1024, 2048, 4096, 8192, 16384, 32768):
        for s in (8, 16, 32, 64, 96, 128):
            cfg = {**BASE, "max_num_batched_tokens": b, "max_num_seqs": s}
            g = 1000 * math.log2(s) * (1 + 0.01 * rng.standard_normal())
            hist.append(Observation(cfg, {"goodput": g, "p95_ttft_ms": 100.0}))
    fails = [Observation({**BASE, "max_num_batched_tokens": b, "max_num_seqs": s}, feasible=False)
             for b in (768, 2048, 8192, 32768) for s in (192, 384, 512)]
    objs = [Objective("goodput", "max")]
    with_fail = propose("bo", SPACE, hist + fails, BASE, objs, None, 100, 0, random_every=0)
    without = propose("bo", SPACE, hist, BASE, objs, None, 100, 0, random_every=0)
    assert without.config["max_num_seqs"] >= 192
    assert with_fail.config["max_num_seqs"] <= 128
    assert with_fail.audit["acquisition"]["chosen_log_pof"]["startup"] > math.log(0.5)
    assert "startup_classifier" in with_fail.audit["surrogate"]


# -- recommend and deliver -----------------------------------------------------------------------
def test_recommend_respects_the_slo_with_a_confidence_margin():
    def reps(g, p):
        return [{"goodput": g * f, "p95_ttft_ms": p * f} for f in (0.98, 1.0, 1.02)]
    hist = [
        obs(2000, 995, {"id": "a"}, reps(2000, 995)),  # just under the SLO: not safely under
        obs(1900, 900, {"id": "b"}, reps(1900, 900)),
        obs(2500, 1500, {"id": "c"}, reps(2500, 1500)),  # breaks it
        Observation({"id": "d"}, feasible=False),
    ]
    goal = {"maximize": "goodput", "subject_to": {"p95_ttft_ms": 1000}}
    idx, why = recommend(hist, OBJ, goal)
    assert idx == 1 and "p95_ttft_ms <= 1000" in why
    assert recommend(hist, OBJ, {**goal, "confidence": 0.5})[0] == 0
    assert recommend(hist, OBJ, {"maximize": "goodput"})[0] == 2
    none, why = recommend(hist[2:], OBJ, goal)
    assert none is None and "no evaluated configuration meets" in why
    hist[1].slo_ok = False  # the runner's own SLO verdict wins
    assert recommend(hist, OBJ, {**goal, "confidence": 0.5})[0] == 0


def test_deliver_front_knee_and_recommendation():
    hist = [obs(1000, 100, {"s": 8}), obs(1800, 150, {"s": 16}), obs(2500, 250, {"s": 32}), obs(2600, 600, {"s": 64}),
            obs(2650, 1500, {"s": 128}), obs(1500, 400, {"s": 24}), obs(2000, 700, {"s": 48}), obs(2640, 2000, {"s": 96})]
    d = deliver(hist, OBJ, {"maximize": "goodput", "subject_to": {"p95_ttft_ms": 700}}, k=4)
    json.dumps(d)
    assert d["front_size"] == 5 and len(d["front"]) == 4
    assert d["knee"]["index"] == 2 and "Branke" in d["knee"]["method"]
    assert d["recommendation"]["index"] == 3
    got = {it["index"] for it in d["front"]}
    assert {0, 4, 2, 3} == got  # the extremes, the knee and the recommendation
    assert all(it["pareto"] for it in d["front"]) and d["front"][0]["objectives"]["goodput"] == 2650
    small = deliver(hist[:2] + [obs(900, 200, {"s": 1})], OBJ, None)
    assert [it["pareto"] for it in small["front"]] == [True, True, False]


# -- the space -----------------------------------------------------------------------------------
def test_space_from_policy():
    pol = Policy.load()
    sp = space_from_policy(pol)
    assert [p.name for p in sp] == ["max_num_batched_tokens", "max_num_seqs", "gpu_memory_utilization"]
    tok = sp[0]
    assert tok.log and tok.levels()[:6] == [256, 384, 512, 768, 1024, 1536]
    assert {4096, 8192, 16384, 32768} <= set(tok.levels())
    narrowed = space_from_policy(pol, ["max-num-seqs", "max_num_batched_tokens"], frozen={"max_model_len": 4096},
                                 bounds={"max_num_seqs": (8, 256), "max_num_batched_tokens": [2048, 4096, 8192]})
    assert narrowed[0].levels() == [8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256]
    assert narrowed[1].levels() == [2048, 4096, 8192]
    assert space_from_policy(pol, ["max_model_len", "max_num_seqs"], frozen={"max_model_len": 4096})[0].name == "max_num_seqs"
    gmu = sp[2]
    assert gmu.levels()[:3] == [0.5, 0.52, 0.54] and 0.85 in gmu.levels()
    with pytest.raises(UsageError):
        space_from_policy(pol, bounds={"max_num_seqs": (1, 10**6)})
    with pytest.raises(UsageError):
        space_from_policy(pol, ["model"])


# -- acquisitions beyond constrained EI (seed 004 §8) ------------------------------------------
def _hvi_exact(front: np.ndarray, ys: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Hypervolume improvement of each y (all minimised) by inclusion-exclusion: the volume of
    [y, ref] less its part dominated by the front, Σ_{S ⊆ front} (−1)^|S| vol([max(y, max S), ref]).
    An independent answer for small fronts in any dimension."""
    import itertools

    out = np.zeros(len(ys))
    for r in range(len(front) + 1):
        for sub in itertools.combinations(front, r):
            corner = np.maximum(ys, np.max(sub, axis=0)) if sub else ys
            out += (-1) ** r * np.prod(np.clip(ref - corner, 0, None), axis=1)
    return out


def test_ehvi_in_any_dimension_matches_the_closed_form_and_monte_carlo():
    from vkit.search.gp import ehvi

    rng = np.random.default_rng(5)
    front2 = np.array([[1.0, 4.0], [2.0, 2.5], [3.5, 1.0]])
    mu2, sd2 = rng.random((40, 2)) * 5, rng.random((40, 2)) + 0.05
    np.testing.assert_allclose(ehvi(front2, np.array([5.0, 5.0]), mu2, sd2), ehvi_2d(front2, np.array([5.0, 5.0]), mu2, sd2),
                               rtol=1e-9, atol=1e-12)
    front3 = np.array([[0.1, 0.8, 0.5], [0.5, 0.3, 0.6], [0.7, 0.6, 0.1]])
    ref3 = np.array([1.0, 1.0, 1.0])
    mu3 = np.array([[0.4, 0.4, 0.4], [0.2, 0.9, 0.3], [0.95, 0.95, 0.95]])
    sd3 = np.array([[0.2, 0.1, 0.3], [0.1, 0.2, 0.1], [0.05, 0.05, 0.05]])
    exact = ehvi(front3, ref3, mu3, sd3)
    for j in range(len(mu3)):
        hvi = _hvi_exact(front3, mu3[j] + sd3[j] * rng.standard_normal((40000, 3)), ref3)
        se = hvi.std() / math.sqrt(len(hvi))
        assert abs(exact[j] - hvi.mean()) < 4 * se + 1e-9, (j, exact[j], hvi.mean(), se)
    assert exact[0] > exact[2]  # a likely improvement beats a point near the reference


def test_auto_takes_ehvi_for_two_and_three_objectives_and_constrained_ei_under_an_slo():
    # bench_tuner chose it: under an SLO, constrained EI reaches the constrained optimum in fewer restarts
    p = run_mode("bo", budget=8, seed=3, slo={"p95_ttft_ms": 1500})[1][-1]
    assert p.audit["phase"] == "acquisition" and p.audit["acquisition"]["name"] == "log_ei+log_pof"
    p = run_mode("bo", budget=8, seed=3, slo={"p95_ttft_ms": 1500}, acquisition="ehvi")[1][-1]
    assert p.audit["acquisition"]["name"] == "ehvi+log_pof"  # EHVI with the SLO as P(feasible), when asked
    p = run_mode("bo", budget=8, seed=3)[1][-1]
    assert p.audit["acquisition"]["name"] == "ehvi"
    three = [*OBJ, Objective("mean_tpot_ms", "min")]
    rng = np.random.default_rng(2)
    hist = []
    for cfg in ({"max_num_batched_tokens": t, "max_num_seqs": s} for t, s in ((2048, 8), (4096, 32), (8192, 64), (16384, 128), (2048, 128))):
        m = measured(cfg, "bo", rng)
        m.objectives["mean_tpot_ms"] = 20.0 + cfg["max_num_seqs"] / 8
        hist.append(m)
    q = propose("bo", SPACE, hist, BASE, three, None, 12, 3, n_init=4, random_every=0)
    assert q.audit["acquisition"]["name"] == "ehvi" and q.audit["acquisition"]["objectives"] == 3


def test_ucb_and_ei_are_options_and_six_objectives_are_refused():
    _, props = run_mode("bo", budget=7, seed=3, acquisition="ucb", random_every=0)
    acq = props[-1].audit["acquisition"]
    assert acq["name"] == "ucb" and acq["target"] == "goodput"
    # β = 2 log(|C| t² π² / 6δ), δ = 0.1, t = the observations before the proposal
    assert acq["beta"] == pytest.approx(2 * math.log(acq["n_candidates"] * 6 ** 2 * math.pi ** 2 / 0.6))
    _, props = run_mode("bo", budget=7, seed=3, acquisition="ei", random_every=0)
    assert props[-1].audit["acquisition"]["name"] == "log_ei" and "f_star" in props[-1].audit["acquisition"]
    six = [Objective(f"m{i}", "max") for i in range(6)]
    with pytest.raises(UsageError, match="at most 5"):
        propose("bo", SPACE, [], BASE, six, None, 10, 1)


# -- batch proposals (slots): Kriging believer and constant liars -----------------------------
def test_batch_lies_send_the_next_proposal_of_a_batch_elsewhere_and_replay():
    from vkit.search import batch_lies

    rng = np.random.default_rng(5)
    slo = {"p95_ttft_ms": 1500}
    hist = []
    for _ in range(6):
        p = propose("bo", SPACE, hist, BASE, OBJ, slo, 14, 3, n_init=4)
        hist.append(measured(p.config, p.step, rng))
    first = propose("bo", SPACE, hist, BASE, OBJ, slo, 14, 3, n_init=4)
    # without a lie the same history gives the same proposal again: a batch would measure one point q times
    assert propose("bo", SPACE, hist, BASE, OBJ, slo, 14, 3, n_init=4).config == first.config
    lies = batch_lies(SPACE, hist, BASE, OBJ, slo, 3, [first.config], kind="kb")
    assert len(lies) == 1 and lies[0].step == "pending" and lies[0].feasible and set(lies[0].objectives) == {"goodput", "p95_ttft_ms"}
    second = propose("bo", SPACE, hist + lies, BASE, OBJ, slo, 14, 3, n_init=4)
    assert second.config != first.config and key_of(second.config, SPACE) not in {key_of(h.config, SPACE) for h in hist}
    # the believer at a measured point is (close to) what was measured there: the surrogate's median
    at = hist[-1]
    kb = batch_lies(SPACE, hist, BASE, OBJ, slo, 3, [at.config], kind="kb")[0].objectives
    assert kb["goodput"] == pytest.approx(at.objectives["goodput"], rel=0.10)
    # the constant liars: the best, worst and geometric mean seen, per objective's direction
    seen = [h.objectives for h in hist if h.feasible]
    g, p95 = [s["goodput"] for s in seen], [s["p95_ttft_ms"] for s in seen]
    best = batch_lies(SPACE, hist, BASE, OBJ, slo, 3, [first.config, second.config], kind="cl-best")
    assert [b.objectives for b in best] == [{"goodput": max(g), "p95_ttft_ms": min(p95)}] * 2
    worst = batch_lies(SPACE, hist, BASE, OBJ, slo, 3, [first.config], kind="cl-worst")[0].objectives
    assert worst == {"goodput": min(g), "p95_ttft_ms": max(p95)}
    mean = batch_lies(SPACE, hist, BASE, OBJ, slo, 3, [first.config], kind="cl-mean")[0].objectives
    assert mean["goodput"] == pytest.approx(math.exp(np.mean(np.log(g))))
    # a batch's record replays: the lies are in the logged history
    rec = json.loads(json.dumps(log_record("bo", SPACE, hist + lies, BASE, OBJ, slo, 14, 3, second, n_init=4)))
    assert replay_mismatches([rec]) == []
    with pytest.raises(UsageError):
        batch_lies(SPACE, hist, BASE, OBJ, slo, 3, [first.config], kind="optimist")
    assert batch_lies(SPACE, hist, BASE, OBJ, slo, 3, []) == []
