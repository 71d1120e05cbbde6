"""The seeds' four parallelism rule sets: goldens from the seeds, plus derivations written here.

Seed 000's five configurations (a)-(e) are its Exercise 4's; seed 004's examples (§8) and seed 002's
calculator printout (ch7 parallel_strategy_calculator.py) are what their code prints when run. Seed
001's examples (§8) print nothing in the seed; their expected layouts are worked out by hand from
its rules (`recommend_parallelism`) in the comments below.
"""

import itertools

import pytest

from jaxscale.calc.advisor_rules import (
    seed000_decision_tree,
    seed001_recommend,
    seed004_config,
    seed004_strategy_matrix,
)
from jaxscale.calc.advisor_seed002 import Seed002Shape, seed002_advice, seed002_calculator

REL = 1e-12  # exact arithmetic up to float rounding
GB = 1e9


# --- seed 000 exercise 4 --------------------------------------------------------------------------


def test_seed000_a_gpt2_one_gpu_is_data_parallel():
    a = seed000_decision_tree(124e6, 1, 80)
    assert a.strategy == "DATA PARALLELISM"
    assert (a.tp, a.pp, a.dp, a.zero_stage) == (1, 1, 1, 0)
    assert a.per_gpu_bytes == pytest.approx(124e6 * 12, rel=REL)  # ~1.5 GB (seed 000 Exercise 4)


def test_seed000_b_gpt2_four_gpus_is_four_way_data_parallel():
    a = seed000_decision_tree(124e6, 4, 80)
    assert a.strategy == "DATA PARALLELISM"
    assert (a.dp, a.gpus_used) == (4, 4)


def test_seed000_c_7b_four_gpus_needs_zero1():
    # 84 GB > 80; ZeRO-1 on 4 GPUs: 14 + 14 + 56/4 = 42 GB
    a = seed000_decision_tree(7e9, 4, 80)
    assert a.strategy == "ZeRO Stage 1 + DATA PARALLELISM"
    assert a.zero_stage == 1
    assert a.per_gpu_bytes == pytest.approx(42 * GB, rel=REL)


def test_seed000_d_70b_eight_gpus_is_insufficient():
    # ZeRO-3 on 8 GPUs is 840/8 = 105 GB > 80 (seed 000 Ex. 4); 8 x 80 = 640 GB < 840 GB in total
    a = seed000_decision_tree(70e9, 8, 80)
    assert a.strategy == "INSUFFICIENT RESOURCES"
    assert (a.tp, a.pp, a.dp, a.gpus_used) == (None, None, None, None)
    assert any("dead code" in n for n in a.notes)


def test_seed000_e_175b_64_gpus_fits_with_zero3():
    # ZeRO-1: 350 + 350 + 1400/64 > 80; ZeRO-2: 350 + ... > 80; ZeRO-3: 2100/64 = 32.8 GB
    a = seed000_decision_tree(175e9, 64, 80)
    assert a.strategy == "ZeRO Stage 3 + DATA PARALLELISM"
    assert a.per_gpu_bytes == pytest.approx(175e9 * 12 / 64, rel=REL)


def _seed000_model_parallel_search(n, gpus, mem_gb):
    """Seed 000's TP x PP search (Exercise 4), written out again: first best by tp + pp."""
    best = None
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8, 16):
            if tp * pp > gpus or gpus % (tp * pp):
                continue
            dp = gpus // (tp * pp)
            shard = 1.0 / (tp * pp)
            per_gpu = n * shard * 2 + n * shard * 2 + n * shard * 8 / dp
            if per_gpu <= mem_gb * GB and (best is None or tp + pp < best[0] + best[1]):
                best = (tp, pp, dp)
    return best


