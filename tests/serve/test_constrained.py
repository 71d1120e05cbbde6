"""Constrained decoding: the regex DFA against Python's `re`, the JSON automaton against the
`json` module, and generation on the model whose output always parses / fully matches."""

import json
import random
import re

import numpy as np
import pytest

from jaxscale.config import ModelConfig
from jaxscale.model import state as ms
from jaxscale.serve import constrained, json_pda
from jaxscale.serve.regex_dfa import compile_regex
from jaxscale.serve.sampling import SamplingParams

EMAIL = r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}"  # seed 002 ch11 "Regex Constraints"
PATTERNS = [
    EMAIL,
    r"\d{3}-\d{3}-\d{4}",
    r"(ab|c)*d?",
    r"a{2,4}b+",
    r"[^x]y.",
    r"def [a-z_]+\((\w+(, \w+)*)?\):",
    r"(a|b){0,3}c",
]
ALPHABET = "abcdxy@.-_ ():0123456789AZ,\n"


def _walk(dfa, rng, max_len=20) -> bytes:
    """A random string the DFA accepts (random live transitions, stopping at accepting)."""
    s, out = 0, bytearray()
    while True:
        choices = np.flatnonzero(dfa.allowed(s))
        if dfa.accepting[s] and (not len(choices) or rng.random() < 0.3 or len(out) >= max_len):
            return bytes(out)
        b = int(rng.choice(choices))
        out.append(b)
        s = int(dfa.next[s, b])


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_dfa_matches_exactly_what_re_fullmatch_matches(pattern):
    dfa, rng = compile_regex(pattern), np.random.default_rng(0)
    strings = [
        "".join(random.Random(i).choice(ALPHABET) for _ in range(i % 13)) for i in range(800)
    ]
    strings += [_walk(dfa, rng).decode("latin-1") for _ in range(200)]  # positives
    for s in strings:
        assert dfa.matches(s.encode("latin-1")) == bool(re.fullmatch(pattern, s)), (pattern, s)


def test_bad_patterns_are_named():
    for bad in ("(ab", "a)", "*a", "a{3,1}", "[ab"):
        with pytest.raises(ValueError, match="regex"):
            compile_regex(bad)


def _accepts(text: bytes) -> bool:
    state = json_pda.INITIAL
    for b in text:
        state = json_pda.advance(state, b)
        if state is None:
            return False
    return json_pda.done(state)


def test_the_json_automaton_accepts_compact_json_and_rejects_broken_json():
    rng = random.Random(0)

    def value(d=0):
        r = rng.random()
        if d > 3 or r < 0.3:
            return rng.choice(
                [
                    0,
                    -12,
                    3.5,
                    1e-7,
                    -0.25,
                    True,
                    False,
                    None,
                    'a"b\\c/\n\t',
                    "é",
                    "",
                    12345678901234,
                ]
            )
        if r < 0.65:
            return [value(d + 1) for _ in range(rng.randint(0, 3))]
        return {rng.choice(["k", "", "a b"]): value(d + 1) for _ in range(rng.randint(0, 3))}

    for _ in range(1000):
        v = value()
        doc = json.dumps(v if isinstance(v, list | dict) else [v], separators=(",", ":"))
        assert _accepts(doc.encode()), doc
    for bad in (
        b'{"a"}',
        b"[01]",
        b"{,}",
        b"[1,]",
        b'{"a":1,}',
        b"[tru]",
        b'["\\x"]',
        b"[1.]",
        b"[-]",
        b"1",
        b'"s"',
        b"[]]",
        b"[1e]",
    ):
        assert not _accepts(bad), bad


def test_random_walks_under_a_budget_always_finish_valid_json():
    for seed in range(300):
        r = np.random.default_rng(seed)
        budget, state, out = int(r.integers(2, 50)), json_pda.INITIAL, bytearray()
        while not json_pda.done(state):
            b = int(r.choice(np.flatnonzero(json_pda.allowed(state, budget - len(out)))))
            out.append(b)
            state = json_pda.advance(state, b)
        assert len(out) <= budget
        json.loads(out)


CFG = ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2, max_seq=96)
PARAMS = ms.init_params(CFG, 0)


@pytest.mark.slow
@pytest.mark.first_line
def test_generated_json_always_parses():
    for seed in range(6):
        out = constrained.generate(
            PARAMS,
            CFG,
            list(b"data = "),
            constrained.JsonConstraint(),
            max_new=40,
            sampling=SamplingParams(1.0, seed=seed),
        )
        assert len(out) <= 40
        json.loads(bytes(out))


@pytest.mark.slow
@pytest.mark.first_line
def test_generated_text_fully_matches_the_regex():
    for pattern, seed in ((EMAIL, 0), (EMAIL, 1), (r"\d{3}-\d{3}-\d{4}", 2)):
        c = constrained.RegexConstraint(pattern)
        out = constrained.generate(
            PARAMS, CFG, list(b"contact: "), c, max_new=30, sampling=SamplingParams(1.0, seed=seed)
        )
        assert re.fullmatch(pattern, c.text(out).decode()), c.text(out)


@pytest.mark.slow
def test_json_schema_constraints_through_outlines_core():
    pytest.importorskip("outlines_core", reason="the grammar extra: pip install -e '.[grammar]'")
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer"},
            "ok": {"type": "boolean"},
        },
        "required": ["name", "age", "ok"],
    }
    c = constrained.SchemaConstraint(schema)
    for seed in range(3):
        out = constrained.generate(
            PARAMS, CFG, list(b"user = "), c, max_new=60, sampling=SamplingParams(1.0, seed=seed)
        )
        doc = json.loads(c.text(out))
        assert set(doc) == {"name", "age", "ok"}
        assert isinstance(doc["name"], str) and len(doc["name"]) <= 6
        assert type(doc["age"]) is int and type(doc["ok"]) is bool
