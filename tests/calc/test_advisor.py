"""jaxscale's own parallelism advice (advisor_model.py, advisor.py) and `jaxscale advise`.

Expected values are closed forms written here from the formulas the modules document (Korthikanti
et al. activations, ring all-reduce 2(n-1)/n, bubble (P-1)/(M+P-1) from seed 002 ch7), brute-force
enumerations, and seed goldens (what the seeds' advisors print, e.g. seed 000 Exercise 4's five
configurations).
"""

import itertools
import json
import math
import subprocess
import sys

import pytest

from jaxscale.calc.advisor import advise, candidate_layouts, validate
from jaxscale.calc.advisor_model import Hardware, Layout, Workload, evaluate, model_shape
from jaxscale.cli import main

REL = 1e-9
GB = 1e9
PEAK = 989.5e12  # H100 SXM dense bf16, the datasheet figure (jaxscale/hardware.py): the default
H100 = Hardware(num_gpus=64, gpu_memory_bytes=80 * GB)
LLAMA70 = Workload(n_params=70e9, hidden=8192, layers=80)  # seq 4096, batch 512, micro-batch 1


# --- the model of one layout ----------------------------------------------------------------------


def test_model_shape_given_and_derived():
    assert model_shape(LLAMA70) == (8192, 80)
    for n in (124e6, 7e9, 70e9, 175e9):
        h, layers = model_shape(Workload(n))
        assert h % 128 == 0
        assert abs(12 * layers * h * h - n) / n < 0.1  # 12 h^2 per dense layer
        assert 64 < h / layers < 256  # aspect ratio near 128
    assert model_shape(Workload(70e9, hidden=8192))[1] == round(70e9 / (12 * 8192**2))
    assert model_shape(Workload(70e9, layers=80))[0] % 128 == 0


def test_memory_of_tp8_dp8_zero1():
    cost = evaluate(LLAMA70, H100, Layout(tp=8, pp=1, dp=8, zero_stage=1))
    m = cost.memory
    assert m.weights == pytest.approx(70e9 / 8 * 2, rel=REL)
    assert m.gradients == pytest.approx(70e9 / 8 * 2, rel=REL)
    assert m.optimizer == pytest.approx(70e9 / 8 * 8 / 8, rel=REL)
    # pp = 1: one micro-batch in flight, all 80 layers, s*b*h*(10 + 24/t) bytes each
    assert m.activations == pytest.approx(4096 * 8192 * (10 + 24 / 8) * 80, rel=REL)
    assert cost.fits == (m.total <= 0.9 * 80 * GB)


def test_1f1b_keeps_pp_microbatches_on_stage_0():
    cost = evaluate(LLAMA70, H100, Layout(tp=4, pp=4, dp=4, zero_stage=0))
    assert cost.microbatches == 512 // 4
    per_layer = 4096 * 8192 * (10 + 24 / 4)
    assert cost.memory.activations == pytest.approx(per_layer * 20 * 4, rel=REL)
    few = evaluate(Workload(70e9, hidden=8192, layers=80, batch=8), H100, Layout(4, 4, 4, 0))
    assert few.microbatches == 2  # fewer micro-batches than stages: only 2 in flight
    assert few.memory.activations == pytest.approx(per_layer * 20 * 2, rel=REL)


def test_recompute_keeps_layer_inputs_and_costs_a_forward_pass():
    plain = evaluate(LLAMA70, H100, Layout(8, 1, 8, 1))
    rc = evaluate(LLAMA70, H100, Layout(8, 1, 8, 1, recompute=True))
    tokens_h = 4096 * 8192
    assert rc.memory.activations == pytest.approx(
        2 * tokens_h * 80 + tokens_h * (10 + 24 / 8), rel=REL
    )
    assert rc.compute_s == pytest.approx(plain.compute_s * 8 / 6, rel=REL)


def test_compute_time_is_6n_tokens_over_cluster_flops():
    cost = evaluate(LLAMA70, H100, Layout(8, 1, 8, 0))
    flops = 6 * 70e9 * 512 * 4096
    assert cost.compute_s == pytest.approx(flops / (64 * PEAK * 0.4), rel=REL)