def test_seed000_model_parallel_branch_never_finds_a_layout():
    # Wherever ZeRO-3 over all GPUs fails, the seed's TP x PP search fails too, so the port may
    # stop at "INSUFFICIENT RESOURCES" without running it.
    tried = 0
    for n, gpus, mem in itertools.product(
        (1e9, 7e9, 13e9, 70e9, 175e9, 1e12), (1, 2, 4, 8, 16, 32, 64, 128), (16, 40, 80, 141)
    ):
        if n * 12 / gpus <= mem * GB:
            continue
        tried += 1
        assert _seed000_model_parallel_search(n, gpus, mem) is None
        assert seed000_decision_tree(n, gpus, mem).strategy == "INSUFFICIENT RESOURCES"
    assert tried > 30


def test_seed000_first_rung_that_fits_is_chosen():
    # 7e9 on 64 GPUs of 16 GB: ZeRO-1 = 28 + 56/64 GB > 16; ZeRO-2 = 14 + 14/64 + 56/64 < 16
    a = seed000_decision_tree(7e9, 64, 16)
    assert a.zero_stage == 2
    assert a.per_gpu_bytes == pytest.approx((14 + 14 / 64 + 56 / 64) * GB, rel=REL)


# --- seed 001 recommend_parallelism ---------------------------------------------------------------

# By hand from seed 001 §8, 8 GPUs per node, 80 GB: each has 2*params*20 > 80 and >= 2 nodes.
# 7B: pp 1 (<=50B), dp 64/8; 13B: pp 1, dp 128/8; 70B: pp 2 (>50B), dp 512/16;
# 175B: pp min(4, 128//2) = 4, dp 1024/32; 1.7T: pp min(4, 256//2) = 4, dp 2048/32.
SEED001_CASES = [
    (7e9, 64, (8, 1, 8)),
    (13e9, 128, (8, 1, 16)),
    (70e9, 512, (8, 2, 32)),
    (175e9, 1024, (8, 4, 32)),
    (1.7e12, 2048, (8, 4, 64)),
]


@pytest.mark.parametrize(("n", "gpus", "layout"), SEED001_CASES)
def test_seed001_examples(n, gpus, layout):
    a = seed001_recommend(n, gpus)
    assert (a.tp, a.pp, a.dp) == layout
    assert a.zero_stage == 2
    assert a.gpus_used == gpus and not a.notes


def test_seed001_small_model_is_pure_dp_with_zero2():
    a = seed001_recommend(1e9, 16)  # 2 GB * 20 = 40 <= 80
    assert (a.tp, a.pp, a.dp, a.zero_stage) == (1, 1, 16, 2)


def test_seed001_single_node_uses_tp_node_size_and_zero1():
    a = seed001_recommend(7e9, 8)
    assert (a.tp, a.pp, a.dp, a.zero_stage) == (8, 1, 1, 1)


def test_seed001_less_than_a_node_leaves_no_gpu_used():
    # 4 GPUs: num_nodes = 4 // 8 = 0 -> multi-node branch, tp 8, dp = 4 // 8 = 0
    a = seed001_recommend(7e9, 4)
    assert (a.tp, a.pp, a.dp) == (8, 1, 0)
    assert a.gpus_used == 0
    assert len(a.notes) == 2  # num_nodes = 0, and GPUs unused


def test_seed001_large_model_on_less_than_a_node_would_divide_by_zero():
    a = seed001_recommend(175e9, 4)  # pp = min(4, 0 // 2) = 0
    assert a.error is not None and "ZeroDivisionError" in a.error
    assert a.dp is None


# --- seed 004 get_parallelism_config --------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "gpus", "layout"),
    [(1e9, 8, (8, 1, 1)), (13e9, 64, (8, 8, 1)), (70e9, 256, (8, 8, 4)), (175e9, 1024, (8, 16, 8))],
)
def test_seed004_goldens(n, gpus, layout):
    # seed 004 §8 prints these for its examples [R]
    a = seed004_config(n, gpus)
    assert (a.tp, a.pp, a.dp) == layout
    assert a.gpus_used == gpus and not a.notes


def test_seed004_small_model_is_data_parallel_only():
    a = seed004_config(0.5e9, 32)
    assert (a.tp, a.pp, a.dp) == (1, 1, 32)


