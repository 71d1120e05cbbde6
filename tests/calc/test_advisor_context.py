"""The advisor's context-parallel dimension (calc/advisor.py, advisor_model.py, `jaxscale advise`,
`advise --validate`): the long-sequence rule proposes cp for a long sequence and not for a short
one, a CP layout's memory and traffic are the closed forms of calc/context.py, and a CP layout
scaled to the simulated devices compiles with its collectives as predicted."""

import json

import pytest

from jaxscale.calc import context
from jaxscale.calc.advisor import advise, candidate_layouts
from jaxscale.calc.advisor_context import context_decision, long_sequence
from jaxscale.calc.advisor_model import Hardware, Layout, Workload, evaluate
from jaxscale.cli import main

REL = 1e-9
GB = 1e9
H100S = Hardware(num_gpus=64, gpu_memory_bytes=80 * GB)


def llama8b(seq: int, batch: int = 64) -> Workload:
    """A LLaMA-3-8B-like shape: 32 layers of 4096, 32 heads, 8 kv heads of 128."""
    return Workload(8e9, seq=seq, batch=batch, hidden=4096, layers=32, heads=32, kv_heads=8)


# --- the rule ----------------------------------------------------------------------------------


def test_a_long_sequence_gets_context_parallelism():
    # 1M tokens: even recomputed, 32 layer inputs of 1M x 4096 in bf16 are 268 GB per GPU
    w = llama8b(1 << 20)
    assert 2 * (1 << 20) * 4096 * 32 > 72 * GB
    report = advise(w, H100S)
    assert report.context.considered and report.context.forms == context.FORMS
    assert report.best is not None and report.best.layout.cp > 1
    assert all(c.layout.cp > 1 for c in report.ranked)  # nothing without CP fits
    assert "Context parallelism" in report.reasoning[1]
    assert any(line.startswith(f"CP={report.best.layout.cp}") for line in report.reasoning)


def test_a_short_sequence_does_not():
    report = advise(llama8b(8192), H100S)
    assert not report.context.considered and "fit at seq 8192" in report.context.reason
    assert all(c.layout.cp == 1 for c in report.ranked)
    # the same short sequence with CP forced: CP layouts are enumerated beside the others
    forced = advise(llama8b(8192), H100S, context="always")
    assert forced.layouts_considered > report.layouts_considered
    assert any(c.layout.cp > 1 for c in forced.ranked)


def test_the_rule_is_about_activations_not_state_or_recomputation():
    # 70B on 8 GPUs: the model state alone does not fit, so splitting the sequence cannot help
    long, why = long_sequence(
        Workload(70e9, seq=1 << 17, hidden=8192, layers=80), Hardware(8, 80 * GB)
    )
    assert not long and "model state" in why
    # 175B at 4096 fits with recomputation: without it nothing fits, and the sequence is not long
    assert advise(Workload(175e9), H100S, recompute="never").context.considered is False
    assert not context_decision(llama8b(1 << 20), H100S, "never").considered
    moe = Workload(8e9, seq=1 << 20, batch=64, num_experts=8, top_k=2)
    assert not context_decision(moe, H100S).considered


# --- one CP layout -----------------------------------------------------------------------------


