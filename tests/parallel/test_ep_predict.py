"""Expert parallelism's predicted all-to-all bytes against the closed form of docs/experts.md,
worked out by hand: 4 all-to-alls per MoE layer and step (dispatch and combine, forward and
backward), each of one device's dispatch buffer, E x B_l x C x D values. B_l, one device's rows,
is the global batch over every axis the batch splits over (data, fsdp and expert; not tensor,
whose devices share their rows). The prediction is analytic: building a strategy compiles
nothing."""

import pytest

from jaxscale import verify
from jaxscale.config import TrainConfig
from jaxscale.parallel.compose import Strategy, build

CFG = verify.CFG.replace(**dict(verify.MOE))
BATCH, SEQ = 16, 32
TCFG = TrainConfig(global_batch=BATCH, seq_len=SEQ)


@pytest.mark.parametrize(
    "text, mesh, rows_local",
    [
        ("manual:ep", "ep=8", 2),  # 16 rows over 8 expert shards
        ("manual:dp+ep", "ep=4,dp=2", 2),
        ("manual:dp+ep", "ep=2,dp=4", 2),
        ("manual:zero3+ep+tp", "ep=2,fsdp=2,tp=2", 4),  # 16 over fsdp x ep = 4 shards
        ("manual:zero2+ep+tp_sp", "dp=2,ep=2,tp=2", 4),  # 16 over dp x ep = 4 shards
    ],
)
def test_predicted_all_to_all_bytes_follow_the_rows_each_device_holds(text, mesh, rows_local):
    # E = 8, top-2, cf = 2: C = ceil(2 * 32 * 2 / 8) = 16 slots; D = 64; 2 MoE layers
    assert (CFG.n_experts, CFG.top_k, CFG.capacity_factor) == (8, 2, 2.0)
    assert (CFG.d_model, CFG.n_moe_layers, CFG.compute_dtype) == (64, 2, "float32")
    one_a2a = 8 * rows_local * 16 * 64 * 4  # 2 rows: 64 KiB, x 8 = the 512 KiB docs measure
    predicted, why = build(Strategy.parse(text, mesh), CFG, TCFG).predict_comm(CFG, BATCH, SEQ)
    assert why is None
    assert predicted["all-to-all"] == 4 * 2 * one_a2a
