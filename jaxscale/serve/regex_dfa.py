"""Regular expressions compiled to a DFA over bytes, for constrained decoding: the bytes allowed
next are those whose transition reaches a live state (one from which an accepting state can
still be reached), so any output the mask allows can still be completed to a full match.

Syntax: literals, `.`, classes `[a-z0-9_]` and `[^...]`, escapes `\\d \\w \\s \\D \\W \\S` and
escaped metacharacters, groups `( )`, alternation `|`, and the quantifiers `* + ?`, `{m}`,
`{m,}`, `{m,n}`. Matching is whole-string (Python's re.fullmatch), over the UTF-8 bytes.
Thompson's construction, then the subset construction; no backreferences or lookaround (a DFA
cannot have them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ALL = frozenset(range(256))
DIGIT = frozenset(b"0123456789")
WORD = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
SPACE = frozenset(b" \t\n\r\f\v")
ESCAPES = {"d": DIGIT, "w": WORD, "s": SPACE, "D": ALL - DIGIT, "W": ALL - WORD, "S": ALL - SPACE}
MAX_REPEAT = 64


class _Nfa:
    def __init__(self):
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[frozenset, int]]] = []

    def state(self) -> int:
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1


class _Parser:
    """Recursive descent to NFA fragments (start, end)."""

    def __init__(self, pattern: str, nfa: _Nfa):
        self.p, self.i, self.nfa = pattern, 0, nfa

    def error(self, what: str):
        return ValueError(f"regex {self.p!r}: {what} at position {self.i}")

    def peek(self):
        return self.p[self.i] if self.i < len(self.p) else None

    def take(self):
        c = self.peek()
        if c is None:
            raise self.error("unexpected end")
        self.i += 1
        return c

    def frag(self, byte_sets: list[frozenset]):
        """A chain accepting one byte from each set in turn."""
        start = cur = self.nfa.state()
        for s in byte_sets:
            nxt = self.nfa.state()
            self.nfa.edges[cur].append((s, nxt))
            cur = nxt
        return start, cur

    def alt(self):
        parts = [self.concat()]
        while self.peek() == "|":
            self.i += 1
            parts.append(self.concat())
        if len(parts) == 1:
            return parts[0]
        s, e = self.nfa.state(), self.nfa.state()
        for ps, pe in parts:
            self.nfa.eps[s].append(ps)
            self.nfa.eps[pe].append(e)
        return s, e

    def concat(self):
        s = e = self.nfa.state()
        while self.peek() not in (None, "|", ")"):
            fs, fe = self.repeat()
            self.nfa.eps[e].append(fs)
            e = fe
        return s, e

    def repeat(self):
        start_i = self.i
        frag = self.atom()
        while self.peek() in ("*", "+", "?", "{"):
            lo, hi = self.bounds()
            frag = self.expand(start_i, frag, lo, hi)
        return frag

    def bounds(self):
        c = self.take()
        if c in "*+?":
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        end = self.p.find("}", self.i)
        if end < 0:
            raise self.error("unclosed {")
        body, self.i = self.p[self.i : end], end + 1
        lo, _, hi = body.partition(",")
        try:
            lo_n = int(lo)
            hi_n = lo_n if "," not in body else (int(hi) if hi else None)
        except ValueError:
            raise self.error(f"bad repetition {{{body}}}") from None
        if hi_n is not None and hi_n < lo_n or max(lo_n, hi_n or 0) > MAX_REPEAT:
            raise self.error(f"repetition {{{body}}} out of range (at most {MAX_REPEAT})")
        return lo_n, hi_n

    def expand(self, start_i, frag, lo, hi):
        """frag{lo,hi}: lo chained copies, then hi - lo optional ones (or one looping copy when
        hi is None). The atom is re-parsed for each copy, since NFA fragments are not shared."""
        end_i, fresh = self.i, [frag]

        def copy():
            if fresh:
                return fresh.pop()
            self.i = start_i
            f = self.atom()
            self.i = end_i
            return f

        eps, new = self.nfa.eps, self.nfa.state
        s = e = new()
        for _ in range(lo):
            cs, ce = copy()
            eps[e].append(cs)
            e = ce
        for _ in range(1 if hi is None else hi - lo):
            cs, ce = copy()
            out = new()
            eps[e] += [cs, out]  # take a copy, or skip it
            eps[ce].append(out)
            if hi is None:
                eps[ce].append(cs)  # and loop
            e = out
        self.i = end_i
        return s, e

    def atom(self):
        c = self.take()
        if c == "(":
            frag = self.alt()
            if self.take() != ")":
                raise self.error("expected )")
            return frag
        if c == "[":
            return self.frag([self.cls()])
        if c == ".":
            return self.frag([ALL - {ord("\n")}])
        if c == "\\":
            e = self.take()
            return self.frag([ESCAPES[e]] if e in ESCAPES else [frozenset(e.encode())])
        if c in "*+?{)|":
            raise self.error(f"nothing to repeat or unbalanced {c!r}")
        return self.frag([frozenset([b]) for b in c.encode()])

    def cls(self) -> frozenset:
        negate = self.peek() == "^"
        self.i += negate
        out: set[int] = set()
        first = True
        while first or self.peek() != "]":
            first = False
            c = self.take()
            if c == "\\":
                e = self.take()
                out |= ESCAPES[e] if e in ESCAPES else set(e.encode())
                continue
            if self.peek() == "-" and self.i + 1 < len(self.p) and self.p[self.i + 1] != "]":
                self.i += 1
                hi = self.take()
                out |= set(range(ord(c), ord(hi) + 1))
            else:
                out |= set(c.encode())
        self.i += 1
        return frozenset(ALL - out if negate else out)


@dataclass(frozen=True)
class Dfa:
    next: np.ndarray  # [states, 256] int32, -1 = dead
    accepting: np.ndarray  # [states] bool
    live: np.ndarray  # [states] bool: an accepting state is reachable
    dist: np.ndarray  # [states] int: fewest bytes to an accepting state (-1 if none)

    def allowed(self, state: int) -> np.ndarray:
        """[256] bool: bytes that keep a full match possible."""
        nxt = self.next[state]
        return (nxt >= 0) & self.live[np.maximum(nxt, 0)]

    def matches(self, data: bytes) -> bool:
        s = 0
        for b in data:
            s = int(self.next[s, b])
            if s < 0:
                return False
        return bool(self.accepting[s])


def compile_regex(pattern: str) -> Dfa:
    nfa = _Nfa()
    parser = _Parser(pattern, nfa)
    start, end = parser.alt()
    if parser.i != len(pattern):
        raise parser.error("unbalanced )")

    def closure(states):
        stack, seen = list(states), set(states)
        while stack:
            for t in nfa.eps[stack.pop()]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return frozenset(seen)

    first = closure([start])
    index, order, rows = {first: 0}, [first], []
    while len(rows) < len(order):
        cur = order[len(rows)]
        row = np.full(256, -1, np.int32)
        targets: dict[int, set[int]] = {}
        for s in cur:
            for byte_set, t in nfa.edges[s]:
                for b in byte_set:
                    targets.setdefault(b, set()).add(t)
        for b, ts in targets.items():
            key = closure(ts)
            if key not in index:
                index[key] = len(order)
                order.append(key)
            row[b] = index[key]
        rows.append(row)
    nxt = np.stack(rows)
    accepting = np.array([end in st for st in order])
    dist = np.where(accepting, 0, -1)
    changed = True
    while changed:  # Bellman-Ford on unit edges: fewest bytes to accept
        changed = False
        for s in range(len(order)):
            succ = [dist[t] for t in set(nxt[s][nxt[s] >= 0].tolist()) if dist[t] >= 0]
            if succ and (dist[s] < 0 or min(succ) + 1 < dist[s]):
                dist[s], changed = min(succ) + 1, True
    return Dfa(nxt, accepting, dist >= 0, dist)