def test_seed004_band_edges_use_strict_less_than():
    assert seed004_config(1e9 - 1, 8).tp == 1  # still "small"
    assert seed004_config(10e9, 64).pp == 8  # 10e9 is already "large"
    assert seed004_config(100e9, 1024).dp == 8  # 100e9 is already "very large": DP fixed at 8


def test_seed004_gpu_counts_the_rules_do_not_cover():
    idle = seed004_config(5e9, 12)  # tp min(8, 12) = 8, dp 12 // 8 = 1
    assert (idle.tp, idle.dp, idle.gpus_used) == (8, 1, 8)
    assert idle.notes
    crash = seed004_config(13e9, 4)  # pp = min(8, 4 // 8) = 0 -> 4 // 0
    assert crash.error and "ZeroDivisionError" in crash.error
    zero = seed004_config(175e9, 32)  # pp = 32 // 64 = 0: a 0-GPU layout, no crash
    assert zero.pp == 0 and zero.gpus_used == 0 and zero.error is None


def test_seed004_strategy_matrix():
    # seed 004 §3 "Strategy Selection Matrix"
    assert seed004_strategy_matrix(0.5e9) == ("Data Parallelism", "None needed")
    assert seed004_strategy_matrix(5e9) == ("Data Parallelism", "Pipeline (optional)")
    assert seed004_strategy_matrix(50e9) == ("Pipeline + Data", "Model Parallelism")
    assert seed004_strategy_matrix(500e9) == ("Hybrid (all strategies)", "ZeRO optimization")


def test_rules_reject_bad_input():
    with pytest.raises(ValueError, match="n_params"):
        seed000_decision_tree(0, 8, 80)
    with pytest.raises(ValueError, match="num_gpus"):
        seed001_recommend(7e9, 0)
    with pytest.raises(ValueError, match="num_gpus"):
        seed004_config(7e9, -8)


# --- seed 002 parallel_strategy_calculator.py -----------------------------------------------------


def test_seed002_faithful_defaults_match_the_seed_printout():
    # seed 002 ch7 parallel_strategy_calculator.py's defaults, as it prints them [R]
    r = seed002_calculator(seed_faithful=True)
    assert f"{r.param_count / 1e9:.1f}" == "65.5"
    assert [f"{x:.1f}" for x in (r.params_gb, r.grads_gb, r.optimizer_gb, r.total_gb)] == [
        "130.9",
        "130.9",
        "523.8",
        "785.7",
    ]
    assert len(r.rows) == 19
    assert (r.best.tp, r.best.pp, r.best.dp) == (2, 16, 2)
    assert f"{r.best.memory_per_gpu_gb:.1f}" == "43.2"
    assert f"{r.best.total_comm_gb:.2f}" == "421.07"
    rows = {(x.tp, x.pp, x.dp): x for x in r.rows}
    assert f"{rows[1, 1, 64].memory_per_gpu_gb:.1f}" == "323.8" and not rows[1, 1, 64].fits
    assert f"{rows[8, 4, 2].memory_per_gpu_gb:.1f}" == "23.1" and rows[8, 4, 2].fits
    assert f"{rows[8, 8, 1].memory_per_gpu_gb:.1f}" == "19.0"


