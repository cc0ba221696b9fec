"""The simulator's tokenizer: simple, deterministic, documented, self-consistent.

Rules (``runbook/sim_server.md`` repeats them):

- A token is up to 4 consecutive non-whitespace characters, optionally preceded by one
  space; any other whitespace character is a token by itself. ``"Hello world"`` is
  ``["Hell", "o", " worl", "d"]``. English text gives ~3 characters per token, close to
  real BPE tokenizers (~4).
- A token's id is ``256 + crc32(utf-8 bytes) % (vocab - 256)``: the same text always gives
  the same ids, in every process, so the prefix cache sees shared prefixes.
- Generated text is drawn from short English words (one token each, JSON-safe), so
  re-tokenising a completion gives back its ``completion_tokens`` exactly, except that a
  request stopped by EOS counts the EOS token, which has no text (as in vLLM).
- Chat messages are rendered as ``<|role|>\\ncontent\\n`` per message followed by
  ``<|assistant|>\\n``, then tokenised with the rules above.
"""

from __future__ import annotations

import re
import zlib
from typing import Any, Iterable

EOS_TOKEN_ID = 2
_FIRST_ID = 256

_TOKEN_RE = re.compile(r" ?[^\s]{1,4}|\s")

# One token each under the rules above; no quotes or backslashes, so they need no JSON escaping.
OUTPUT_WORDS = (
    " the", " of", " and", " to", " a", " in", " is", " it", " that", " for", " on", " was",
    " with", " as", " be", " at", " by", " this", " from", " or", " an", " are", " not",
    " have", " but", " all", " they", " one", " can", " has", " more", " will", " when",
    " if", " so", " what", " out", " up", " into", " time", " them", " some", " then",
    " we", " data", " our", " two", " each", " very", " used", " just", " how", " also",
    " new", " work", " may", " like", " over", " most", " such", " than", " only", ".", ",",
)


class Tokenizer:
    """Text to ids and back, for a model with ``vocab`` token ids."""

    def __init__(self, vocab: int):
        self.vocab = vocab
        self._span = vocab - _FIRST_ID
        self.output_ids = [self.token_id(w) for w in OUTPUT_WORDS]
        self._text_of = {tid: w for tid, w in zip(self.output_ids, OUTPUT_WORDS, strict=True)}
        self._text_of[EOS_TOKEN_ID] = ""
        self._bytes_of = {tid: w.encode() for tid, w in self._text_of.items()}

    def token_id(self, piece: str) -> int:
        return _FIRST_ID + zlib.crc32(piece.encode("utf-8")) % self._span

    def pieces(self, text: str) -> list[str]:
        return _TOKEN_RE.findall(text)

    def encode(self, text: str) -> list[int]:
        crc = zlib.crc32
        span = self._span
        return [_FIRST_ID + crc(p.encode("utf-8")) % span for p in _TOKEN_RE.findall(text)]

    def text_of(self, token_id: int) -> str:
        """Text of a generated token (output words and EOS only)."""
        return self._text_of.get(token_id, "")

    def bytes_of(self, token_id: int) -> bytes:
        """UTF-8 text of a generated token (JSON-safe by construction)."""
        return self._bytes_of.get(token_id, b"")

    def output_token(self, seed: int, index: int) -> int:
        """The ``index``-th generated token of a request whose text seed is ``seed``."""
        ids = self.output_ids
        return ids[(seed + index * 7) % len(ids)]


def message_text(content: Any) -> str:
    """The text of a chat message's content: a string, or a list of ``{"type": "text"}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return str(content)


def render_chat(messages: Iterable[dict]) -> str:
    """The prompt text of a chat request under the simulator's chat template."""
    out = []
    for m in messages:
        out.append(f"<|{m.get('role', 'user')}|>\n{message_text(m.get('content'))}\n")
    out.append("<|assistant|>\n")
    return "".join(out)
