"""Client-vs-server gauge checks: the client's token totals against the server's /metrics counters, the
load generator's own saturation, client TTFT against the server's histogram, and the configuration the
server reports against the intended one (``reported_config``; ``parse_expected_config`` reads
--expect-config)."""

from __future__ import annotations

import os
from typing import Any

from vkit.apply.policy import canonical, same_value
from vkit.errors import UsageError
from vkit.jsonio import read_json
from vkit.validate.invariants.common import ANOMALY, FAIL, INFO, INVALID, NA, PASS, Thresholds, _f, _res, _sg, _stat


def check_tokens_client_vs_server(rep: dict, th: Thresholds, ctx: dict) -> dict:
    """Client token totals vs the server's /metrics counter deltas over the run. Why: more on
    the server means other traffic shared it during the run; fewer means the client counts
    tokens differently (re-tokenisation, special tokens, events instead of tokens)."""
    cid, title = "tokens_client_vs_server", "client token counts = server counters"
    d = (rep.get("server") or {}).get("delta")
    if not isinstance(d, dict):
        return _res(cid, title, NA, INFO, "needs the server's /metrics counter deltas over the run (a vkit summary with /metrics).")
    f = rep.get("failed") or 0
    ev: dict[str, Any] = {"failed": f, "tol": th.token_tol}
    bad = []
    for key, ckey in (("prompt_tokens", "total_input_tokens"), ("generation_tokens", "total_output_tokens")):
        s, c = d.get(key), rep.get(ckey)
        if s is None or not c:
            continue
        ev[f"client_{key}"], ev[f"server_{key}"] = c, s
        rel = s / c - 1
        ev[f"{key}_deviation"] = rel
        allow_hi = th.token_tol + (f * (c / max(rep.get("completed") or 1, 1)) / c if f else 0.0)
        if rel < -th.token_tol or rel > allow_hi:
            bad.append((key, c, s, rel))
    if len(ev) <= 2:
        return _res(cid, title, NA, INFO, "the server counters or the client totals are missing.")
    if bad:
        key, c, s, rel = bad[0]
        why = ("the server processed more than this client sent: other traffic shared the server during the run, so its "
               "load and latency are not this benchmark's alone" if rel > 0 else
               "the client counts more than the server processed: token counts are not taken from usage (re-tokenised text, "
               "counted events)")
        return _res(cid, title, FAIL, ANOMALY,
                    f"{key.replace('_', ' ')}: client {_f(c)} vs server {_f(s)} ({_sg(rel)}): {why}.", **ev)
    return _res(cid, title, PASS, INFO, "client token totals match the server's counters over the run.", **ev)


def check_client_saturation(rep: dict, th: Thresholds, ctx: dict) -> dict:
    """The load generator's own CPU and scheduling lag. Why: a saturated client delays sends
    and reads, so every latency it reports is inflated by itself, not by the server."""
    cid, title = "client_saturation", "client not saturated"
    cl = rep.get("client")
    if not cl:
        return _res(cid, title, NA, INFO, "the report carries no client CPU or scheduling-lag figures (a vkit summary does).")
    cpu = cl.get("cpu_frac_of_one_core")
    lag = (cl.get("sched_lag") or {}).get("p99_ms")
    if cpu is None and lag is None:
        return _res(cid, title, NA, INFO, "the report carries no client CPU or scheduling-lag figures.")
    ev = dict(cpu_frac_of_one_core=cpu, sched_lag_p99_ms=lag, cpu_max=th.client_cpu_max, sched_lag_max_ms=th.sched_lag_max_ms)
    bad = []
    if cpu is not None and cpu > th.client_cpu_max:
        bad.append(f"the client used {cpu:.0%} of a core (> {th.client_cpu_max:.0%})")
    if lag is not None and lag > th.sched_lag_max_ms:
        bad.append(f"its p99 scheduling lag was {_f(lag)} ms (> {_f(th.sched_lag_max_ms)} ms)")
    if bad:
        return _res(cid, title, FAIL, ANOMALY,
                    f"{' and '.join(bad)}: the load generator was saturated, so latency figures include its own delays. Run it "
                    "on a less loaded machine or with less concurrency per process; a server on the same machine runs "
                    "better niced in the client's session, or with its autogroup lowered (echo 10 > /proc/PID/autogroup).",
                    **ev)
    return _res(cid, title, PASS, INFO, f"client CPU {cpu:.0%} of a core, p99 scheduling lag {_f(lag)} ms." if cpu is not None and lag is not None
                else "client CPU and scheduling lag within limits.", **ev)


