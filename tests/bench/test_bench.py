"""The bench: predictions checked against the compiled program, and the command's output."""

import json
from types import SimpleNamespace

import jax
import pytest
from figure_checks import capture, check_figure, legend_texts
from planted import plant_extra_pmean

from jaxscale import verify
from jaxscale.analysis.compiled import compile_with_report
from jaxscale.bench import meshes, predict
from jaxscale.bench import report as bench_report
from jaxscale.bench import serve as bench_serve
from jaxscale.cli import main as cli_main
from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.parallel.compose import Strategy, build, step_shape
from jaxscale.tolerances import COMM_RTOL, MEMORY_RTOL

CFG = ModelConfig(n_heads=8, n_kv_heads=8, unroll_layers=True)
TCFG = TrainConfig(global_batch=16, seq_len=32)
PICK = (
    "auto:dp@dp=8",
    "auto:fsdp@fsdp=8",
    "manual:zero1@dp=4,fsdp=2",
    "manual:zero2@dp=8",
    "manual:tp_sp@tp=8",
    "manual:zero3+tp@fsdp=4,tp=2",
)
CASES = [c for c in verify.CASES if f"{c.label}@{c.mesh}" in PICK]  # verify's one list
assert len(CASES) == len(PICK)


@pytest.fixture(scope="module")
def compiled():
    out = {}
    for case in CASES:
        built = build(case.strategy, CFG, TCFG)
        with jax.set_mesh(built.mesh):
            out[case] = (built, compile_with_report(built.step, *built.abstract_args(16, 32))[1])
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.label}@{c.mesh}")
def test_state_and_argument_bytes_match_the_zero_calculator(case, compiled):
    built, report = compiled[case]
    layout, predicted = predict.layout_state(built), predict.predicted_state(built, CFG)
    for m, p in ((layout.params, predicted.params), (layout.grads, predicted.grads)):
        assert m == pytest.approx(p, rel=MEMORY_RTOL)
    assert layout.optimizer == pytest.approx(predicted.optimizer, rel=MEMORY_RTOL)
    batch = 16 * 33 * 4 / built.data_ways
    assert report.memory.argument == pytest.approx(
        predicted.params + predicted.optimizer + batch, rel=MEMORY_RTOL
    )


def test_zero3_on_8_devices_holds_one_eighth_of_replicated(compiled):
    (dp, dp_report), (z3, z3_report) = compiled[CASES[0]], compiled[CASES[1]]  # auto fsdp=8
    full = predict.layout_state(dp).total
    norms = step_shape(CFG, 0).norm_params * 4 * 4  # params, grads, m, v of the norm scales
    opt_leaves = jax.tree.leaves(z3.abstract_state["opt_state"])
    counters = sum(x.dtype.itemsize for x in opt_leaves if x.ndim == 0)  # optax's step counts
    replicated = norms + counters
    assert predict.layout_state(z3).total == pytest.approx((full - replicated) / 8 + replicated)
    assert z3_report.memory.argument < dp_report.memory.argument / 7


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.label != "auto:fsdp"], ids=lambda c: f"{c.label}@{c.mesh}"
)
def test_collective_bytes_per_op_match_the_axes_predictions(case, compiled):
    built, report = compiled[case]
    predicted, why = built.predict_comm(CFG, 16, 32)
    assert why is None and predicted
    measured = {op: t.total_bytes for op, t in report.collective_totals().items()}
    assert set(measured) == set(predicted)
    for op, bytes_ in predicted.items():
        assert measured[op] == pytest.approx(bytes_, rel=COMM_RTOL), op


def test_gspmd_rows_say_why_they_are_not_predicted(compiled):
    built, _ = compiled[CASES[1]]
    predicted, why = built.predict_comm(CFG, 16, 32)
    assert predicted is None and "GSPMD" in why


def test_remat_cuts_temporaries_below_the_unremat_step():
    remat = meshes.remat_report(ModelConfig(n_layers=4), TrainConfig(global_batch=8, seq_len=64))
    assert remat["temp_remat"] < remat["temp_no_remat"]
    assert 0 < remat["seed004_sqrtL_ratio"] < 1  # sqrt(4)/4 = 0.5
    assert remat["seed004_sqrtL_ratio"] == pytest.approx(0.5)


