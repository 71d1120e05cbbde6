"""The three corrections of seed 002's strategy calculator in default (corrected) mode, each checked
against a hand computation from the seed's own formulas (activations: 10 values per token and
hidden unit, per layer of a stage, for the microbatches in flight; a TP all-reduce moves 2(t-1)/t
of the activation; a pipeline boundary carries the activation forward and its gradient back),
and the seed-faithful mode left as the seed prints it.

The case is the issue's: `jaxscale advise --params 13e9 --gpus 32 --gpu-mem 40 --seed002-table`
(batch 512 x 4096 tokens, micro-batch 1, bf16)."""

import json

import pytest

from jaxscale.calc.advisor_seed002 import seed002_calculator
from jaxscale.cli import main

GB = 1e9
B, S = 512, 4096  # global batch, tokens per sequence
BASE = ["advise", "--params", "13e9", "--gpus", "32", "--gpu-mem", "40", "--seed002-table"]


def rows(capsys, *extra) -> tuple[dict, dict]:
    assert main([*BASE, *extra, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    return {(r["tp"], r["pp"], r["dp"]): r for r in report["seed002"]["rows"]}, report


def boundary_gb(dp: int, hidden: int) -> float:
    """One pipeline boundary per step: the replica's B/dp sequences, forward and backward."""
    return 2 * (B // dp) * S * hidden * 2 / GB


def test_no_pipeline_traffic_without_a_pipeline(capsys):
    table, _ = rows(capsys, "--hidden", "5120", "--layers", "40")
    for (_tp, pp, dp), row in table.items():
        assert row["pp_comm_gb"] == (0 if pp == 1 else pytest.approx(boundary_gb(dp, 5120)))
    assert table[1, 2, 16]["pp_comm_gb"] == pytest.approx(2.68435456)  # 2 x 32 x 4096 x 5120 x 2
    # seed-faithful keeps the seed's traffic on PP=1 rows: the global batch, its 8192 width
    faithful = seed002_calculator(13, 32, 40, seed_faithful=True)
    one_stage = [r for r in faithful.rows if r.pp == 1]
    assert one_stage and all(
        r.pp_comm_gb == pytest.approx(2 * B * S * 8192 * 2 / GB) for r in one_stage
    )


def test_activations_and_volumes_follow_the_given_shape(capsys):
    table, _ = rows(capsys, "--hidden", "5120", "--layers", "40")
    row = table[2, 8, 2]
    # TP2 PP8 DP2: 40/8 = 5 layers per stage, min(8, 512/2) = 8 microbatches of 1 x 4096 tokens
    act = 10 * 1 * S * 5120 / 2 * 5 * 8 * 2
    state = 13e9 * 2 / 16 + 13e9 * 2 / 16 + 13e9 * 8 / 16 / 2  # weights, grads / tp*pp; Adam / dp
    assert row["activations_gb"] == pytest.approx(act / GB)
    assert row["memory_per_gpu_gb"] == pytest.approx((act + state) / GB)
    assert f"{row['memory_per_gpu_gb']:.1f}" == "14.9"  # the seed's 8192 x 80 shape gave 33.3
    # TP: 4 all-reduces per layer of 256 x 4096 x 5120 bf16, ring factor 2 * 1/2, 5 layers
    assert row["tp_comm_gb"] == pytest.approx(4 * 1 * (256 * S * 5120 * 2) * 5 / GB)


def test_shape_derived_from_params_when_not_given(capsys):
    table, report = rows(capsys)
    hidden, layers = report["hidden"], report["layers"]  # the advisor's derived shape
    assert (hidden, layers) != (8192, 80)
    row = table[2, 8, 2]
    act = 10 * S * hidden / 2 * -(-layers // 8) * 8 * 2
    assert row["activations_gb"] == pytest.approx(act / GB)
    assert table[1, 2, 16]["pp_comm_gb"] == pytest.approx(boundary_gb(16, hidden))


def test_tensor_parallel_counts_forward_and_backward(capsys):
    table, _ = rows(capsys, "--hidden", "8192", "--layers", "80")  # the seed's own shape
    # TP2 PP1 DP16: 32 sequences per replica; 2 forward + 2 backward all-reduces per layer, each
    # 2 * (2-1)/2 of 32 x 4096 x 8192 bf16; 80 layers on the one stage
    per_all_reduce = 2 * (1 / 2) * 32 * S * 8192 * 2
    assert table[2, 1, 16]["tp_comm_gb"] == pytest.approx(4 * per_all_reduce * 80 / GB)
    assert f"{table[2, 1, 16]['tp_comm_gb']:.2f}" == "687.19"  # forward only: 343.60
    assert table[1, 1, 32]["tp_comm_gb"] == 0


def test_seed_faithful_is_the_seed_printout(capsys):
    assert main([*BASE, "--seed-faithful"]) == 0
    out = capsys.readouterr().out
    # the seed's per-step TP volume counts the forward only, over the global batch
    assert f"{4 * B * S * 8192 * 2 * (1 / 2) * 80 / GB:.2f} GB" in out
    faithful = seed002_calculator(70, seed_faithful=True)
    assert f"{faithful.best.total_comm_gb:.2f}" == "421.07"
