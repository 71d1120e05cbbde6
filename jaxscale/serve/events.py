"""What the engine gives back per sampled token (`Event`), and the bytes-to-text decoding of a
request's tokens as they arrive (`Detokenizer`)."""

from __future__ import annotations

import codecs
from dataclasses import dataclass


@dataclass
class Event:
    """One new token of a request, with its text so far decoded (never a split character)."""

    request_id: str
    token: int
    text: str
    finish_reason: str | None
    # the token's log-probability under the model (raw logits: before temperature, top-k,
    # top-p and any grammar), and the TOP_LOGPROBS most likely tokens' (ids, log-probabilities)
    logprob: float = 0.0
    top: tuple = ()


class Detokenizer:
    """Bytes to text as they arrive: a multi-byte UTF-8 character is held back until its last
    byte (invalid bytes become U+FFFD); tokens beyond the 256 bytes have no text."""

    def __init__(self):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        return self._decoder.decode(bytes([token]) if token < 256 else b"")

    def finish(self) -> str:
        return self._decoder.decode(b"", final=True)