@pytest.mark.slow
@pytest.mark.first_line
def test_bench_command_prints_both_tables_and_writes_json(tmp_path, capsys):
    rc = cli_main(
        [
            "bench",
            "--model",
            "tiny",
            "--strategies",
            "auto:dp,manual:zero3",
            "--steps",
            "1",
            "--global-batch",
            "8",
            "--seq-len",
            "16",
            "--remat-layers",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "manual:zero3" in out and "collectives per step" in out and "✗" not in out
    data = json.loads((tmp_path / "bench_meshes.json").read_text())
    rows = {r["label"]: r for r in data["rows"]}
    zero3 = rows["manual:zero3"]
    assert zero3["equivalent"] and zero3["memory_ok"] and zero3["comm_ok"]
    # the trajectory had real updates: the parameters moved, yet stayed within the tolerance
    assert 0 < zero3["equivalence"]["traj_param_err"] <= 1e-4
    assert (tmp_path / "bench_meshes.png").stat().st_size > 10_000
    assert "remat" in data


@pytest.mark.slow
@pytest.mark.first_line
def test_bench_equivalence_catches_a_gradient_scale_bug(monkeypatch):
    """The bench's eq column is verify's harness without the first-step gradient: DP with the
    extra pmean (gradients 8x the mean) trains almost alike under Adam and clipping, but its
    pre-clip gradient norms give it away."""
    cfg, tcfg = ModelConfig(n_layers=1, unroll_layers=True), TCFG.replace(warmup_steps=0)
    ref, _ = meshes.reference(cfg, tcfg, steps=2)  # 1 timed step + the untimed first
    good = verify.Case(Strategy.parse("manual:dp", "dp=8"))
    assert meshes.bench_case(good, cfg, tcfg, 1, ref).equivalent
    with pytest.raises(ValueError, match="reference has 2 steps"):
        meshes.bench_case(good, cfg, tcfg, 3, ref)
    plant_extra_pmean(monkeypatch)
    row = meshes.bench_case(good, cfg, tcfg, 1, ref)
    assert row.equivalent is False and not row.result.traj_ok
    assert row.result.traj_norm_err == pytest.approx(7.0, rel=1e-3)  # 8x the norm: error 7


def test_the_main_tables_rows_all_run_once_each(capsys):
    """`make bench`'s mesh table: the dense cases of the one list, every one buildable on the
    default model (a row that cannot be built prints `skipped`), none twice; the MoE cases are
    `bench experts`'s and only there."""
    from jaxscale.config import MODEL_PRESETS

    assert cli_main(["bench", "--dry-run"]) == 0
    listed = [tuple(line.split()) for line in capsys.readouterr().out.splitlines()]
    assert len(listed) == len(set(listed)) == len(meshes.DEFAULT_CASES) > 10
    cfg, tcfg = MODEL_PRESETS["small"], TrainConfig(global_batch=16, seq_len=64)
    for case in meshes.DEFAULT_CASES:
        assert not case.model and case.label == case.strategy.label()  # the dense model as is
        build(case.strategy, cfg, tcfg)  # raises where the row would be skipped
    experts = verify.bench_cases("experts")
    assert experts and all(c.model for c in experts)
    assert not set(experts) & set(meshes.DEFAULT_CASES)


@pytest.mark.smoke
def test_bench_bad_input_exits_2(capsys):
    assert cli_main(["bench", "--strategies", "auto:nope"]) == 2
    assert "unknown strategy" in capsys.readouterr().err
    assert cli_main(["bench", "--meshes", "dp=3,tp=-1"]) == 2
    assert cli_main(["bench", "--target", "tpu:v9:1x1"]) == 2


def _aot_reason():
    from jaxscale.analysis import aot

    return aot.aot_unavailable_reason()


@pytest.mark.slow  # 11 s; the AOT path's fast checks are tests/analysis/test_aot.py
@pytest.mark.skipif(_aot_reason() is not None, reason=str(_aot_reason()))
def test_bench_target_tpu_compiles_without_running(tmp_path, capsys):
    rc = cli_main(
        [
            "bench",
            "--target",
            "tpu:v5e:2x4",
            "--model",
            "tiny",
            "--strategies",
            "manual:zero3",
            "--out",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "CPU vs tpu:v5e:2x4" in out and "TPU:" in out and "Nothing ran" in out
    data = json.loads((tmp_path / "bench_v5e:2x4.json").read_text())
    (row,) = data["rows"]
    assert row["memory_ok"] and row["equivalent"] is None and row["step_ms"] == []
    assert row["optimal_seconds"] > 0


def _plotted_row(label: str, mesh: str) -> SimpleNamespace:
    """What the mesh chart reads of a BenchRow, with no compile: every row alike, so the bars
    fill the axes' width and any legend inside them would cover one."""
    mib = bench_report.MiB
    totals = {op: SimpleNamespace(total_bytes=16 * mib) for op in ("all-gather", "all-reduce")}
    return SimpleNamespace(
        label=label,
        case=SimpleNamespace(mesh=mesh),
        report=SimpleNamespace(collective_totals=lambda: totals),
        state_layout=SimpleNamespace(params=16 * mib, grads=16 * mib, optimizer=32 * mib),
        state_predicted=SimpleNamespace(total=64 * mib),
    )


def test_the_mesh_chart_keeps_its_legends_off_the_bars(tmp_path, monkeypatch):
    saved = capture(monkeypatch)
    rows = [_plotted_row(f"manual:zero{i}", "dp=8") for i in range(1, 4)]
    rows += [_plotted_row("auto:fsdp_tp", "fsdp=4,tp=2"), _plotted_row("auto:tp", "tp=8")]
    path = bench_report._plot(rows, tmp_path / "bench_meshes.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
    ((fig, _),) = saved
    legends = check_figure(fig)
    assert len(legends) == 2
    assert "predicted total" in legend_texts(legends[0])
    assert legend_texts(legends[1]) == ["all-gather", "all-reduce"]


def test_the_serve_chart_keeps_its_legends_off_the_data(tmp_path, monkeypatch):
    """`bench serve`'s figure from a made-up result (its module's tests run the engine)."""
    saved = capture(monkeypatch)
    latency = {rate: {"ttft_p50_ms": 20 + rate, "tpot_p50_ms": 5 + rate / 4} for rate in (1, 4, 16)}
    steps = {"static": {"steps": 90, "predicted_steps": 90}}
    steps["continuous"] = {"steps": 88, "predicted_steps": 88}
    res = {"in_process": latency, "http": latency, "batching": steps}
    path = bench_serve.plot(res, tmp_path / "bench_serve.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
    ((fig, _),) = saved
    legends = check_figure(fig)
    assert len(legends) == 2 and len(legend_texts(legends[0])) == 4
