"""DP's gradient all-reduce in buckets (parallel/buckets.py): the same step as one all-reduce
after the backward (verify's cases), the same bytes, and the layers' all-reduces moved into the
backward loop, one per bucket; and the compositions it is not defined for, refused."""

from dataclasses import replace

import jax
import pytest

from jaxscale import verify
from jaxscale.analysis.compiled import compile_with_report
from jaxscale.config import TrainConfig
from jaxscale.parallel import auto
from jaxscale.parallel.compose import build
from jaxscale.parallel.strategy import Strategy
from jaxscale.tolerances import COMM_RTOL

CFG = verify.CFG.replace(n_layers=4)
TCFG = TrainConfig(global_batch=16, seq_len=32)
F32 = 4


def _all_reduces(buckets: int):
    built = build(replace(Strategy.parse("manual:dp", "dp=8"), grad_buckets=buckets), CFG, TCFG)
    with jax.set_mesh(built.mesh):
        _, report = compile_with_report(built.step, *built.abstract_args(16, 32))
    predicted, _ = built.predict_comm(CFG, 16, 32)
    return [c for c in report.collectives if c.op == "all-reduce"], predicted["all-reduce"]


def _bytes(params) -> int:
    return F32 * sum(x.size for x in jax.tree.leaves(params))


def test_the_layers_all_reduce_runs_once_per_bucket_inside_the_backward():
    """One all-reduce after the backward without buckets (XLA's combiner joins every leaf);
    with N buckets, an all-reduce of L/N layers' gradients inside the backward loop (N trips)
    and the embedding's, norm's and head's after it, the step's bytes unchanged."""
    params = jax.eval_shape(lambda: auto.init_state(CFG, TCFG))["params"]
    layers = _bytes(params["blocks"])
    top = _bytes({k: v for k, v in params.items() if k != "blocks"})
    plain, predicted = _all_reduces(0)
    assert [c.trips for c in plain] == [1]
    assert plain[0].bytes_per_device == pytest.approx(predicted, rel=COMM_RTOL)
    for buckets in (2, 4):
        got, _ = _all_reduces(buckets)
        in_loop = [c for c in got if c.trips > 1]
        after = [c for c in got if c.trips == 1]
        assert [c.trips for c in in_loop] == [buckets]
        assert in_loop[0].bytes_per_device == pytest.approx(layers / buckets, rel=COMM_RTOL)
        assert sum(c.bytes_per_device for c in after) == pytest.approx(top + F32, rel=COMM_RTOL)
        total = sum(c.bytes_per_device * c.trips for c in got)
        assert total == pytest.approx(predicted, rel=COMM_RTOL)  # the loss's scalar included


@pytest.mark.parametrize(
    "text, mesh, changes, message",
    [
        ("manual:zero3", "fsdp=8", {}, "use it with manual:dp"),
        ("auto", "dp=8", {}, "use it with manual:dp"),
        ("manual:dp+1f1b", "pp=2,dp=4", {}, "a pipeline, expert or context axis"),
        ("manual:dp", "dp=8", {"buckets": 3}, "does not divide the model's 4 layers"),
        ("manual:dp", "dp=8", {"grad_accum": 2}, "would all-reduce every microbatch"),
        ("manual:dp", "dp=8", {"remat": "every:2"}, "--remat every:2 runs them"),
    ],
)
def test_compositions_buckets_are_not_defined_for_are_refused(text, mesh, changes, message):
    strategy = replace(Strategy.parse(text, mesh), grad_buckets=changes.get("buckets", 2))
    cfg = CFG.replace(remat=changes.get("remat", "none"))
    tcfg = TCFG.replace(grad_accum=changes.get("grad_accum", 1))
    with pytest.raises(ValueError, match=message):
        build(strategy, cfg, tcfg)
