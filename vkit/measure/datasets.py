"""Request sets for bench_stream: random (token ids, exact lengths), a user's JSONL
prompt file, and a mixed long/short set; optional shared prefix for prefix caching.

Random prompts are lists of token ids sent to the completions endpoint (vLLM accepts
them), so input lengths and shared prefixes are exact without the model's tokenizer.
For the chat endpoint, random prompts are made of words instead (lengths then come
from ``usage``). Everything is drawn from one seeded generator: the same seed gives
the same request set.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vkit.errors import UsageError
from vkit.jsonio import load_json_lines, read_json

# Words for text prompts: short, common, tokenised to about one token each by BPE tokenizers.
_WORDS = (
    "the of and to in is was for on that with as by at from this be are or an it not which have had "
    "time year people way day man thing woman life child world school state family student group country "
    "problem hand part place case week company system program question work government number night point "
    "home water room mother area money story fact month lot right study book eye job word business issue "
    "side kind head house service friend father power hour game line end member law car city community name"
).split()


@dataclass
class Request:
    """One request to send. ``prompt`` is a list of token ids or a string; ``messages`` for chat."""

    index: int
    prompt: Any = None
    messages: list | None = None
    input_len: int | None = None  # exact when the prompt is token ids
    output_len: int | None = None
    ignore_eos: bool = False
    extra: dict = field(default_factory=dict)


def _lengths(rng: np.random.Generator, mean: int, ratio: float, n: int) -> np.ndarray:
    """vLLM's random dataset: lengths uniform in [mean·(1−r), mean·(1+r)], at least 1."""
    if not 0 <= ratio < 1:
        raise UsageError(f"--random-range-ratio must be in [0, 1), got {ratio}")
    lo = max(1, int(np.floor(mean * (1 - ratio))))
    hi = max(lo, int(np.ceil(mean * (1 + ratio))))
    return rng.integers(lo, hi + 1, size=n)


def _ids(rng: np.random.Generator, n: int, vocab: int) -> list[int]:
    # Ids from 10 upwards: low ids are usually special tokens (bos/eos/pad/unk).
    return rng.integers(10, vocab, size=int(n)).tolist()


def _words(rng: np.random.Generator, n: int) -> str:
    return " ".join(_WORDS[i] for i in rng.integers(0, len(_WORDS), size=int(n)))


def random_requests(
    n: int,
    input_len: int,
    output_len: int,
    range_ratio: float = 0.0,
    seed: int = 0,
    shared_prefix_len: int = 0,
    vocab_size: int = 1000,
    text: bool = False,
) -> list[Request]:
    if input_len < 1 or output_len < 1:
        raise UsageError("--random-input-len and --random-output-len must be >= 1")
    if vocab_size <= 10:
        raise UsageError("--vocab-size must be > 10")
    rng = np.random.default_rng(seed)
    ins = _lengths(rng, input_len, range_ratio, n)
    outs = _lengths(rng, output_len, range_ratio, n)
    prefix_ids = _ids(rng, shared_prefix_len, vocab_size) if shared_prefix_len else []
    prefix_txt = _words(rng, shared_prefix_len) + " " if (shared_prefix_len and text) else ""
    out = []
    for i in range(n):
        if text:
            out.append(Request(i, messages=[{"role": "user", "content": prefix_txt + _words(rng, ins[i])}],
                               output_len=int(outs[i]), ignore_eos=True))
        else:
            ids = prefix_ids + _ids(rng, ins[i], vocab_size)
            out.append(Request(i, prompt=ids, input_len=len(ids), output_len=int(outs[i]), ignore_eos=True))
    return out


