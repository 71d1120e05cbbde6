"""experiments/13_rlhf_flow.py on a random tiny model. The seed's single RLHF step is checked stage
by stage: shapes from the task config, a clip fraction of exactly 0 at ratio 1, advantages whitened
per response with mean 0 in every row, and the demo's advantages equal to the score phase's. The
beta sweep (slow) must write its plot."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from jaxscale.config import ModelConfig
from jaxscale.rlhf.task import TaskConfig

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "13_rlhf_flow.py"
STAGES = (
    "(1) generate",
    "(2) score",
    "(3) reference log-probs",
    "(4) critic values",
    "(5) per-token rewards",
    "(6) GAE",
    "(7) PPO losses",
    "(8) one PPO update",
    "Try It 1",
    "calc reward on a real response",
)


def _run(tmp_path, *argv: str) -> str:
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--random", "--out", str(tmp_path), *argv],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


@pytest.mark.slow  # the whole experiment in a subprocess
@pytest.mark.first_line
def test_experiment_13_one_step_stage_by_stage(tmp_path):
    out = _run(tmp_path, "--no-sweep")
    for stage in STAGES:
        assert stage in out, stage
    assert "Try It 2" not in out  # --no-sweep
    task, V = TaskConfig(), ModelConfig().vocab
    P, N = task.prompt_len, task.max_new
    assert (
        f"prompts [4, {P}], responses [4, {N}], valid mask [4, {N}], actor log-probs [4, {N}]"
        in out
    )
    assert "RM scores [4]:" in out
    assert f"reference log-probs [4, {N}], KL per token [4, {N}]" in out
    assert f"values [4, {N}]:" in out and f"advantages [4, {N}], returns [4, {N}]" in out
    assert re.search(rf"actor logits\s+\(4, 128, 50257\)\s+\[4, {N}, {V}\]", out)
    assert f"[4, {P + 100}]" in out and "1 prefill + 100 decode steps" in out
    lengths = _floats(re.search(r"response lengths \[([^\]]*)\] of budget (\d+)", out)[1])
    assert len(lengths) == 4 and all(1 <= n <= N for n in lengths)
    # each completion's repr: quoted with ' (or with " when it holds a ')
    assert len(re.findall(r"^  \[\d\] true [\d.]+  ['\"]", out, re.M)) == 4
    # (7) at ratio 1: nothing clipped, and the policy loss is -mean(whitened A)
    assert float(re.search(r"clip fraction (\S+)\n", out)[1]) == 0.0
    pg, want = re.search(r"policy loss (\S+) \(= -mean\(whitened A\) (\S+)\)", out).groups()
    assert abs(float(pg) - float(want)) < 1e-5
    # (6) per response: every row's mean is 0 and its std is 1 (0 for a one-token row)
    m = re.search(
        r"whitened per response \(the seed's\): row means \[([^\]]*)\] "
        r"row stds \[([^\]]*)\]",
        out,
    )
    assert all(abs(x) < 1e-3 for x in _floats(m[1]))
    assert all(
        abs(s - 1) < 1e-3 or (s == 0 and n == 1)
        for s, n in zip(_floats(m[2]), lengths, strict=True)
    )
    batch_means = _floats(re.search(r"whitened per batch .*: row means \[([^\]]*)\]", out)[1])
    assert max(batch_means) - min(batch_means) > 1e-2  # per batch keeps the differences
    score_diff = re.search(r"phases\.score, whiten=response\): max \|difference\| (\S+)", out)
    assert float(score_diff[1]) < 1e-5
    mse, half = re.search(r"returns\)\^2\) (\S+), the right target .* = (\S+)\)", out).groups()
    assert abs(0.5 * float(mse) - float(half)) < 1e-3 * max(1.0, float(half))
    # (8) after the update the actor has left the reference: the ratio is no longer 1
    lo, hi = re.search(r"after: ratio in \[(\S+), (\S+)\]", out).groups()
    assert float(lo) < 1.0 < float(hi)
    # part 4: calc reward's total row: reward = RM - penalty, penalty = beta x KL
    kl, pen, rm, net = (
        float(x)
        for x in re.search(
            r"^Total\s+-\s+-\s+(\S+)\s+(\S+)\s+(\S+)\s+"
            r"(\S+)$",
            out,
            re.M,
        ).groups()
    )
    beta = float(re.search(r"calc reward.*\n.*\nbeta (\S+),", out)[1])
    assert abs(pen - beta * kl) < 2e-4 and abs(net - (rm - pen)) < 2e-4


@pytest.mark.slow
@pytest.mark.first_line
def test_experiment_13_beta_sweep(tmp_path):
    out = _run(tmp_path, "--iterations", "3")
    assert "Try It 2" in out and "beta 0 (no KL)" in out and "adaptive" in out
    assert re.search(r"^beta 0 \(no KL\)\s+.*\s0\.000 -> 0\.000\s", out, re.M)  # beta stays 0
    assert (tmp_path / "rlhf_beta_sweep.png").stat().st_size > 10_000