def test_cp_layout_memory_and_traffic_by_hand():
    w = llama8b(1 << 16, batch=16)
    plain = evaluate(w, H100S, Layout(tp=1, pp=1, dp=8, zero_stage=1, cp=1))
    ring = evaluate(w, H100S, Layout(tp=1, pp=1, dp=2, zero_stage=1, cp=4, cp_form="ring"))
    gather = evaluate(w, H100S, Layout(tp=1, pp=1, dp=2, zero_stage=1, cp=4, cp_form="gather"))
    # activations divided by cp; the gather form also holds one layer's gathered K and V
    assert ring.memory.activations == pytest.approx(plain.memory.activations / 4, rel=REL)
    kv = 1 * (1 << 16) // 4 * 8 * 128 * 2  # one K block [1, T/4, 8, 128] in bf16
    assert gather.memory.activations == pytest.approx(ring.memory.activations + 2 * 4 * kv, rel=REL)
    # ZeRO-1 shards the optimizer over dp x cp = 8 GPUs, as over dp = 8 without CP
    assert ring.memory.optimizer == pytest.approx(plain.memory.optimizer, rel=REL)
    assert ring.memory.optimizer == pytest.approx(8e9 * 8 / 8, rel=REL)
    # gather per layer: all-gathers (2 x 4 KV) and reduce-scatters (2 x 4 KV), 3/4 on the wire,
    # 32 layers, 16 / 2 = 8 micro-batches per replica
    cp_comm = {c.kind: c for c in gather.comms}["CP"]
    assert cp_comm.bytes_per_gpu == pytest.approx(16 * kv * 3 / 4 * 32 * 8, rel=REL)
    assert not cp_comm.inter_node  # tp x cp = 4 GPUs in one node
    # ring: 2(c-1) K/V sends forward, 2(c-1) backward and 2c f32 dK/dV (twice the bf16 block)
    ring_comm = {c.kind: c for c in ring.comms}["CP"]
    assert ring_comm.bytes_per_gpu == pytest.approx((12 * kv + 8 * 2 * kv) * 32 * 8, rel=REL)
    assert gather.layout.gpus == 8 and gather.layout.label() == "TP1 CP4-gather PP1 DP2 ZeRO-1"


def test_candidates_respect_the_split_and_ulysses_heads():
    w = Workload(8e9, seq=80, batch=64, hidden=4096, layers=32, heads=32, kv_heads=4)
    layouts = candidate_layouts(w, Hardware(16, 80 * GB), "never", context.FORMS)
    split = [x for x in layouts if x.cp > 1]
    assert split and all(x.gpus == 16 for x in layouts)
    assert all(80 % (2 * x.cp) == 0 for x in split)  # zigzag: 2cp chunks of the sequence
    assert {x.cp for x in split} == {2, 4, 8}  # cp=16 would cut 80 tokens into 32 chunks
    for x in (x for x in split if x.cp_form == "ulysses"):
        assert (32 // x.tp) % x.cp == 0 and (4 // x.tp) % x.cp == 0


# --- the command and its validation ------------------------------------------------------------

LONG = ["advise", "--params", "8e9", "--d-model", "4096", "--layers", "32", "--heads", "32"]
LONG += ["--kv-heads", "8", "--gpus", "64", "--batch-size", "64"]


@pytest.mark.parametrize("seq, split", [("1048576", True), ("8192", False)])
def test_cli_proposes_cp_only_for_the_long_sequence(seq, split, capsys):
    assert main([*LONG, "--seq-len", seq, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["context"]["considered"] is split
    assert (data["recommendation"]["layout"]["cp"] > 1) is split
    assert ("CP" in data["recommendation"]["label"]) is split


def test_scaled_strategy_keeps_the_context_axis():
    from jaxscale.bench.validate_layout import scaled_strategy

    strategy, _ = scaled_strategy(8, 1, 8, 1, 8, cp=8, cp_form="ring")
    assert (str(strategy.mesh), strategy.context, strategy.tensor) == (
        "cp=4,tp=2",
        "ring",
        "megatron",
    )
    strategy, notes = scaled_strategy(1, 2, 4, 1, 8, cp=2, cp_form="ulysses")
    assert (str(strategy.mesh), strategy.schedule, strategy.zero) == ("dp=4,cp=2", None, 1)
    assert "no pipe axis" in notes[-1]
    strategy, _ = scaled_strategy(1, 1, 8, 3, 8, cp=8, cp_form="gather")
    assert (str(strategy.mesh), strategy.context, strategy.zero) == ("cp=8", "gather", 0)


def test_validate_compiles_the_advised_cp_layout(capsys):
    # 8B at 1M tokens on 64 GPUs is advised a CP layout; scaled to the 8 simulated devices it is
    # compiled and its memory and collectives (the context axis's among them) agree with the lab's
    # predictions
    assert main([*LONG, "--seq-len", "1048576", "--cp-form", "gather", "--validate"]) == 0
    out = capsys.readouterr().out
    report = out[out.index("validation on 8 simulated devices") :]
    assert "cp_gather" in report and "cp=" in report
    assert "✗" not in report and "all-gather bytes/step" in report
