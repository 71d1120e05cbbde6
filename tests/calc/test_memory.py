"""Training memory per device: seed goldens and closed forms."""

import math

import pytest

from jaxscale.calc import memory as mem

GB = 1e9
REL = 1e-12  # the arithmetic is exact up to float rounding
ROUND_2DP = 0.005  # the seeds print GB with two decimals


def test_bytes_per_param_constants():
    # seed 000 Exercise 1: 2 + 2 + 4 + 4 = 12 B/param; +4 fp32 master = 16
    assert mem.MIXED_ADAM_BYTES_PER_PARAM == 12
    assert mem.MIXED_ADAM_MASTER_BYTES_PER_PARAM == 16


@pytest.mark.parametrize(
    "n_params, total_gb",
    [
        (7e9, 84.0),  # seed 003's concepts table: 14 + 14 + 28 + 28
        (70e9, 840.0),  # seed 002 ch5 "The Memory Problem"
        (175e9, 2100.0),  # seed 004 §2 "Memory Constraints": "2.1TB"
    ],
)
def test_single_device_totals(n_params, total_gb):
    m = mem.training_memory_per_device(n_params)
    assert m.total / GB == pytest.approx(total_gb, rel=REL)


def test_70b_zero_stages_on_8_gpus():
    # seed 002 ch5 memory table: DDP 840, ZeRO-1 350, ZeRO-2 227.5 (seed text 210), ZeRO-3 105
    totals = [m.total / GB for m in mem.zero_stage_memories(70e9, dp=8)]
    assert totals == pytest.approx([840.0, 350.0, 227.5, 105.0], rel=REL)


def test_seed_faithful_zero2_reproduces_210():
    # seed 002 ch5 prints 210 GB: weights 140 + optimizer 70, no gradients
    rows = mem.zero_stage_memories(70e9, dp=8, seed_faithful=True)
    assert rows[2].total / GB == pytest.approx(210.0, rel=REL)
    assert rows[2].gradients == 0
    # the other stages are unchanged
    assert [rows[s].total / GB for s in (0, 1, 3)] == pytest.approx([840, 350, 105], rel=REL)


def test_stage_components_match_seed000_formula():
    # seed 000 Exercise 1's training_memory, written out again: each stage shards one more term
    n, gpus = 124e6, 8
    expected = {
        0: (2 * n, 2 * n, 8 * n),
        1: (2 * n, 2 * n, 8 * n / gpus),
        2: (2 * n, 2 * n / gpus, 8 * n / gpus),
        3: (2 * n / gpus, 2 * n / gpus, 8 * n / gpus),
    }
    for stage, (w, g, o) in expected.items():
        m = mem.training_memory_per_device(n, dp=gpus, zero_stage=stage)
        assert (m.weights, m.gradients, m.optimizer) == pytest.approx((w, g, o), rel=REL)
        assert m.master == 0 and m.activations == 0


def test_tp_pp_divide_model_state_before_zero():
    # TP=8 x ZeRO-3 over DP=8 on 70B (seed 001 §6): everything / 64
    m = mem.training_memory_per_device(70e9, dp=8, tp=8, zero_stage=3)
    assert m.total / GB == pytest.approx(840 / 64, rel=REL)
    m = mem.training_memory_per_device(70e9, tp=4, pp=2)
    assert m.total / GB == pytest.approx(840 / 8, rel=REL)


def test_master_copy_sharded_with_optimizer():
    m0 = mem.training_memory_per_device(70e9, dp=8, zero_stage=0, master_bytes=4)
    m1 = mem.training_memory_per_device(70e9, dp=8, zero_stage=1, master_bytes=4)
    assert m0.master / GB == pytest.approx(280, rel=REL)
    assert m1.master / GB == pytest.approx(35, rel=REL)
    assert m0.total / GB == pytest.approx(16 * 70, rel=REL)


