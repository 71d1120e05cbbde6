"""Seed 002's json_constraint_demo.py (ch11): a 17-token JSON
vocabulary, a pushdown automaton (state + stack) that lists the valid next tokens, and Python's
`random` choosing among them.

Seed-faithful, generation stops after max_tokens whatever the state, so a cut document is
invalid JSON (685 of 5000 seeds at max_tokens 15). Corrected (default), the mask also removes
every token after which the document could not be closed within the tokens left, so every
output is complete and parses. The byte-level automaton the model uses applies the same rule
(jaxscale/serve/json_pda.py).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

VOCAB = (
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    '"name"',
    '"value"',
    '"id"',
    '"type"',
    '"hello"',
    '"world"',
    "123",
    "456",
    "true",
    "false",
    "null",
)
KEYS = {6, 7, 8, 9}
VALUES = {0, 2, 6, 7, 10, 11, 12, 13, 14, 15, 16}  # the seed's "any value" set
START, OBJ_START, OBJ_KEY, OBJ_COLON, OBJ_VALUE, OBJ_COMMA = range(6)
ARR_START, ARR_VALUE, ARR_COMMA, DONE = range(6, 10)
NAMES = (
    "START",
    "OBJECT_START",
    "OBJECT_KEY",
    "OBJECT_COLON",
    "OBJECT_VALUE",
    "OBJECT_COMMA",
    "ARRAY_START",
    "ARRAY_VALUE",
    "ARRAY_COMMA",
    "DONE",
)


@dataclass(frozen=True)
class State:
    mode: int = START
    stack: tuple[str, ...] = ()


def valid_tokens(s: State) -> set[int]:
    """The seed's get_valid_tokens."""
    return {
        START: {0, 2},
        OBJ_START: {1} | KEYS,
        OBJ_KEY: set(KEYS),
        OBJ_COLON: {4},
        OBJ_VALUE: set(VALUES),
        OBJ_COMMA: {1, 5} if s.stack and s.stack[-1] == "object" else {1},
        ARR_START: {3} | VALUES,
        ARR_VALUE: set(VALUES),
        ARR_COMMA: {3, 5},
    }.get(s.mode, set())


def _after_close(stack) -> State:
    if not stack:
        return State(DONE, ())
    return State(OBJ_COMMA if stack[-1] == "object" else ARR_COMMA, stack)


def advance(s: State, tok: int) -> State:
    """The seed's advance."""
    text, stack = VOCAB[tok], s.stack
    if text == "{":
        return State(OBJ_START, stack + ("object",))
    if text == "[":
        return State(ARR_START, stack + ("array",))
    if text in "}]":
        kind = "object" if text == "}" else "array"
        if stack and stack[-1] == kind:
            stack = stack[:-1]
        return _after_close(stack)
    if text == ":":
        return State(OBJ_VALUE, stack)
    if text == ",":
        return State(OBJ_KEY if stack[-1] == "object" else ARR_VALUE, stack)
    if text.startswith('"') and s.mode in (OBJ_START, OBJ_KEY):
        return State(OBJ_COLON, stack)
    if s.mode == OBJ_VALUE:
        return State(OBJ_COMMA, stack)
    if s.mode in (ARR_START, ARR_VALUE):
        return State(ARR_COMMA, stack)
    return s


def finish_cost(s: State) -> int:
    """Fewest tokens that close the document from `s`: the current element, then one closing
    token per open container."""
    own = {START: 2, OBJ_KEY: 3, OBJ_COLON: 2, OBJ_VALUE: 1, ARR_VALUE: 1, DONE: 0}
    return own.get(s.mode, 0) + len(s.stack)


def allowed(s: State, budget: int, seed_faithful: bool) -> set[int]:
    """The seed's valid set, or (corrected) those of them that still fit in `budget` tokens."""
    valid = valid_tokens(s)
    if seed_faithful:
        return valid
    return {t for t in valid if 1 + finish_cost(advance(s, t)) <= budget}


def generate(rng: random.Random, max_tokens: int, seed_faithful: bool = False):
    """(tokens' texts, the (state, valid, chosen) trace, final state): random.choice over the
    allowed tokens in the seed's order (iteration order of the set)."""
    s, out, trace = State(), [], []
    for _ in range(max_tokens):
        if s.mode == DONE:
            break
        valid = allowed(s, max_tokens - len(out), seed_faithful)
        if not valid:
            break
        tok = rng.choice(list(valid))
        trace.append((NAMES[s.mode], sorted(valid), tok))
        out.append(VOCAB[tok])
        s = advance(s, tok)
    return out, trace, s


def parses(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except json.JSONDecodeError:
        return False


def fuzz(n_seeds: int, max_tokens: int, seed_faithful: bool) -> dict:
    """Over seeds 0..n-1: outputs complete (the automaton reached DONE) and outputs that parse."""
    complete = valid = 0
    for seed in range(n_seeds):
        out, _, s = generate(random.Random(seed), max_tokens, seed_faithful)
        complete += s.mode == DONE
        valid += parses("".join(out))
    return {
        "seeds": n_seeds,
        "max_tokens": max_tokens,
        "complete": complete,
        "parse": valid,
        "truncated": n_seeds - complete,
    }
