"""Fuzz the lab's own commands (train, every bench, verify, launch, hello, plot, doctor, rl,
rlhf): every flag that takes a value, fed hostile values (paths: missing, a file where a
directory belongs and the reverse, unwritable), must end in exit 0 or in exit 2 with one error
line that names the flag
-- no traceback, nothing written (the contract in tests/cli_fuzz.py).

The commands run with `--dry-run` (or an instant command to launch), so a value that is fine
checks everything and compiles nothing; the calculators' and simulators' flags are fuzzed in
tests/test_fuzz_calc.py.
"""

import json

import pytest
from cli_fuzz import check, commands, hostile, kind, run, value_flags

UNUSABLE = ("{file}/out.png", "/proc/x/out")
METRICS = json.dumps({"run_id": "r", "step": 0, "loss": 5.0, "lr": 0.0, "grad_norm": 1.0})
BASE = {  # the arguments each command runs with, so that a good value is cheap
    ("train",): ["--dry-run", "--data", "markov"],
    ("bench", "meshes"): ["--dry-run"],
    ("verify",): ["--dry-run"],
    ("launch",): ["--", "python", "-c", "pass"],
    ("hello",): ["--json"],
    ("plot",): ["{metrics}"],
    ("doctor",): ["--json"],
    ("rl", "ppo"): ["--dry-run"],  # the other algorithms take the same flags (one config)
    ("bench", "collectives"): ["--dry-run"],
    ("bench", "pipeline"): ["--dry-run"],
    ("bench", "experts"): ["--dry-run"],
    ("bench", "context"): ["--dry-run"],
    ("bench", "scaling"): ["--dry-run"],
    ("bench", "serve"): ["--dry-run"],
    ("bench", "rl"): ["--dry-run"],
    ("rlhf",): ["--dry-run"],  # checks every path and flag, loads and compiles nothing
    ("serve",): ["--dry-run"],  # loads, places and binds (a free port: below), serves nothing
}
# a value flag's words before the base arguments (argparse REMAINDER takes all that follows --)
CASES = [
    pytest.param(words, flag, value, id=f"{' '.join(words)} {flag.option_strings[-1]}={value!r}")
    for words, parser in commands()
    if words in BASE
    for flag in value_flags(parser)
    for value in hostile(flag)
]
MUST_FAIL = [  # the issue's repros, and what each must refuse
    (["train", "--dry-run", "--lr", "nan"], ("--lr",)),
    (["train", "--dry-run", "--lr", "inf"], ("--lr",)),
    (["train", "--dry-run", "--eval-batches", "0"], ("--eval-batches",)),
    (["train", "--dry-run", "--stop-after", "-1"], ("--stop-after",)),
    (["train", "--dry-run", "--data", "markov", "--vocab", "10"], ("--vocab",)),
    (["train", "--dry-run", "--vocab", "10"], ("--vocab",)),
    (["train", "--dry-run", "--min-lr-ratio", "-1"], ("--min-lr-ratio",)),
    (["train", "--dry-run", "--min-lr-ratio", "nan"], ("--min-lr-ratio",)),
    (["train", "--dry-run", "--b1", "2"], ("--b1",)),
    (["train", "--dry-run", "--grad-clip", "nan"], ("--grad-clip",)),
    (["train", "--dry-run", "--seed", "-1"], ("--seed",)),
    (["train", "--dry-run", "--seed", "99999999999999999999"], ("--seed",)),
    (["train", "--dry-run", "--warmup-steps", "99999999999"], ("--warmup-steps",)),
    (["train", "--dry-run", "--prompt", ""], ("--prompt",)),
    (["train", "--dry-run", "--sample-tokens", "-1"], ("--sample-tokens",)),
    (["train", "--dry-run", "--metrics", "{dir}"], ("--metrics",)),
    (["train", "--dry-run", "--metrics", "{file}/m.jsonl"], ("--metrics",)),
    (["train", "--dry-run", "--resume"], ("--resume",)),
    (["train", "--dry-run", "--max-seq", "16"], ("--seq-len", "--max-seq")),
    (["train", "--dry-run", "--data", "{file}"], ("--data",)),  # 1 byte: no window fits
    (["train", "--dry-run", "--mesh", "pp=2,dp=4"], ("--mesh",)),
    (["train", "--dry-run", "--mesh", "tp=8"], ("--mesh",)),  # 4 kv heads over 8
    (["train", "--dry-run", "--strategy", "manual:ring"], ("--strategy",)),
    (["bench", "--dry-run", "--global-batch", "7", "--strategies", "auto:dp"], ("--global-batch",)),
    (["bench", "--dry-run", "--steps", "0"], ("--steps",)),
    (["bench", "--dry-run", "--strategies", "manual:zero3", "--meshes", "dp=3"], ("--meshes",)),
    (["bench", "collectives", "--dry-run", "--sizes", "64G"], ("--sizes",)),
    (["verify", "--dry-run", "--only", "no-such-case"], ("--only",)),
    (["launch", "-n", "2", "--", "jaxscal", "doctor"], ("jaxscal",)),
    (["plot", "{missing}"], ("metrics",)),
]


@pytest.mark.parametrize("words, flag, value", CASES)
def test_a_hostile_value_is_refused_cleanly_or_accepted(words, flag, value, tmp_path):
    option = flag.option_strings[-1]
    base = BASE[words]
    if words == ("serve",):  # a free port each (xdist workers run cases at once); a fuzzed
        # --port comes after it and wins
        base = [*base, "--port", str(_free_port())]
    argv = (
        [*words, option, value, *base] if words == ("launch",) else [*words, *base, option, value]
    )
    outcome = run(argv, tmp_path / "work", files={"{metrics}": METRICS})
    # a path under a regular file or under /proc can be neither read nor written: refused,
    # whether the flag reads it or writes it
    check(outcome, tuple(flag.option_strings), must_fail=value in UNUSABLE and kind(flag) == "path")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "argv, names", MUST_FAIL, ids=lambda a: " ".join(a) if isinstance(a, list) else None
)
def test_the_issue_repros_are_refused(argv, names, tmp_path):
    check(run(argv, tmp_path / "work", files={"{metrics}": METRICS}), names, must_fail=True)


def test_the_fuzz_covers_every_lab_command_and_many_cases():
    covered = {words for words, *_ in (p.values for p in CASES)}
    assert covered == {w for w in BASE if w != ("doctor",)}  # doctor takes no value flag
    assert len(CASES) > 300