def test_zero_stages_never_increase_memory_and_dp1_is_flat():
    for dp in (2, 4, 8, 64):
        totals = [m.total for m in mem.zero_stage_memories(13e9, dp=dp)]
        assert all(a > b for a, b in zip(totals, totals[1:], strict=False))
    flat = [m.total for m in mem.zero_stage_memories(13e9, dp=1)]
    assert flat == pytest.approx([flat[0]] * 4, rel=REL)


def test_activation_bytes_simple_closed_form():
    # seed 004 §12: b*s*h*L*4*2, sqrt(L) with checkpointing
    assert mem.activation_bytes_simple(2, 128, 64, 16) == 2 * 128 * 64 * 16 * 8
    ckpt = mem.activation_bytes_simple(2, 128, 64, 16, checkpointing=True)
    assert ckpt == pytest.approx(2 * 128 * 64 * 4 * 8, rel=REL)


def test_s4_gpt3_memory():
    # seed 004 §12 prints: 350 + 350 + 1400 + 19.33 = 2119.33 GB; ckpt 1.97 -> 2101.97
    gpt3 = dict(batch_size=1, seq_len=2048, hidden_size=12288, n_layers=96, mixed_precision=True)
    plain = mem.single_gpu_memory(175e9, **gpt3)
    ckpt = mem.single_gpu_memory(175e9, activation_checkpointing=True, **gpt3)
    assert (plain.weights / GB, plain.gradients / GB, plain.optimizer / GB) == (350, 350, 1400)
    assert plain.activations / GB == pytest.approx(19.33, abs=ROUND_2DP)
    assert plain.total / GB == pytest.approx(2119.33, abs=ROUND_2DP)
    assert ckpt.activations / GB == pytest.approx(1.97, abs=ROUND_2DP)
    assert ckpt.total / GB == pytest.approx(2101.97, abs=ROUND_2DP)
    assert not mem.fits(plain, 80 * GB)


def test_single_gpu_memory_fp32_and_sgd():
    shape = dict(batch_size=1, seq_len=8, hidden_size=8, n_layers=4)
    m = mem.single_gpu_memory(1e6, optimizer="sgd", **shape)
    assert (m.weights, m.gradients, m.optimizer) == (4e6, 4e6, 4e6)
    assert mem.single_gpu_memory(1e6, optimizer="none", **shape).optimizer == 0
    with pytest.raises(ValueError, match="unknown optimizer 'lion'"):
        mem.single_gpu_memory(1e6, optimizer="lion", **shape)


def test_param_heuristic_activations():
    # seed 001 §6: params/(tp*pp) * 10 (3 with checkpointing) * 2 bytes
    assert mem.activation_bytes_param_heuristic(70e9) / GB == pytest.approx(1400, rel=REL)
    ckpt = mem.activation_bytes_param_heuristic(70e9, tp=8, checkpointing=True)
    assert ckpt / GB == pytest.approx(52.5, rel=REL)


def test_fits_boundary():
    m = mem.training_memory_per_device(10e9, activation_bytes=0)  # 120 GB
    assert mem.fits(m, 120 * GB)
    assert not mem.fits(m, 119.9 * GB)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n_params=0), "n_params must be > 0"),
        (dict(n_params=-1e9), "n_params must be > 0"),
        (dict(n_params=1e9, dp=0), "dp must be a positive integer"),
        (dict(n_params=1e9, tp=2.5), "tp must be a positive integer"),
        (dict(n_params=1e9, pp=True), "pp must be a positive integer"),
        (dict(n_params=1e9, zero_stage=4), "zero_stage must be one of"),
        (dict(n_params=1e9, grad_bytes=-2), "grad_bytes must be >= 0"),
        (dict(n_params=1e9, activation_bytes=math.nan), "activation_bytes must be >= 0"),
    ],
)
def test_bad_input_raises(kwargs, message):
    with pytest.raises(ValueError, match=message):
        mem.training_memory_per_device(**kwargs)


def test_activation_bad_input():
    with pytest.raises(ValueError, match="seq_len must be > 0"):
        mem.activation_bytes_simple(1, 0, 8, 2)
