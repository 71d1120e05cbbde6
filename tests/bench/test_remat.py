"""`jaxscale bench remat`: each activation-checkpointing policy's compiled step against the
segment model and the recompute the matmul counts predict (jaxscale/bench/remat.py)."""

import math
import subprocess
import sys

import pytest

from jaxscale.bench import remat
from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.tolerances import FLOPS_RTOL

CFG = ModelConfig(d_model=64, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=256, max_seq=128)
TCFG = TrainConfig(global_batch=4, seq_len=128)


@pytest.mark.slow  # eleven compiles of the step
def test_policies_trade_memory_for_recompute_as_predicted():
    rows = {r.policy: r for r in remat.run(CFG, TCFG, ["dots", "every:1", "every:2", "every:4"])}
    temp = {p: r.temp for p, r in rows.items()}
    x = remat.kept_input_bytes(CFG, TCFG)
    # the model's ends are the same programs' memory: runs of one layer are block, one run of
    # all L layers keeps what none keeps (and its one input)
    assert temp["every:1"] == temp["block"]
    assert abs(temp["every:4"] - temp["none"]) <= x
    # longer runs keep fewer inputs and more layers' insides: memory grows with K; dots keeps
    # the weight matmuls' outputs, between block and none
    assert temp["block"] < temp["every:2"] < temp["every:4"]
    assert temp["block"] < temp["dots"] < temp["none"]
    # every:2 against the segment model: at least its prediction, at most one more layer's
    # saved activations (the layer being differentiated holds its cotangents too)
    _, per_layer = remat.segment_model(CFG, TCFG, temp["none"], temp["block"])
    pred = rows["every:2"].predicted_temp
    assert pred == pytest.approx(temp["none"] - (4 - 2) * per_layer + math.ceil(4 / 2) * x)
    assert pred <= temp["every:2"] <= pred + per_layer, (temp["every:2"], pred, per_layer)
    # the added matmuls are the recomputed layers' (model/counts); all added FLOPs hold
    # elementwise work besides; dots recomputes the least
    for policy in ("block", "dots", "every:2"):
        r = rows[policy]
        extra = r.matmul_flops - rows["none"].matmul_flops
        assert extra == pytest.approx(r.predicted_recompute, rel=FLOPS_RTOL), policy
        assert r.flops - rows["none"].flops > extra
    assert 0 < rows["dots"].flops - rows["none"].flops < rows["block"].flops - rows["none"].flops


def _bench(*argv):
    return subprocess.run(
        [sys.executable, "-m", "jaxscale", "bench", "remat", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_bench_remat_checks_its_flags_before_compiling():
    dry = _bench("--dry-run", "--policies", "sqrt,every:3")
    assert dry.returncode == 0 and dry.stdout.split() == ["sqrt", "every:3"], dry.stderr
    for flags, word in (
        (["--policies", "every:0"], "--policies"),
        (["--policies", "half"], "none, block, dots, offload, every:K, sqrt"),
        (["--layers", "1"], "at least 2"),
    ):
        bad = _bench(*flags)
        assert bad.returncode == 2 and word in bad.stderr and "Traceback" not in bad.stderr