def test_tp_and_pp_traffic_and_links():
    cost = evaluate(LLAMA70, H100, Layout(tp=8, pp=4, dp=2, zero_stage=1))
    comms = {c.kind: c for c in cost.comms}
    act = 2 * 4096 * 8192  # one 16-bit activation of a micro-batch
    micro = 512 // 2
    # 4 all-reduces per layer, ring 2(t-1)/t, 20 layers per stage, every micro-batch
    assert comms["TP"].bytes_per_gpu == pytest.approx(4 * 2 * 7 / 8 * act * 20 * micro, rel=REL)
    assert not comms["TP"].inter_node
    assert comms["TP"].seconds == pytest.approx(comms["TP"].bytes_per_gpu / 450e9, rel=REL)
    assert comms["PP"].bytes_per_gpu == pytest.approx(2 * act * micro, rel=REL)
    assert comms["PP"].inter_node  # 64 GPUs span 8 nodes
    assert comms["DP"].inter_node  # tp*dp = 16 ranks span two nodes
    assert cost.bubble_fraction == pytest.approx(3 / (micro + 3), rel=REL)
    expected_step = cost.compute_s / (1 - cost.bubble_fraction) + sum(c.seconds for c in cost.comms)
    assert cost.step_s == pytest.approx(expected_step, rel=REL)


def test_groups_inside_a_node_use_nvlink():
    cost = evaluate(LLAMA70, H100, Layout(tp=2, pp=8, dp=4, zero_stage=1))
    assert not {c.kind: c for c in cost.comms}["DP"].inter_node  # span 2*4 = 8 = one node
    one_node = evaluate(LLAMA70, Hardware(8, 80 * GB), Layout(tp=2, pp=2, dp=2, zero_stage=1))
    assert not any(c.inter_node for c in one_node.comms)


def test_dp_traffic_by_zero_stage():
    volumes = {}
    for z in (0, 1, 2, 3):
        cost = evaluate(LLAMA70, H100, Layout(tp=8, pp=1, dp=8, zero_stage=z))
        volumes[z] = {c.kind: c for c in cost.comms}["DP"].bytes_per_gpu
    # all-reduce of the GPU's 70e9/8 bf16 gradients: 2 * (d-1)/d * size
    assert volumes[0] == pytest.approx(2 * 7 / 8 * 70e9 / 8 * 2, rel=REL)
    assert volumes[1] == pytest.approx(volumes[0], rel=REL)
    assert volumes[2] == pytest.approx(volumes[0], rel=REL)
    assert volumes[3] == pytest.approx(1.5 * volumes[0], rel=REL)


