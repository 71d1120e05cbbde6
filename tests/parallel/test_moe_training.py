"""Training an MoE model end to end: `jaxscale train --mesh ep=4,dp=2 --experts 8` learns and logs
its routing terms, a checkpoint restores across meshes, the balance loss keeps the experts'
load in a band, the bench's all-to-alls equal their prediction, and experiment 08 runs."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxscale import verify
from jaxscale.analysis.compiled import compile_with_report
from jaxscale.bench import experts as bench_experts
from jaxscale.bench import meshes
from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.lessons import experts
from jaxscale.parallel.compose import Strategy, build
from jaxscale.tolerances import COMM_RTOL, TRAJ_ATOL
from jaxscale.train.loop import RunSetup, train

ROOT = Path(__file__).resolve().parents[2]
CFG = ModelConfig(n_experts=8, top_k=2)


@pytest.mark.slow
@pytest.mark.first_line
def test_train_cli_moe_learns_and_logs_routing(tmp_path):
    metrics = tmp_path / "m.jsonl"
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": "8", "JAX_DISABLE_MOST_OPTIMIZATIONS": "true"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "jaxscale",
            "train",
            "--mesh",
            "ep=4,dp=2",
            "--experts",
            "8",
            "--top-k",
            "2",
            "--steps",
            "30",
            "--data",
            "markov",
            "--log-every",
            "5",
            "--eval-every",
            "0",
            "--metrics",
            str(metrics),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [0, 5, 10, 15, 20, 25, 29]
    assert steps[-1]["ce"] < steps[0]["ce"] - 1.0  # it learns
    for r in steps:  # the routing terms of every logged step
        assert 0.0 <= r["drop_fraction"] < 1.0
        load = np.array(r["expert_load"])
        assert load.shape == (CFG.n_layers, 8)
        # the metrics file rounds the load to 5 decimals: 8 entries are off by <= 4e-5 in sum
        np.testing.assert_allclose(load.sum(-1), 1.0, atol=4e-5)
        assert r["load_max_over_mean"] == pytest.approx(8 * load.max(), abs=8 * 5e-6)
        want = r["ce"] + CFG.aux_loss_weight * r["aux_loss"] + CFG.z_loss_weight * r["z_loss"]
        assert r["loss"] == pytest.approx(want, rel=1e-5)


@pytest.mark.slow
@pytest.mark.first_line
def test_moe_checkpoint_restores_across_meshes(tmp_path):
    tcfg = TrainConfig(steps=6, global_batch=16, seq_len=32, eval_every=0, log_every=1)
    ckpt = str(tmp_path / "ckpt")
    first = train(
        CFG,
        tcfg.replace(steps=3),
        RunSetup(
            mesh="ep=4,dp=2",
            strategy="manual:dp+ep",
            dataset="markov",
            ckpt_dir=ckpt,
            progress=False,
            sample_tokens=0,
        ),
    )
    # the same run, resumed on other meshes and strategies: EP x TP of experts, then auto
    for mesh, strategy in (("ep=2,tp=4", "manual:ep+tp"), ("ep=8", "auto")):
        steps = 5 if "tp" in mesh else 6
        res = train(
            CFG,
            tcfg.replace(steps=steps),
            RunSetup(
                mesh=mesh,
                strategy=strategy,
                dataset="markov",
                ckpt_dir=ckpt,
                resume=True,
                progress=False,
                sample_tokens=0,
            ),
        )
        assert res.resumed_from == steps - (2 if "tp" in mesh else 1)
    straight = train(
        CFG,
        tcfg,
        RunSetup(
            mesh="ep=4,dp=2",
            strategy="manual:dp+ep",
            dataset="markov",
            progress=False,
            sample_tokens=0,
        ),
    )
    assert first.history[0]["loss"] == pytest.approx(straight.history[0]["loss"], rel=1e-6)
    assert res.history[-1]["loss"] == pytest.approx(straight.history[-1]["loss"], abs=TRAJ_ATOL)


@pytest.mark.slow
@pytest.mark.first_line
def test_balance_loss_keeps_the_load_in_band_and_its_absence_is_worse():
    runs = experts.load_balance(150)
    on, off = runs[0.01], runs[0.0]
    assert experts.late(on).max() <= experts.BAND
    assert experts.late(off).mean() >= 1.3 * experts.late(on).mean()
    assert experts.late(off, "drop").mean() > experts.late(on, "drop").mean()


@pytest.mark.slow
@pytest.mark.first_line
def test_bench_all_to_alls_equal_the_prediction_and_the_seed_table():
    cfg, tcfg = bench_experts.CFG, verify.TCFG
    ref, _ = meshes.reference(cfg, tcfg, 2)
    case = verify.Case(Strategy.parse("manual:dp+ep", "ep=4,dp=2"), model=verify.MOE)
    row = meshes.bench_case(case, cfg, tcfg, 1, ref)
    count, got, want = bench_experts.a2a(row)
    # 4 per MoE layer: dispatch and combine, forward and backward; E x B_l x C x D f32 each
    assert count == 4 * cfg.n_moe_layers
    assert got == want == 4 * cfg.n_moe_layers * 8 * 2 * cfg.capacity(32) * cfg.d_model * 4
    assert row.equivalent and row.comm_ok
    tp, ranks, n_experts = bench_experts.seed_table(tcfg.global_batch, tcfg.seq_len)
    assert abs(tp.measured - tp.predicted) <= COMM_RTOL * tp.predicted  # TP: 2S
    assert ranks.measured == ranks.predicted  # EP: 2kS/N with N = EP ranks ...
    assert n_experts.measured == 2 * n_experts.predicted  # ... not N = experts (16 = 2 x 8)


@pytest.mark.slow  # whole experiment in a subprocess
@pytest.mark.first_line
def test_experiment_08_parts_1_to_3():
    env = {**os.environ, "JAX_DISABLE_MOST_OPTIMIZATIONS": "true"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "08_experts.py"), "--skip-training"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "N = 64 experts  32     64          63         2" in out  # 2 MiB
    assert "N = 8 EP ranks  32     64          56        16" in out  # 16 MiB
    assert re.search(r"DeepSeek-V3\s+671\.0\s+37\.0", out)
    assert re.search(r"Mixtral-8x7B \(seed 003\)\s+47\.0\s+13\.0", out)
    assert "(equal)" in out


def test_bench_experts_dry_run_lists_the_rows(capsys):
    from jaxscale.cli import main as cli_main

    assert cli_main(["bench", "experts", "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    want = [[c.strategy.label(), c.mesh] for c in bench_experts.ROWS]
    assert [line.split() for line in out] == want
    assert all(c.model for c in bench_experts.ROWS)  # the MoE cases, and only they


def test_remat_moe_step_all_to_alls_equal_the_prediction():
    """A rematerialised expert-parallel step runs each MoE layer's forward twice, so it has 6
    all-to-alls of E x B_l x C x D per layer, not 4 (ep.py): the census of the compiled step
    equals both the closed form and `predict_comm`, and the 4-per-layer count a prediction
    ignoring remat gives is outside COMM_RTOL. The slow bench test sees the step without remat."""
    cfg = verify.CFG.replace(**dict(verify.MOE), remat="block")
    batch, seq_len = 16, 32
    tcfg = TrainConfig(global_batch=batch, seq_len=seq_len)
    built = build(Strategy.parse("manual:dp+ep", "ep=4,dp=2"), cfg, tcfg)
    with jax.set_mesh(built.mesh):
        _, report = compile_with_report(built.step, *built.abstract_args(batch, seq_len))
    measured = report.collective_totals()["all-to-all"]
    predicted, why = built.predict_comm(cfg, batch, seq_len)
    assert why is None
    rows_local = batch // 8  # the batch splits over dp and ep
    one_a2a = cfg.n_experts * rows_local * cfg.capacity(seq_len) * cfg.d_model * 4  # f32
    assert measured.count == 6 * cfg.n_moe_layers
    assert measured.total_bytes == pytest.approx(6 * cfg.n_moe_layers * one_a2a, rel=COMM_RTOL)
    assert measured.total_bytes == pytest.approx(predicted["all-to-all"], rel=COMM_RTOL)
    plain = cfg.replace(remat="none")
    no_remat, _ = build(built.strategy, plain, tcfg).predict_comm(plain, batch, seq_len)
    assert no_remat["all-to-all"] == 4 * cfg.n_moe_layers * one_a2a
    assert measured.total_bytes != pytest.approx(no_remat["all-to-all"], rel=COMM_RTOL)
