"""Context parallelism in the calculators (calc/context.py, `calc comm --cp`, `calc memory --cp`):
bytes per layer and step hand-derived for a small case and equal to the lab's own prediction
(`jaxscale.parallel.cp.predict_comm`, itself checked against the compiled program's census in
tests/parallel/test_cp.py), and memory unchanged at cp=1 and divided as derived above it."""

import json
from dataclasses import replace

import pytest

from jaxscale.calc import context
from jaxscale.calc import memory as mem
from jaxscale.cli import main

REL = 1e-12

# B_l = 2 rows, T = 16, H = 8, G = 4, K = 8, cp = 4, bf16: each device holds 2 x 4 = 8 tokens,
# so one K block is 8 x 4 x 8 x 2 B = 512 B and the queries 8 x 8 x 8 x 2 B = 1024 B.
SMALL = context.ContextShape(
    batch_local=2, seq_len=16, n_heads=8, n_kv_heads=4, head_dim=8, cp=4, act_bytes=2
)
KV, Q, KV32 = 512, 1024, 1024  # KV32: the ring backward's f32 dK / dV blocks


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        rc = main(["calc", *argv])
    except SystemExit as exit_:  # argparse rejects bad flag values with exit code 2
        rc = exit_.code
    out, err = capsys.readouterr()
    return rc, out, err


def run_json(capsys, *argv: str) -> dict:
    rc, out, _ = run(capsys, *argv, "--json")
    assert rc == 0
    return json.loads(out)


# --- bytes per layer and step ------------------------------------------------------------------


def test_block_sizes_of_the_small_case():
    assert (SMALL.tokens_local, SMALL.kv_block_bytes, SMALL.q_block_bytes) == (8, KV, Q)


@pytest.mark.parametrize(
    "form, remat, census",
    [
        # ring: 2(c-1) = 6 K/V sends forward, 6 again backward, 2c = 8 f32 dK/dV sends
        ("ring", False, {"collective-permute": 6 * KV + 6 * KV + 8 * KV32}),
        ("ring", True, {"collective-permute": 3 * 6 * KV + 8 * KV32}),
        # gather: K and V all-gathered (output 4 blocks each), dK and dV reduce-scattered
        ("gather", False, {"all-gather": 2 * 4 * KV, "reduce-scatter": 2 * 4 * KV}),
        ("gather", True, {"all-gather": 2 * 2 * 4 * KV, "reduce-scatter": 2 * 4 * KV}),
        # ulysses: q, k, v, out forward (Q + 2 KV + Q), their transposes backward
        ("ulysses", False, {"all-to-all": 2 * (2 * Q + 2 * KV)}),
        ("ulysses", True, {"all-to-all": 3 * (2 * Q + 2 * KV)}),
    ],
)
def test_layer_bytes_by_hand(form, remat, census):
    shape = replace(SMALL, remat=remat)
    assert context.layer_census(shape, form) == census


def test_wire_bytes_and_collective_counts():
    ring, gather = (context.layer_census(SMALL, f) for f in ("ring", "gather"))
    assert context.wire_bytes(ring, 4) == ring["collective-permute"]  # a permute sends it all
    assert context.wire_bytes(gather, 4) == pytest.approx(3 / 4 * 16 * KV, rel=REL)
    # ring: 2 permutes per hop forward, 4 per hop backward and the 2 home; gather 2 + 2; Ulysses 8
    counts = {f: context.layer_collectives(SMALL, f) for f in context.FORMS}
    assert counts == {"ring": 6 + 12 + 2, "gather": 4, "ulysses": 8}


def test_one_device_moves_nothing_and_ulysses_needs_heads_over_cp():
    one = context.ContextShape(2, 16, 4, 2, 8, cp=1)
    assert all(context.layer_census(one, f) == {} for f in context.FORMS)
    assert context.step_census(one, "ring", 3, replicated_grads=100) == {}
    with pytest.raises(ValueError, match="kv_heads per tensor shard"):
        context.layer_census(context.ContextShape(2, 16, 8, 4, 8, cp=4, tp=2), "ulysses")
    with pytest.raises(ValueError, match="does not split over cp=3"):
        context.ContextShape(2, 16, 4, 2, 8, cp=3)


