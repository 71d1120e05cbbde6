"""Training communication: TP all-reduce, ZeRO per stage, seed 002's tables and tp_mlp goldens."""

import pytest

from jaxscale.calc import training_comm as tc

REL = 1e-12
MS_2DP = 0.005  # the seed prints milliseconds with two decimals
KB = 1024


def ring_allreduce_bytes_sent(n: int, size: int) -> tuple[float, list[list[float]]]:
    """Brute-force ring all-reduce of n vectors of `size` elements split in n chunks.

    Returns the elements one rank sends and every rank's final vector (to check it is a sum).
    """
    chunk = size // n
    data = [[float(r + 1) * (c + 1) for c in range(n)] for r in range(n)]  # one value per chunk
    sent = 0
    for step in range(n - 1):  # reduce-scatter
        outgoing = [(r, (r - step) % n, data[r][(r - step) % n]) for r in range(n)]
        for r, c, value in outgoing:
            data[(r + 1) % n][c] += value
        sent += chunk
    for step in range(n - 1):  # all-gather
        outgoing = [(r, (r + 1 - step) % n, data[r][(r + 1 - step) % n]) for r in range(n)]
        for r, c, value in outgoing:
            data[(r + 1) % n][c] = value
        sent += chunk
    return sent, data


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_factors_match_brute_force(n):
    size = 8 * 840
    sent, data = ring_allreduce_bytes_sent(n, size)
    total = sum(range(1, n + 1))
    assert all(row == [total * (c + 1) for c in range(n)] for row in data)
    assert sent / size == pytest.approx(tc.ring_allreduce_factor(n), rel=REL)
    assert tc.ring_gather_factor(n) == pytest.approx(tc.ring_allreduce_factor(n) / 2, rel=REL)


def test_tp_mlp_goldens():
    # seed 002 ch6 tp_mlp.py with -H 64 -b 4 -s 16 -t 4: 4,096; 16.0 KB; 24.0 KB; 96.0 KB
    m = tc.tp_mlp_comm(64, 4, 16, 4)
    assert m.elements_per_allreduce == 4096
    assert f"{m.bytes_per_allreduce / KB:.1f}" == "16.0"
    assert f"{m.ring_bytes_per_gpu / KB:.1f}" == "24.0"
    assert f"{m.ring_bytes_total / KB:.1f}" == "96.0"
    # 4 all-reduces per layer fwd+bwd = 8 * b*s*h * (T-1)/T values (seed 002 ch6)
    assert m.layer_fwd_bwd_bytes_per_gpu == 8 * 4096 * 3 / 4 * 4


def test_mlp_params_scaling():
    # seed 002 ch6 compare_scaling: 134M (537 MB fp32) -> 16.7M (67 MB); 8H^2 and 8H^2/T
    full, split = tc.mlp_params_per_gpu(4096), tc.mlp_params_per_gpu(4096, 8)
    assert full == 8 * 4096**2 == 134_217_728
    assert split == full / 8
    assert round(full * 4 / 1e6) == 537 and round(split * 4 / 1e6) == 67
    assert int(split / 1e5) / 10 == 16.7  # the seed truncates 16.78M to 16.7M


def test_zero_volume_table():
    # seed 002 ch5's volume table; totals 2D, 3D, 2D, 5D -> ZeRO-3 / DDP = 2.5 (prose says 3x)
    rows = tc.zero_volume_table()
    assert [(r.forward_d, r.backward_d, r.optimizer_d) for r in rows] == [
        (0, 2, 0),
        (0, 2, 1),
        (0, 1, 1),
        (2, 2, 1),
    ]
    assert [r.total_d for r in rows] == [2, 3, 2, 5]
    assert rows[3].total_d / rows[0].total_d == 2.5
    assert [r.paper_total_d for r in rows] == [2, 2, 2, 3]


def test_collective_time_closed_form():
    link = tc.Link("x", 100.0, 10.0)
    assert tc.collective_time_ms(1e9, link) == pytest.approx((10e-6 + 1e9 / 100e9) * 1e3, rel=REL)
    assert tc.collective_time_ms(0, link) == pytest.approx(0.01, rel=REL)


