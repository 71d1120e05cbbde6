"""A pushdown automaton for compact JSON over bytes, for constrained decoding: the bytes allowed
next are those after which the document can still be finished within the tokens left, so a
constrained generation always ends in text that `json.loads` accepts, whatever the model and
the seed.

The grammar is RFC 8259 without whitespace, with a top-level object or array (as the seed's
demo), strings of printable ASCII with the escapes \\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX,
and numbers -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?. A state is an immutable tuple, so
a draft model can advance a copy of it (speculative + constrained decoding).
"""

from __future__ import annotations

import numpy as np

# modes
START, VALUE, ARR_FIRST, KEY_FIRST, KEY, COLON, AFTER, STRING, NUMBER, LITERAL, DONE = range(11)
STR_BYTES = frozenset(range(0x20, 0x7F)) - {ord('"'), ord("\\")}
ESCAPABLE = frozenset(b'"\\/bfnrt')
DIGITS = frozenset(b"0123456789")
HEX = frozenset(b"0123456789abcdefABCDEF")
LITERALS = {ord("t"): b"rue", ord("f"): b"alse", ord("n"): b"ull"}
# number sub-states: (what the last byte was); complete ones can end the number
N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP = range(8)
N_COMPLETE = {N_ZERO, N_INT, N_FRAC, N_EXP}

# state = (mode, stack, aux): stack is a tuple of b"{" / b"[" containers; aux is the mode's own
# (STRING: (is_key, pending escape); NUMBER: the sub-state; LITERAL: the bytes still to come)
INITIAL = (START, (), None)


def _after_value(stack):
    return (AFTER, stack, None) if stack else (DONE, (), None)


def _start_value(b: int, stack):
    """The state after the first byte of a value, or None if b cannot start one."""
    if b in (ord("{"), ord("[")):
        return (KEY_FIRST if b == ord("{") else ARR_FIRST, stack + (b,), None)
    if b == ord('"'):
        return (STRING, stack, (False, 0))
    if b == ord("-"):
        return (NUMBER, stack, N_MINUS)
    if b in DIGITS:
        return (NUMBER, stack, N_ZERO if b == ord("0") else N_INT)
    if b in LITERALS:
        return (LITERAL, stack, LITERALS[b])
    return None


def _close(b: int, stack):
    if stack and (
        (b == ord("}") and stack[-1] == ord("{")) or (b == ord("]") and stack[-1] == ord("["))
    ):
        return _after_value(stack[:-1])
    return None


def _number(b: int, sub: int, stack):
    """The next number sub-state, or (when the number is complete and b cannot extend it) the
    state after the number with b applied to it; None if b is not allowed."""
    d = b in DIGITS
    table = {
        N_MINUS: {True: N_ZERO if b == ord("0") else N_INT},
        N_ZERO: {False: {ord("."): N_DOT, ord("e"): N_E, ord("E"): N_E}.get(b)},
        N_INT: {True: N_INT, False: {ord("."): N_DOT, ord("e"): N_E, ord("E"): N_E}.get(b)},
        N_DOT: {True: N_FRAC},
        N_FRAC: {True: N_FRAC, False: {ord("e"): N_E, ord("E"): N_E}.get(b)},
        N_E: {True: N_EXP, False: N_ESIGN if b in b"+-" else None},
        N_ESIGN: {True: N_EXP},
        N_EXP: {True: N_EXP},
    }[sub]
    nxt = table.get(d)
    if nxt is not None:
        return (NUMBER, stack, nxt)
    if sub in N_COMPLETE:
        return advance(_after_value(stack), b)
    return None


def advance(state, b: int):
    """The state after byte b, or None when b is not allowed there."""
    mode, stack, aux = state
    if mode == START:
        return _start_value(b, stack) if b in (ord("{"), ord("[")) else None
    if mode == VALUE:
        return _start_value(b, stack)
    if mode == ARR_FIRST:
        return _close(b, stack) or _start_value(b, stack)
    if mode in (KEY_FIRST, KEY):
        if mode == KEY_FIRST and b == ord("}"):
            return _close(b, stack)
        return (STRING, stack, (True, 0)) if b == ord('"') else None
    if mode == COLON:
        return (VALUE, stack, None) if b == ord(":") else None
    if mode == AFTER:
        if b == ord(","):
            return (KEY if stack[-1] == ord("{") else VALUE, stack, None)
        return _close(b, stack)
    if mode == STRING:
        is_key, pending = aux  # pending: 0, -1 after a backslash, k > 0 hex digits of \\u to come
        if pending == -1:
            if b == ord("u"):
                return (STRING, stack, (is_key, 4))
            return (STRING, stack, (is_key, 0)) if b in ESCAPABLE else None
        if pending > 0:
            return (STRING, stack, (is_key, pending - 1)) if b in HEX else None
        if b == ord("\\"):
            return (STRING, stack, (is_key, -1))
        if b == ord('"'):
            return (COLON, stack, None) if is_key else _after_value(stack)
        return state if b in STR_BYTES else None
    if mode == NUMBER:
        return _number(b, aux, stack)
    if mode == LITERAL:
        if b != aux[0]:
            return None
        return (LITERAL, stack, aux[1:]) if len(aux) > 1 else _after_value(stack)
    return None  # DONE


def finish_cost(state) -> int:
    """Fewest bytes that complete the document from `state` (0 when done)."""
    mode, stack, aux = state
    own = {START: 2, VALUE: 1, ARR_FIRST: 0, KEY_FIRST: 0, KEY: 4, COLON: 2, AFTER: 0, DONE: 0}
    if mode == STRING:
        is_key, pending = aux
        cost = (1 if pending == -1 else pending) + 1 + (2 if is_key else 0)  # escape, ", (: value)
    elif mode == NUMBER:
        cost = 0 if aux in N_COMPLETE else 1
    elif mode == LITERAL:
        cost = len(aux)
    else:
        cost = own[mode]
    return cost + len(stack)


def allowed(state, budget: int) -> np.ndarray:
    """[256] bool: bytes after which the document can be finished within `budget` bytes (this
    one included). Empty when the document is complete."""
    mask = np.zeros(256, bool)
    for b in range(256):
        nxt = advance(state, b)
        mask[b] = nxt is not None and 1 + finish_cost(nxt) <= budget
    return mask


def done(state) -> bool:
    return state[0] == DONE
