"""Fuzz `jaxscale calc *`, `simulate *` and `advise` against the CLI contract of tests/cli_fuzz.py:
every value-taking flag of every command (found by walking the real argparse tree, so a command
added later is fuzzed too) gets the hostile values of its kind; each outcome is exit 0, or exit 2
with one error line naming the flag and nothing written. Then a table of inputs that must be
refused, and property tests of the argparse types in cliutil."""

import argparse
import functools
import math

import cli_fuzz as cf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxscale import cli, cliutil

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")  # numpy noise reaches users

AREA = ("calc", "simulate", "advise")
# Base arguments per command: its required flags, and a smaller workload where the default one
# is slow (the flag under test comes after them, so it wins when it is one of them).
BASE = {
    ("simulate", "speculative"): ("--trials", "20", "--total-tokens", "60", "--max-k", "4"),
}


_build_parser = cli.build_parser


@functools.cache
def _parser() -> argparse.ArgumentParser:
    return _build_parser()


@pytest.fixture(autouse=True, scope="module")
def _one_parser():
    """Build the argparse tree once: `main` parses with it (parsing does not change a parser)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli, "build_parser", _parser)
        yield


def _flags(parser: argparse.ArgumentParser, action: argparse.Action) -> tuple[str, ...]:
    """The option strings an error may name: a hidden alias's own and its canonical flag's."""
    same = [a for a in cf.value_flags(parser) if a.dest == action.dest]
    return tuple(s for a in same for s in a.option_strings)


def _values(action: argparse.Action) -> tuple[str, ...]:
    """The harness's hostile values; a comma list of numbers also gets the numbers, alone and
    after a good item."""
    values = cf.hostile(action)
    if getattr(action.type, "__qualname__", "").startswith("comma_list."):
        values += cf.NUMBERS + tuple(f"1,{v}" for v in ("0", "-1", "nan", "inf", "1e400", "x"))
    return values


def _cases():
    for words, parser in cf.commands():
        if words[0] not in AREA:
            continue
        required = [a for a in parser._actions if a.required and a.option_strings]
        assert not required or words in BASE, f"{words}: give BASE its required flags"
        for action in cf.value_flags(parser):
            flags = _flags(parser, action)
            for value in _values(action):
                flag = action.option_strings[0]
                argv = (*words, *BASE.get(words, ()), f"{flag}={value}")
                yield pytest.param(argv, flags, id=" ".join((*words, flag, repr(value))))


CASES = list(_cases())


@pytest.mark.parametrize("argv, flags", CASES)
def test_hostile_value(argv, flags, tmp_path):
    cf.check(cf.run(argv, tmp_path / "work"), flags)


# The issue's --plot repros: a directory, or a path under a file, is refused before any work.
PLOTS = (
    ("calc", "memory"),
    ("calc", "chinchilla"),
    ("calc", "time"),
    ("calc", "scaling"),
    ("calc", "rl", "throughput"),
)
MOE = ("calc", "moe", "--shared", "1B", "--expert-size", "1B")
# (argv, the flags its error may name): inputs every command must refuse with exit 2.
MUST_FAIL = [
    # the repros
    (("calc", "inference", "--hbm-tbs", "inf"), ("--hbm-tbs",)),
    (("calc", "inference", "--gpu-tflops", "nan"), ("--gpu-tflops",)),
    (("simulate", "pipeline", "-s", "1000", "-m", "1000"), ("--pp", "--microbatches")),
    (("simulate", "overlap", "--iterations", "1000000"), ("--iterations",)),
    *[((*words, "--plot", p), ("--plot",)) for words in PLOTS for p in ("{dir}", "{file}/x.png")],
    # non-finite and out-of-range numbers
    (("advise", "--params", "nan"), ("--params",)),
    (("advise", "--gpu-mem", "inf"), ("--gpu-mem",)),
    (("advise", "--mfu", "1.5"), ("--mfu",)),
    (("advise", "--headroom", "1"), ("--headroom",)),
    (("advise", "--params", "7"), ("--params",)),
    (("calc", "time", "--gpus", "0,8"), ("--gpus",)),
    (("calc", "scaling", "--strong-times", "1,inf"), ("--strong-times",)),
    (("calc", "kv", "--contexts", "4096,-1"), ("--contexts",)),
    (("calc", "rl", "transfer", "--transfers", "-1"), ("--transfers",)),
    (("simulate", "batching", "--mean-length", "nan"), ("--mean-length",)),
    (("simulate", "param-server", "--batch-size", "-1"), ("--batch-size",)),
    (("simulate", "param-server", "--staleness-sweep", "1,99999999999"), ("--staleness-sweep",)),
    # runs that would take minutes: refused with the limit
    (("simulate", "pipeline", "--pp", "200", "-m", "200"), ("--pp",)),
    (("simulate", "overlap", "--batches", "1000000"), ("--batches",)),
    (("simulate", "batching", "--num-requests", "100000"), ("--num-requests",)),
    (("simulate", "speculative", "--trials", "100000"), ("--trials",)),
    (("simulate", "speculative", "--target-length", "10000000"), ("--target-length",)),
    (("simulate", "param-server", "--updates", "1000000"), ("--updates",)),
    (("simulate", "param-server", "--dim", "512", "--samples", "1024"), ("--dim",)),
    (("simulate", "param-server", "--staleness-sweep", "1000"), ("--staleness-sweep",)),
    (("calc", "rl", "throughput", "--gpus", "1000000"), ("--gpus",)),
    (("calc", "comm", "--layers", "2147483647"), ("--layers",)),
    # combinations: the error names the flags involved
    (("advise", "--micro-batch", "8", "--batch-size", "4"), ("--micro-batch",)),
    (("advise", "--gpus", "12"), ("--gpus",)),
    (("advise", "--moe", "--num-experts", "2", "--top-k", "4"), ("--top-k",)),
    (("advise", "--gpus", "8", "--batch-size", "3", "--micro-batch", "2"), ("--batch-size",)),
    ((*MOE, "--experts", "2", "--top-k", "4"), ("--top-k",)),
    (("calc", "scaling", "--gpus", "1,2", "--strong-times", "1"), ("--strong-times",)),
    (("calc", "scaling", "--layers", "2", "--mp-gpus", "3"), ("--mp-gpus",)),
    (("calc", "scaling", "--compute-s", "0", "--comm-s", "0"), ("--compute-s",)),
    (("calc", "rl", "throughput", "--params", "1e20"), ("--params",)),
    (("calc", "chinchilla", "--params", "1e-300", "--tokens-per-param", "1e-300"), ("--params",)),
    (("calc", "rl", "throughput", "--gen-gpus", "256"), ("--gen-gpus",)),
    (("simulate", "batching", "--min-length", "50", "--max-length", "20"), ("--min-length",)),
    (("simulate", "pipeline", "--schedule", "interleaved", "-m", "6"), ("--microbatches",)),
    (("simulate", "param-server", "--samples", "4"), ("--samples",)),
    (("simulate", "param-server", "--batch-size", "600"), ("--batch-size",)),
    (("simulate", "param-server", "--jitter", "1"), ("--jitter",)),
]


@pytest.mark.parametrize("argv, flags", MUST_FAIL, ids=lambda x: " ".join(x))
def test_must_fail(argv, flags, tmp_path):
    cf.check(cf.run(argv, tmp_path / "work"), flags, must_fail=True)


def test_plot_unwritable_dir(tmp_path):
    """/proc takes no new file, for root either (whom permission bits do not stop): the flag's
    check creates a probe file rather than trusting os.access."""
    o = cf.run(("calc", "memory", "--plot", "/proc/jaxscale/x.png"), tmp_path / "work")
    cf.check(o, ("--plot",), must_fail=True)


@pytest.mark.parametrize(
    "argv",
    [
        ("advise", "--params", "7B", "--gpus", "8"),  # the count syntax of every calc
        ("advise", "--hidden", "5120", "--seq", "2048", "--batch", "64"),  # old spellings
        ("calc", "memory", "--gpu-memory-gb", "40", "--batch", "2", "--seq", "1024"),
        ("calc", "kv", "--custom", "--heads", "4", "--dim", "64", "--num-gpus", "2"),
        ("calc", "rl", "memory", "--params-b", "13"),
        ("simulate", "pipeline", "--stages", "3", "-m", "6"),
        *[(*words, "--plot", "{missing}/x.png") for words in PLOTS],  # parents are created
    ],
    ids=" ".join,
)
def test_must_pass(argv, tmp_path):
    o = cf.run(argv, tmp_path / "work")
    assert o.rc == 0 and not o.err, o.err
    assert "--plot" not in argv or [f for f in o.new_files if f.endswith("x.png")], o.new_files


# --- the argparse types ---------------------------------------------------------------------

finite = st.floats(allow_nan=False, allow_infinity=False)


@given(finite.filter(lambda x: x > 0))
def test_positive_float_round_trips(x):
    assert cliutil.positive_float(repr(x)) == x


@given(st.sampled_from(["nan", "inf", "-inf", "NaN", "Infinity", "1e400", "-1e400"]))
def test_non_finite_refused(text):
    for parse in (
        cliutil.positive_float,
        cliutil.non_negative_float,
        cliutil.finite_float,
        cliutil.fraction,
        cliutil.probability,
        cliutil.parse_count,
    ):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


@given(st.integers())
def test_ints_bounded(n):
    for parse, low in ((cliutil.positive_int, 1), (cliutil.non_negative_int, 0)):
        if low <= n <= cliutil.INT_MAX:
            assert parse(str(n)) == n
        else:
            with pytest.raises(argparse.ArgumentTypeError):
                parse(str(n))


@given(finite.filter(lambda x: x > 0), st.sampled_from(["", "k", "M", "B", "T"]))
@settings(max_examples=200)
def test_parse_count(x, suffix):
    scale = {"": 1, "k": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}[suffix]
    if math.isfinite(x * scale):
        assert cliutil.parse_count(f"{x!r}{suffix}") == pytest.approx(x * scale)
    else:
        with pytest.raises(argparse.ArgumentTypeError):
            cliutil.parse_count(f"{x!r}{suffix}")