def test_moe_experts_are_split_by_ep():
    moe = Workload(70e9, hidden=4096, layers=16, num_experts=64, top_k=2)
    one = evaluate(moe, H100, Layout(tp=1, pp=1, dp=64, zero_stage=0, ep=1))
    eight = evaluate(moe, H100, Layout(tp=1, pp=1, dp=64, zero_stage=0, ep=8))
    expert_share = 8 * 64 / (4 + 8 * 64)
    saved = 70e9 * expert_share * (1 - 1 / 8) * 2  # bf16 weights of 7/8 of the experts
    assert one.memory.weights - eight.memory.weights == pytest.approx(saved, rel=REL)
    assert "EP" not in {c.kind for c in one.comms}
    ep = {c.kind: c for c in eight.comms}["EP"]
    act = 2 * 4096 * 4096
    assert ep.bytes_per_gpu == pytest.approx(4 * 2 * act * 7 / 8 * 16 * (512 // 64), rel=REL)
    active = 70e9 * (1 - expert_share) + 70e9 * expert_share * 2 / 64
    assert one.compute_s == pytest.approx(6 * active * 512 * 4096 / (64 * PEAK * 0.4), rel=REL)


# --- enumeration and ranking ----------------------------------------------------------------------


def test_candidate_layouts_match_a_brute_force_enumeration():
    w, hw = Workload(7e9, hidden=4096, layers=32, batch=64), Hardware(16, 80 * GB)
    got = {(x.tp, x.pp, x.dp, x.zero_stage, x.recompute) for x in candidate_layouts(w, hw)}
    expected = set()
    for tp, pp, dp in itertools.product(range(1, 17), repeat=3):
        if tp * pp * dp == 16 and 8 % tp == 0 and pp <= 32 and 64 % dp == 0:
            for z, rc in itertools.product((0, 1, 2, 3) if dp > 1 else (0,), (False, True)):
                expected.add((tp, pp, dp, z, rc))
    assert got == expected


def test_advise_picks_the_fastest_layout_that_fits():
    report = advise(LLAMA70, H100)
    layouts = candidate_layouts(LLAMA70, H100)
    costs = [evaluate(LLAMA70, H100, x) for x in layouts]
    fitting = [c for c in costs if c.memory.total <= 0.9 * 80 * GB]
    assert report.best is not None
    assert len(report.ranked) == len(fitting)
    assert report.best.step_s == pytest.approx(min(c.step_s for c in fitting), rel=1e-6)
    assert all(c.fits for c in report.ranked)
    assert report.best.layout.tp <= 8 and report.best.layout.gpus == 64
    assert report.smallest.memory.total == min(c.memory.total for c in costs)
    assert report.reasoning and "layouts fit" in report.reasoning[0]


def test_seed000_configurations_through_the_own_advisor():
    # (a) 1 GPU: the only layout is 1 x 1 x 1
    a = advise(Workload(124e6), Hardware(1, 80 * GB))
    assert (a.best.layout.tp, a.best.layout.pp, a.best.layout.dp) == (1, 1, 1)
    # (d) 70B on 8 x 80 GB: 12 B/param = 840 GB exceeds the 8 * 72 GB usable in total
    d = advise(Workload(70e9), Hardware(8, 80 * GB))
    assert 70e9 * 12 > 8 * 72 * GB and d.best is None and not d.ranked
    assert "Nothing fits" in d.reasoning[-1]
    # (e) 175B on 64: model state 2100 GB / 64 = 32.8 GB leaves room, so some layout fits
    e = advise(Workload(175e9), Hardware(64, 80 * GB))
    assert e.best is not None and e.best.memory.total <= 72 * GB


def test_never_recompute_175b_cannot_fit_activations():
    # Without recomputation 1F1B's stage 0 holds at least L layers of one micro-batch
    # (ceil(L/pp) layers x min(pp, M) micro-batches), each >= s*h*(10 + 24/8) bytes at tp 8.
    w = Workload(175e9)
    h, layers = model_shape(w)
    least_activations = layers * 4096 * h * (10 + 24 / 8)
    least_state = 175e9 * 12 / 64
    assert least_activations + least_state > 72 * GB
    assert advise(w, Hardware(64, 80 * GB), recompute="never").best is None


def test_rule_layouts_are_evaluated_by_the_own_model():
    report = advise(LLAMA70, H100)
    by_rule = {rc.advice.rule: rc for rc in report.rules}
    seed004 = by_rule["seed 004 config"]
    assert (seed004.advice.tp, seed004.advice.pp, seed004.advice.dp) == (8, 8, 1)
    direct = evaluate(LLAMA70, H100, Layout(8, 8, 1, 0, recompute=seed004.cost.layout.recompute))
    assert seed004.cost.memory.total == pytest.approx(direct.memory.total, rel=REL)
    assert by_rule["seed 000 tree"].advice.zero_stage == 3


@pytest.mark.parametrize(
    ("workload", "hardware", "match"),
    [
        (Workload(70e9), Hardware(12, 80 * GB), "do not factor"),
        (Workload(70e9), Hardware(3, 80 * GB), "do not factor"),
        (Workload(0), H100, "params"),
        (Workload(70e9, seq=0), H100, "seq"),
        (Workload(70e9, num_experts=4, top_k=8), H100, "top_k"),
        (Workload(70e9, micro_batch=1024), H100, "micro_batch"),
        (Workload(70e9), Hardware(64, 0), "gpu_memory_bytes"),
        (Workload(70e9), Hardware(64, 80 * GB, usable_fraction=1.5), "usable_fraction"),
    ],
)
def test_validate_rejects_bad_input(workload, hardware, match):
    with pytest.raises(ValueError, match=match):
        validate(workload, hardware)


# --- the command ----------------------------------------------------------------------------------


def test_cli_table(capsys):
    assert main(["advise", "--params", "70e9", "--gpus", "64", "--gpu-mem", "80"]) == 0
    out = capsys.readouterr().out
    for text in (
        "seed 000 tree",
        "seed 001 rule",
        "seed 004 config",
        "seed 002 calc (corrected)",
        "jaxscale (analytic)",
        "Recommendation: TP",
        "Per-GPU memory",
        "Communication per step",
        "corrected mode",
    ):
        assert text in out


def test_cli_seed_faithful_reproduces_the_seed_printout(capsys):
    assert main(["advise", "--seed-faithful"]) == 0
    out = capsys.readouterr().out
    assert "seed-faithful mode" in out
    assert "65.5B params" in out and "total 785.7 GB" in out
    assert "recommends TP=2 PP=16 DP=2: 43.2 GB per GPU, 421.07 GB per step" in out


def test_cli_json(capsys):
    assert main(["advise", "--gpus", "8", "--params", "7e9", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["seed002_mode"] == "corrected"
    assert [r["rule"] for r in data["rules"]][:3] == [
        "seed 000 tree",
        "seed 001 rule",
        "seed 004 config",
    ]
    rec = data["recommendation"]
    lay = rec["layout"]
    assert lay["tp"] * lay["pp"] * lay["dp"] == 8
    mem = rec["memory"]
    parts = ("weights", "gradients", "optimizer", "master", "activations")
    assert mem["total"] == pytest.approx(sum(mem[k] for k in parts), rel=REL)
    assert mem["total"] <= 72 * GB
    assert data["layouts_fitting"] >= 1 and data["reasoning"]


def test_cli_moe_adds_an_expert_degree(capsys):
    assert main(["advise", "--moe", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["workload"]["num_experts"] == 64
    assert 64 % data["recommendation"]["layout"]["ep"] == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["--gpus", "12"],
        ["--gpus", "0"],
        ["--params", "70"],
        ["--params=-7e9"],
        ["--gpu-mem", "0"],
        ["--batch", "-4"],
        ["--moe", "--top-k", "100"],
        ["--headroom", "1"],
    ],
)
def test_cli_bad_input_exits_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["advise", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("jaxscale advise: error:")


@pytest.mark.slow  # compiles the advisor's layout scaled to 8 devices: the suite's longest test
@pytest.mark.first_line
def test_validate_compiles_the_scaled_layout_and_matches_predictions(capsys):
    # 70B on 64 GPUs recommends a TP x PP x DP layout; scaled to the 8 simulated devices it is
    # compiled, and its memory and collectives must agree with the calculators (every row ✓)
    assert (
        main(["advise", "--params", "70e9", "--gpus", "64", "--gpu-mem", "80", "--validate"]) == 0
    )
    out = capsys.readouterr().out
    report = out[out.index("validation on 8 simulated devices") :]
    assert "✗" not in report and report.count("✓") >= 5
    assert "arguments (memory_analysis)" in report


def test_scaled_strategy_keeps_tensor_degree_and_pipeline_stages():
    from jaxscale.bench.validate_layout import scaled_strategy

    strategy, notes = scaled_strategy(tp=4, pp=2, dp=8, zero_stage=2, n_devices=8)
    assert (str(strategy.mesh), strategy.tensor, strategy.schedule) == (
        "pp=2,tp=4",
        "megatron",
        "1f1b",
    )
    assert strategy.zero == 0  # no data axis left: a ZeRO group of one shards nothing
    strategy, _ = scaled_strategy(tp=2, pp=4, dp=8, zero_stage=1, n_devices=8)
    assert (str(strategy.mesh), strategy.zero) == ("pp=4,tp=2", 0)
    strategy, _ = scaled_strategy(tp=2, pp=2, dp=8, zero_stage=1, n_devices=8)
    assert (str(strategy.mesh), strategy.zero, strategy.microbatches) == ("pp=2,dp=2,tp=2", 1, 8)
    strategy, _ = scaled_strategy(tp=16, pp=1, dp=4, zero_stage=3, n_devices=8)
    assert str(strategy.mesh) == "tp=8" and strategy.schedule is None


def test_advisor_imports_no_jax():
    code = "import sys, jaxscale.advise_cli; assert not {'jax', 'matplotlib'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bubble_matches_the_seed_pipeline_example():
    # seed 002 ch7: P=4, M=4 -> 3/7 = 43%; here M = batch / (dp * micro-batch) = 16 / (4 * 1)
    w = Workload(7e9, hidden=4096, layers=32, batch=16)
    cost = evaluate(w, Hardware(64, 80 * GB), Layout(tp=4, pp=4, dp=4, zero_stage=0))
    assert cost.microbatches == 4
    assert math.isclose(cost.bubble_fraction, 3 / 7, rel_tol=REL)