def check_client_server_ttft_gap(rep: dict, th: Thresholds, ctx: dict) -> dict:
    """Client mean TTFT vs the server's own (/metrics histogram delta). Why: a gap beyond the
    usual few tens of ms is network, proxy or client overhead, not the engine being tuned."""
    cid, title = "client_server_ttft_gap", "client TTFT close to server TTFT"
    d = (rep.get("server") or {}).get("delta")
    st = (d or {}).get("ttft") if isinstance(d, dict) else None
    srv = (st or {}).get("mean_ms")
    cli = _stat(rep["metrics"].get("ttft"), "mean")
    if srv is None or cli is None:
        return _res(cid, title, NA, INFO, "needs the server's TTFT histogram over the run (a vkit summary with /metrics).")
    if ctx["identity"]["holds"] or rep.get("stream") is False:
        return _res(cid, title, NA, INFO, "the client's TTFT is the total latency here (no streaming); nothing to compare.",
                    client_ttft_mean_ms=cli, server_ttft_mean_ms=srv)
    gap = cli - srv
    ev = dict(client_ttft_mean_ms=cli, server_ttft_mean_ms=srv, gap_ms=gap, tol_ms=th.client_server_ttft_tol_ms,
              server_requests=st.get("count"), client_requests=rep.get("completed"))
    if abs(gap) > th.client_server_ttft_tol_ms:
        why = ("time spent outside the engine (network, proxy, client overhead): tuning the server cannot remove it"
               if gap > 0 else "the client reports a faster first token than the server measured: the client's clock or "
               "TTFT definition is wrong")
        return _res(cid, title, FAIL, ANOMALY,
                    f"client TTFT {_f(cli)} ms vs server {_f(srv)} ms (gap {gap:+.1f} ms > ±{_f(th.client_server_ttft_tol_ms)} ms): {why}.",
                    **ev)
    return _res(cid, title, PASS, INFO, f"client TTFT {_f(cli)} ms vs server {_f(srv)} ms (gap {gap:+.1f} ms).", **ev)


_ALIASES = {"cache_dtype": "kv_cache_dtype"}


def reported_config(server: dict | None) -> dict:
    """What the server says it runs: max_model_len (/v1/models), cache_config labels (/metrics)
    and any ``config`` object, under vLLM's names."""
    out: dict[str, Any] = {}
    if not server:
        return out
    for k, v in (server.get("cache_config") or {}).items():
        out[_ALIASES.get(canonical(k), canonical(k))] = v
    for k, v in (server.get("config") or {}).items() if isinstance(server.get("config"), dict) else []:
        out[_ALIASES.get(canonical(k), canonical(k))] = v
    if server.get("max_model_len") is not None:
        out["max_model_len"] = server["max_model_len"]
    return out


def check_server_config(rep: dict, th: Thresholds, ctx: dict) -> dict:
    """The configuration the server reports vs the one the trial meant to apply. Why: a
    restart that did not take the change measures the old configuration; any verdict about
    the candidate drawn from it is wrong."""
    cid, title = "server_config", "server runs the intended configuration"
    want = ctx.get("expect") or {}
    if not want:
        return _res(cid, title, NA, INFO, "no intended configuration given (--expect-config K=V ... or FILE.json).")
    have = reported_config(rep.get("server"))
    if not have:
        return _res(cid, title, NA, INFO, "the report carries no server-reported configuration (a vkit summary does).",
                    expected=want)
    mism, matched, unverified = {}, [], []
    for k, v in sorted(want.items()):
        key = _ALIASES.get(canonical(k), canonical(k))
        if key not in have:
            unverified.append(key)
        elif same_value(v, have[key]):
            matched.append(key)
        else:
            mism[key] = {"expected": v, "reported": have[key]}
    ev = dict(mismatched=mism, matched=matched, unverified=unverified)
    if mism:
        txt = ", ".join(f"{k} = {m['reported']} (meant {m['expected']})" for k, m in mism.items())
        return _res(cid, title, FAIL, INVALID,
                    f"the server reports {txt}: this run measured another configuration than the trial's. Check that the "
                    "restart applied the change (restart_with_rollback, post_start_verify) and measure again.", **ev)
    if not matched:
        return _res(cid, title, NA, INFO,
                    f"the server reports none of {', '.join(unverified)}; nothing to confirm.", **ev)
    extra = f"; not reported by the server, so unverified: {', '.join(unverified)}" if unverified else ""
    return _res(cid, title, PASS, INFO, f"server reports {', '.join(matched)} as intended{extra}.", **ev)


def parse_expected_config(items: list[str]) -> dict:
    """``k=v`` items and JSON files (a config object, or one holding ``"config"``) → dict."""
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" in item and not os.path.exists(item):
            k, v = item.split("=", 1)
            if not canonical(k):
                raise UsageError(f"empty parameter name in --expect-config {item!r}")
            out[canonical(k)] = v
            continue
        try:
            doc = read_json(item, "--expect-config file")
        except FileNotFoundError:
            raise UsageError(f"--expect-config takes K=V items or a JSON file; {item!r} is neither") from None
        if isinstance(doc, dict) and isinstance(doc.get("config"), dict):
            doc = doc["config"]
        if not isinstance(doc, dict) or "vkit" in doc or "completed" in doc:
            raise UsageError(f"--expect-config file {item} is not a configuration object (put REPORT before --expect-config)")
        out.update({canonical(k): v for k, v in doc.items()})
    return out