def test_seed002_faithful_batch_per_gpu_is_about_pp():
    # defect 6: B // (B // pp) with B = 512 gives 1, 2, 4, 8, 16 -- the activations of TP1 rows
    # are 10 * bpg * 4096 * 8192 * (80 // pp) * 2 bytes
    r = seed002_calculator(seed_faithful=True)
    for row in r.rows:
        if row.tp == 1:
            expected = 10 * row.pp * 4096 * 8192 * (80 // row.pp) * 2 / GB
            assert row.activations_gb == pytest.approx(expected, rel=REL)


def test_seed002_faithful_ignores_params_for_memory_but_not_for_dp_comm():
    a = seed002_calculator(70, seed_faithful=True)
    b = seed002_calculator(7, seed_faithful=True)
    assert a.params_gb == b.params_gb
    assert [x.memory_per_gpu_gb for x in a.rows] == [x.memory_per_gpu_gb for x in b.rows]
    # DP volume 2 * (P / pp) * 2 B * (dp-1)/dp uses --params: TP1 PP1 DP64 -> 280 * 63/64 GB
    assert a.rows[0].dp_comm_gb == pytest.approx(2 * 70e9 * 2 * 63 / 64 / GB, rel=REL)
    assert b.rows[0].dp_comm_gb == pytest.approx(a.rows[0].dp_comm_gb / 10, rel=REL)


def test_seed002_faithful_moe_inflates_params_and_nothing_fits():
    # the same script with --moe gives 2771.3B "actual"; no layout fits
    r = seed002_calculator(seed_faithful=True, moe=True)
    assert f"{r.param_count / 1e9:.1f}" == "2771.3"
    assert r.best is None
    assert "64 experts and 8-way EP: 8 experts per GPU" in r.moe_advice
    advice = seed002_advice(r)
    assert advice.tp is None and advice.strategy == "no configuration fits"


def test_seed002_shape_param_count_closed_form():
    h, v, layers = 8192, 128000, 80
    assert Seed002Shape().param_count == v * h + layers * (4 * h * h + 2 * h * 4 * h)


def test_seed002_faithful_crashes_when_batch_is_smaller_than_pp():
    r = seed002_calculator(batch_size=8, seed_faithful=True)  # 8 // 16 = 0 -> 8 // 0
    assert r.error and "ZeroDivisionError" in r.error
    assert seed002_advice(r).error == r.error


def test_seed002_corrected_uses_params_and_micro_batches():
    r = seed002_calculator(70)
    assert r.param_count == 70e9
    assert r.params_gb == pytest.approx(140, rel=REL)
    rows = {(x.tp, x.pp, x.dp): x for x in r.rows}
    # TP8 PP4 DP2: 1 micro-batch of 4096 tokens, 20 layers per stage, min(4, 512/2) = 4 in flight
    row = rows[8, 4, 2]
    act = 10 * 1 * 4096 * 8192 / 8 * 20 * 4 * 2 / GB
    assert row.activations_gb == pytest.approx(act, rel=REL)
    assert row.memory_per_gpu_gb == pytest.approx(140 / 32 * 2 + 560 / 32 / 2 + act, rel=REL)
    # per-GPU volumes: batch 512/2 per replica; 4 all-reduces per layer (forward and backward),
    # each a ring's 2 * 7/8 of the activation; DP over the GPU's 70e9/32 parameters
    tokens = 256 * 4096
    assert row.tp_comm_gb == pytest.approx(4 * 2 * tokens * 8192 * 2 * 7 / 8 * 20 / GB, rel=REL)
    assert row.pp_comm_gb == pytest.approx(2 * tokens * 8192 * 2 / GB, rel=REL)
    assert row.dp_comm_gb == pytest.approx(2 * 70e9 / 32 * 2 * 1 / 2 / GB, rel=REL)
    assert r.best is not None and r.best.fits


def test_seed002_corrected_skips_layouts_with_idle_gpus():
    faithful = seed002_calculator(gpus=24, seed_faithful=True)
    corrected = seed002_calculator(gpus=24)
    assert any(x.tp * x.pp * x.dp != 24 for x in faithful.rows)  # e.g. TP1 PP16 DP1
    assert all(x.tp * x.pp * x.dp == 24 for x in corrected.rows)
    assert any("idle" in s for s in corrected.skipped)


def test_seed002_ranking_prefers_least_total_volume_among_fits():
    r = seed002_calculator(seed_faithful=True)
    fitting = [x for x in r.rows if x.fits]
    assert r.best.total_comm_gb == min(x.total_comm_gb for x in fitting)
    assert all(x.tp_intra_node for x in r.rows)  # tp <= 8 always: the '*' never shows


def test_seed002_rejects_bad_input():
    with pytest.raises(ValueError, match="gpus"):
        seed002_calculator(gpus=0)
    with pytest.raises(ValueError, match="params_b"):
        seed002_calculator(-1)