def test_step_adds_layers_and_the_gradient_all_reduce():
    step = context.step_census(SMALL, "gather", n_layers=3, replicated_grads=1000)
    assert step == {"all-gather": 3 * 8 * KV, "reduce-scatter": 3 * 8 * KV, "all-reduce": 4004}


CASES = [  # (form, cp, tp, remat, compute dtype)
    ("ring", 4, 1, False, "float32"),
    ("ring", 2, 2, True, "bfloat16"),
    ("ring", 8, 1, False, "bfloat16"),
    ("gather", 4, 2, False, "bfloat16"),
    ("gather", 8, 1, True, "float32"),
    ("ulysses", 2, 2, False, "float32"),
    ("ulysses", 4, 1, True, "bfloat16"),
]


@pytest.mark.parametrize("form, cp, tp, remat, dtype", CASES)
def test_step_bytes_equal_the_labs_prediction(form, cp, tp, remat, dtype):
    """The calculator restates cp.predict_comm without jax: the two agree to the byte."""
    from jaxscale.config import ModelConfig
    from jaxscale.parallel import cp as cp_axis
    from jaxscale.parallel.common import Composition
    from jaxscale.parallel.compose import step_shape

    cfg = ModelConfig(n_heads=8, n_kv_heads=4, n_layers=3, compute_dtype=dtype, remat=remat)
    rows, seq_len = 3, 64
    ways = {"data": 1, "fsdp": 1, "tensor": tp, "pipe": 1, "expert": 1, "context": cp}
    comp = Composition(cfg, ways, cp_form=form)
    shape = step_shape(cfg, rows, seq_len // cp, t=tp)  # as manual.predict: T/cp per device
    lab = cp_axis.predict_comm(shape, comp)
    heads = (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim)
    mine_shape = context.ContextShape(rows, seq_len, *heads, cp, tp, shape.act_bytes, remat)
    grads = shape.matrix_params + shape.norm_params  # every parameter: CP splits none
    mine = context.step_census(mine_shape, form, cfg.n_layers, replicated_grads=grads)
    assert mine == pytest.approx(lab, rel=REL) and set(mine) == set(lab)


# --- attention scores and activations ----------------------------------------------------------


def test_attention_scores_per_form():
    kw = {"batch": 2, "seq_len": 64, "n_heads": 8, "cp": 4, "n_layers": 5}
    ring, gather, ulysses, none = (
        context.attention_scores(f, **kw) for f in ("ring", "gather", "ulysses", "none")
    )
    # ring: [T/(2cp)]^2 = 8 x 8 per head, one layer's; gather: [T/cp] x T; Ulysses T x T on H/cp
    assert (ring.heads, ring.rows, ring.cols, ring.layers_kept) == (8, 8, 8, 1)
    assert ring.bytes == 2 * 8 * 8 * 8 * 4
    assert (gather.heads, gather.rows, gather.cols, gather.layers_kept) == (8, 16, 64, 5)
    assert (ulysses.heads, ulysses.rows, ulysses.cols) == (2, 64, 64)
    assert gather.bytes == ulysses.bytes == 5 * 2 * 8 * 16 * 64 * 4 == none.bytes / 4
    kept = context.attention_scores("gather", **kw, checkpointing=True)
    assert kept.bytes == gather.bytes / 5  # checkpointing: one layer's probabilities at a time
    with pytest.raises(ValueError, match="Ulysses"):
        context.attention_scores("ulysses", **{**kw, "n_heads": 6})


def test_activations_unchanged_at_cp1_and_divided_above():
    simple = mem.activation_bytes_simple(4, 4096, 8192, 80)
    assert mem.activation_bytes_simple(4, 4096, 8192, 80, cp=1) == simple
    assert simple == 4 * 4096 * 8192 * 80 * 4 * 2
    assert mem.activation_bytes_simple(4, 4096, 8192, 80, cp=8) == simple / 8
    heuristic = mem.activation_bytes_param_heuristic(70e9, tp=8)
    assert mem.activation_bytes_param_heuristic(70e9, tp=8, cp=1) == heuristic
    assert mem.activation_bytes_param_heuristic(70e9, tp=8, cp=4) == heuristic / 4


# --- the commands ------------------------------------------------------------------------------


def test_memory_command_cp1_is_todays_output(capsys):
    argv = ("memory", "--model", "llama-70b", "--activations", "simple", "--tp", "8")
    assert run_json(capsys, *argv) == run_json(capsys, *argv, "--cp", "1")


def test_memory_command_divides_activations_and_state_over_dp(capsys):
    base = ("memory", "--model", "llama-70b", "--activations", "simple", "--gpus", "64")
    base += ("--tp", "8", "--cp", "4", "--zero", "1", "--seq-len", "8192")
    report = run_json(capsys, *base)
    assert (report["dp"], report["cp"]) == (2, 4)  # 64 GPUs = tp 8 x cp 4 x dp 2
    row = report["per_gpu"][0]["stages"][0]
    assert row["activations"] == pytest.approx(1 * 8192 * 8192 * 80 * 8 / 4, rel=REL)
    assert row["optimizer"] == pytest.approx(70e9 / 8 * 8 / 2, rel=REL)  # ZeRO-1 over dp = 2
    scores = {r["form"]: r for r in report["attention_scores"]}
    assert scores["ring"]["rows"] == 8192 // 8 and scores["ring"]["heads"] == 64 // 8
    assert scores["gather"]["bytes"] == scores["ulysses"]["bytes"]
    with_ring = run_json(capsys, *base, "--cp-form", "ring")
    added = with_ring["per_gpu"][0]["stages"][0]["activations"] - row["activations"]
    assert added == pytest.approx(scores["ring"]["bytes"], rel=REL)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gpus", "8", "--tp", "2", "--cp", "3"], "--tp 2 x --pp 1 x --cp 3"),
        (["--cp-form", "ring"], "--cp-form needs --cp above 1"),
        (["--cp", "2", "--cp-form", "ring"], "give --activations"),
        (["--scenario", "s4", "--cp", "2"], "not to --scenario"),
    ],
)
def test_memory_command_refusals(argv, message, capsys):
    rc, _, err = run(capsys, "memory", *argv)
    assert rc == 2 and message in err


