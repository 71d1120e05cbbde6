"""Weight-update transfer times against seed 002 ch14 weight_update_demo.py
([R] = printed by the seed's code when run)."""

import pytest

from jaxscale.calc import weight_transfer as wt

S_TOL = 0.005  # the seed prints seconds with two decimals


@pytest.mark.parametrize(
    "key, shown, seconds, note",
    [  # [R] 140 GB
        ("disk_ssd", "20.10 s", 140 / 7 + 0.1, "Acceptable"),
        ("disk_hdd", "11.7 min", 140 / 0.2 + 0.5, "Slow"),
        ("nccl_nvlink", "0.32 s", 140 / 450 + 0.01, "Excellent"),
        ("nccl_ib", "2.85 s", 140 / 50 + 0.05, "Good"),
        ("nccl_ethernet", "11.30 s", 140 / 12.5 + 0.1, "Acceptable"),
        ("cuda_ipc", "1.0 ms", 0.001, "Zero copy!"),
    ],
)
def test_transfer_times_140gb(key, shown, seconds, note):
    method = wt.TRANSFER_METHODS[key]
    t = wt.transfer_time_s(method, 140)
    assert t == pytest.approx(seconds)
    assert wt.format_duration(t) == shown
    assert wt.rating(method, t) == note


@pytest.mark.parametrize(
    "method, transfers, total, overhead_pct",
    [  # [R] two transfers: IPC 50.00 s / 0.0%, IB 55.70 s / 10.2%; one transfer: our default
        ("cuda_ipc", 2, 50.00, 0.0),
        ("nccl_ib", 2, 55.70, 10.2),
        ("nccl_ib", 1, 52.85, 5.4),
    ],
)
def test_iteration_timeline(method, transfers, total, overhead_pct):
    t = wt.rlhf_timeline(method, transfers=transfers)
    assert t.total_s == pytest.approx(total, abs=S_TOL)
    assert round(t.overhead * 100, 1) == overhead_pct
    assert t.total_s == pytest.approx(30 + 20 + transfers * t.transfer_s)


def test_method_filters_seed_vs_corrected():
    # defect 13: the seed's co-located filter drops nothing, its same-node list keeps IPC
    everything = list(wt.TRANSFER_METHODS)
    assert wt.applicable_methods("co-located", seed_faithful=True) == everything
    assert wt.applicable_methods("disaggregated-same-node", seed_faithful=True) == everything
    assert wt.applicable_methods("co-located") == ["disk_ssd", "disk_hdd", "cuda_ipc"]
    same_node = wt.applicable_methods("disaggregated-same-node")
    assert "cuda_ipc" not in same_node and "nccl_nvlink" in same_node
    cross = ["disk_ssd", "disk_hdd", "nccl_ib", "nccl_ethernet"]  # [R] cross-node list
    assert wt.applicable_methods("disaggregated-cross-node") == cross
    assert wt.applicable_methods("disaggregated-cross-node", seed_faithful=True) == cross


def test_exercise2_bandwidth_for_ten_seconds():
    # seed 002 ch14 Ex. 2: 140 GB in 10 s needs 14 GB/s; two such transfers add 20 s, 28.6% of 70 s
    custom = wt.TransferMethod("14 GB/s", 14.0, 0, True, True, False)
    assert wt.transfer_time_s(custom, 140) == pytest.approx(10.0)
    t = wt.RlhfTimeline("custom", 140, 30, 20, 2, wt.transfer_time_s(custom, 140))
    assert t.total_s == pytest.approx(70.0)
    assert t.overhead == pytest.approx(0.286, abs=0.0005)


@pytest.mark.parametrize(
    "call",
    [
        lambda: wt.transfer_time_s(wt.TRANSFER_METHODS["nccl_ib"], 0),
        lambda: wt.applicable_methods("hybrid"),
        lambda: wt.rlhf_timeline("carrier_pigeon"),
        lambda: wt.rlhf_timeline("nccl_ib", transfers=-1),
        lambda: wt.rlhf_timeline("nccl_ib", generation_s=-1),
    ],
)
def test_bad_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()