def test_links_seed_vs_corrected():
    # seed 001 §7 NetworkSpecs labels IB NDR 400 and 100GbE as GB/s; they are Gbit/s
    assert tc.links(seed_faithful=True)["infiniband"].bandwidth_gb_s == 400
    assert tc.links()["infiniband"].bandwidth_gb_s == 50
    assert tc.links()["ethernet"].bandwidth_gb_s == 12.5
    assert tc.links()["nvlink"] == tc.links(seed_faithful=True)["nvlink"]


def test_tp_layer_seed_faithful_values():
    # seed 001 §7 analyze_tp_communication defaults: d 8192, TP 8, batch 4, seq 2048, bf16 [C]
    size = 4 * 2048 * 8192 * 2
    for key in ("nvlink", "infiniband"):
        link = tc.SEED_LINKS[key]
        r = tc.tp_layer_comm(8192, 8, 4, 2048, link, seed_faithful=True)
        expected = (link.latency_us * 1e-6 + 2 * size / (link.bandwidth_gb_s * 1e9)) * 1e3
        assert r.allreduce_ms == pytest.approx(expected, rel=REL)
        assert r.per_layer_bytes / 1e9 == pytest.approx(4 * size / 1e9, rel=REL)
    nv = tc.tp_layer_comm(8192, 8, 4, 2048, tc.SEED_LINKS["nvlink"], seed_faithful=True)
    assert nv.allreduce_ms == pytest.approx(0.45, abs=MS_2DP)


def test_tp_layer_corrected_uses_ring_factor():
    r = tc.tp_layer_comm(1024, 8, 2, 128, tc.CORRECTED_LINKS["nvlink"])
    assert r.allreduce_bytes_per_gpu == pytest.approx(1.75 * 2 * 128 * 1024 * 2, rel=REL)
    assert tc.tp_layer_comm(1024, 1, 2, 128, tc.CORRECTED_LINKS["nvlink"]).per_layer_bytes == 0


def test_zero_seed_faithful_values():
    # seed 001 §7 analyze_fsdp_communication: 70B, 80 layers, DP 64, "InfiniBand 400 GB/s", 2 us [C]
    link = tc.SEED_LINKS["infiniband"]
    lat = 2e-6
    grads = 70e9 * 2
    z1 = tc.zero_step_comm(70e9, 80, 64, 1, link, seed_faithful=True)
    z2 = tc.zero_step_comm(70e9, 80, 64, 2, link, seed_faithful=True)
    z3 = tc.zero_step_comm(70e9, 80, 64, 3, link, seed_faithful=True)
    assert z1.step_ms == pytest.approx((lat + 2 * grads / 400e9) * 1e3, rel=REL)
    assert z1.per_layer_ms == pytest.approx(8.75, abs=MS_2DP)
    assert z2.step_ms == pytest.approx((lat + 63 / 64 * grads / 400e9) * 1e3, rel=REL)
    per_collective = (lat + 63 / 64 * grads / 80 / 400e9) * 1e3
    assert z3.per_layer_ms == pytest.approx(2 * per_collective, rel=REL)
    assert z3.step_ms == pytest.approx(160 * per_collective, rel=REL)


def test_zero_corrected_volumes():
    # ZeRO paper accounting: stages 0-2 move 2(N-1)/N * G, stage 3 moves 3(N-1)/N * G
    link = tc.CORRECTED_LINKS["infiniband"]
    grads = 13e9 * 2
    volumes = [tc.zero_step_comm(13e9, 40, 16, s, link).bytes_per_gpu for s in range(4)]
    assert volumes[:3] == pytest.approx([2 * 15 / 16 * grads] * 3, rel=1e-9)
    assert volumes[3] == pytest.approx(3 * 15 / 16 * grads, rel=1e-9)
    assert volumes[3] / volumes[0] == pytest.approx(1.5, rel=1e-9)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: tc.tp_mlp_comm(64, 4, 16, 0), "tp must be a positive integer"),
        (lambda: tc.tp_mlp_comm(-64, 4, 16, 4), "hidden_size must be > 0"),
        (lambda: tc.zero_step_comm(70e9, 80, 64, 5, tc.SEED_LINKS["nvlink"]), "zero_stage"),
        (lambda: tc.zero_step_comm(0, 80, 64, 1, tc.SEED_LINKS["nvlink"]), "n_params"),
        (lambda: tc.collective_time_ms(-1, tc.SEED_LINKS["nvlink"]), "message_bytes"),
        (lambda: tc.mlp_params_per_gpu(4096, 0), "tp must be a positive integer"),
    ],
)
def test_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()