def test_comm_command_context_table(capsys):
    argv = ("comm", "--cp", "2", "--tp", "2", "--d-model", "1024", "--heads", "8", "--kv-heads")
    report = run_json(capsys, *argv, "4", "--batch-size", "2", "--seq-len", "4096")
    rows = {r["form"]: r for r in report["context_parallel"]}
    shape = context.ContextShape(2, 4096, 8, 4, 128, cp=2, tp=2)
    assert report["context_parallel_shape"]["kv_block_bytes"] == shape.kv_block_bytes
    for form in context.FORMS:
        census = context.layer_census(shape, form)
        assert rows[form]["census"] == census
        assert rows[form]["step_bytes"] == pytest.approx(
            80 * context.wire_bytes(census, 2), rel=REL
        )  # --layers 80, seed 001's
    # Ulysses with seed 001's 8 kv heads over tp 8 leaves 1 per shard: not a multiple of cp 4
    report = run_json(capsys, "comm", "--cp", "4", "--tp", "8")
    ulysses = {r["form"]: r for r in report["context_parallel"]}["ulysses"]
    assert "not a multiple of 4" in ulysses["note"] and "census" not in ulysses


def test_comm_command_without_cp_prints_no_context_table(capsys):
    assert "context_parallel" not in run_json(capsys, "comm")