def mixed_requests(
    n: int,
    short_len: int,
    long_len: int,
    long_fraction: float,
    output_len: int,
    seed: int = 0,
    vocab_size: int = 1000,
    text: bool = False,
) -> list[Request]:
    """Long and short prompts interleaved at random (step 5: behaviour under mixed load)."""
    if not 0 < long_fraction < 1:
        raise UsageError(f"--mixed-long-fraction must be in (0, 1), got {long_fraction}")
    rng = np.random.default_rng(seed)
    is_long = rng.random(n) < long_fraction
    out = []
    for i in range(n):
        L = long_len if is_long[i] else short_len
        if text:
            out.append(Request(i, messages=[{"role": "user", "content": _words(rng, L)}], output_len=output_len,
                               ignore_eos=True, extra={"class": "long" if is_long[i] else "short"}))
        else:
            out.append(Request(i, prompt=_ids(rng, L, vocab_size), input_len=L, output_len=output_len, ignore_eos=True,
                               extra={"class": "long" if is_long[i] else "short"}))
    return out


_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
                   "system": "system", "bing": "assistant", "bard": "assistant"}


def _rows(path: str) -> list[tuple[int, object]]:
    """(line or item number, object): JSON Lines, or one JSON array (a ShareGPT-style file)."""
    try:
        with open(path, encoding="utf-8") as f:
            head = f.read(4096).lstrip()
    except FileNotFoundError:
        raise UsageError(f"no such dataset file: {path}") from None
    except OSError as e:
        raise UsageError(f"cannot read dataset file {path}: {e.strerror}") from None
    if head.startswith("["):
        doc = read_json(path, "dataset file")
        return list(enumerate(doc, start=1))
    return load_json_lines(path, "dataset file")


def _conversation(path: str, ln: int, turns: object) -> tuple[list[dict], str]:
    """A ShareGPT ``conversations`` list as chat messages up to the first user turn, and that turn."""
    if not isinstance(turns, list) or not turns:
        raise UsageError(f"{path}:{ln}: 'conversations' must be a non-empty list of turns")
    msgs = []
    for t in turns:
        role = _SHAREGPT_ROLES.get(str((t or {}).get("from", (t or {}).get("role", ""))).lower()) if isinstance(t, dict) else None
        text = t.get("value", t.get("content")) if isinstance(t, dict) else None
        if role is None or not isinstance(text, str):
            raise UsageError(f"{path}:{ln}: each turn needs 'from' (human/gpt/system) and a string 'value'")
        msgs.append({"role": role, "content": text})
        if role == "user":
            return msgs, text
    raise UsageError(f"{path}:{ln}: the conversation has no human turn")


def jsonl_requests(path: str, n: int | None, default_output_len: int | None, chat: bool, seed: int = 0) -> list[Request]:
    """A user's prompt file: one JSON object a line (or a JSON array of them) with ``prompt``,
    ``messages`` or ShareGPT-style ``conversations`` (up to the first human turn is sent), and an
    optional ``output_len`` / ``max_tokens``. With ``n`` larger than the file, rows repeat."""
    rows = []
    for ln, obj in _rows(path):
        if not isinstance(obj, dict) or not ("prompt" in obj or "messages" in obj or "conversations" in obj):
            raise UsageError(f"{path}:{ln}: each line needs a 'prompt', 'messages' or 'conversations' field")
        if "conversations" in obj and "prompt" not in obj and "messages" not in obj:
            msgs, first = _conversation(path, ln, obj["conversations"])
            obj = {**obj, "messages": msgs} if chat else {**obj, "prompt": first}
        rows.append((ln, obj))
    if not rows:
        raise UsageError(f"{path} holds no requests")
    count = n or len(rows)
    out = []
    for i in range(count):
        ln, obj = rows[i % len(rows)]
        olen = obj.get("output_len", obj.get("max_tokens", default_output_len))
        extra = _trace_fields(path, ln, obj)
        if "messages" in obj:
            if not chat:
                raise UsageError(f"{path}: rows with 'messages' need --endpoint chat")
            out.append(Request(i, messages=obj["messages"], output_len=olen, extra=extra))
        elif chat:
            out.append(Request(i, messages=[{"role": "user", "content": str(obj["prompt"])}], output_len=olen, extra=extra))
        else:
            p = obj["prompt"]
            out.append(Request(i, prompt=p, input_len=len(p) if isinstance(p, list) else None, output_len=olen, extra=extra))
    return out


def _trace_fields(path: str, ln: int, obj: dict) -> dict:
    """A row's arrival time (``timestamp``, seconds) and scheduling ``priority``, when it has them."""
    out = {}
    for key, kind in (("timestamp", (int, float)), ("priority", int)):
        if key in obj:
            v = obj[key]
            if isinstance(v, bool) or not isinstance(v, kind) or (key == "timestamp" and not np.isfinite(v)):
                raise UsageError(f"{path}:{ln}: '{key}' must be a {'number of seconds' if key == 'timestamp' else 'whole number'}")
            out[key] = v
    return out


def trace_requests(path: str, n: int | None, default_output_len: int | None, chat: bool,
                   speedup: float = 1.0) -> tuple[list[Request], np.ndarray]:
    """A traffic trace: a prompt file whose every row has a ``timestamp`` (seconds, any origin), in
    time order, replayed open loop at the recorded offsets divided by ``speedup`` (2 = twice the
    traffic). The first ``n`` arrivals when ``n`` is given; rows may carry a ``priority``."""
    if not speedup > 0 or not np.isfinite(speedup):
        raise UsageError(f"--trace-speedup must be a positive number, got {speedup}")
    reqs = jsonl_requests(path, None, default_output_len, chat)
    missing = [r.index for r in reqs if "timestamp" not in r.extra]
    if missing:
        raise UsageError(f"{path}: a trace needs a 'timestamp' on every row; request {missing[0] + 1} has none")
    reqs.sort(key=lambda r: r.extra["timestamp"])
    reqs = reqs[:n] if n else reqs
    for i, r in enumerate(reqs):
        r.index = i
    t = np.array([r.extra["timestamp"] for r in reqs], dtype=float)
    return reqs, (t - t[0]) / speedup


def length_distribution(reqs: list[Request]) -> dict:
    """The request set's token lengths: prompt tokens (known for token-id prompts) and output
    tokens asked for, each as count, mean, p5, p50, p95, p99, min and max."""
    def dist(values: list) -> dict | None:
        a = np.asarray([v for v in values if isinstance(v, (int, float))], dtype=float)
        if a.size == 0:
            return None
        return {"count": int(a.size), "mean": float(a.mean()), "p5": float(np.percentile(a, 5)),
                "p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
                "p99": float(np.percentile(a, 99)), "min": float(a.min()), "max": float(a.max())}

    return {"input_tokens": dist([r.input_len for r in reqs]), "output_tokens": dist([r.output_len for r in reqs])}


def file_sha256(path: str) -> str:
    """The content hash of a dataset file: part of the gauge (two files of one name are not one gauge)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def arrival_times(n: int, rate: float, burstiness: float = 1.0, seed: int = 0, exact: bool = False) -> np.ndarray:
    """Send offsets (s) for an open loop: gamma inter-arrivals with mean 1/rate and shape
    ``burstiness`` (1 = Poisson), as vLLM's benchmark draws them. ``rate`` inf → all at 0.

    ``exact``: the drawn gaps scaled so that the run offers exactly ``rate`` on average (the
    process conditioned on its span, ``(n - 1) / rate``). A 200-request Poisson run's own mean
    rate is off by 7 % (one sd) by chance; near saturation that moves P95 TTFT by tens of
    percent, so a capacity search compares loads with it removed."""
    if np.isinf(rate):
        return np.zeros(n)
    if rate <= 0:
        raise UsageError(f"--request-rate must be > 0 or inf, got {rate}")
    if burstiness <= 0:
        raise UsageError(f"--burstiness must be > 0, got {burstiness}")
    rng = np.random.default_rng(seed + 1_000_003)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    gaps[0] = 0.0
    if exact and n > 1 and gaps[1:].sum() > 0:
        gaps[1:] *= ((n - 1) / rate) / gaps[1:].sum()
    return np.cumsum(gaps)
