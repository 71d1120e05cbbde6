"""Every remat policy recomputes the forward's collectives once: the compiled step's census per
op equals the axis modules' predictions (ep.py: 6 all-to-alls per MoE layer with remat, 4
without; cp: the ring's permutes, Ulysses' all-to-alls and the all-gathers of the forward
again) for dots and every:K as for block. The fast suite checks block (test_moe_training.py,
verify's cp cases)."""

import jax
import pytest

from jaxscale import verify
from jaxscale.analysis.compiled import compile_with_report
from jaxscale.config import TrainConfig
from jaxscale.parallel.compose import build
from jaxscale.parallel.strategy import Strategy
from jaxscale.tolerances import COMM_RTOL

pytestmark = pytest.mark.slow  # eight compiles on eight devices

CASES = [
    ("manual:dp+ep", "ep=4,dp=2", verify.CFG.replace(**dict(verify.MOE)), "all-to-all"),
    ("manual:dp+cp_ring", "dp=2,cp=4", verify.CFG, "collective-permute"),
    ("manual:dp+cp_ulysses", "dp=2,cp=4", verify.CFG, "all-to-all"),
    ("manual:dp+cp_gather", "dp=2,cp=4", verify.CFG, "all-gather"),
]


@pytest.mark.parametrize("strategy, mesh, cfg, op", CASES, ids=[c[0] for c in CASES])
def test_every_policy_repeats_the_forward_collectives_as_predicted(strategy, mesh, cfg, op):
    batch, seq_len = 16, 32
    tcfg = TrainConfig(global_batch=batch, seq_len=seq_len)
    got = {}
    for policy in ("none", "dots", "every:2"):
        c = cfg.replace(remat=policy)
        built = build(Strategy.parse(strategy, mesh), c, tcfg)
        with jax.set_mesh(built.mesh):
            _, report = compile_with_report(built.step, *built.abstract_args(batch, seq_len))
        measured = {k: v.total_bytes for k, v in report.collective_totals().items()}
        predicted, why = built.predict_comm(c, batch, seq_len)
        assert why is None
        for name in set(measured) | set(predicted):
            assert measured.get(name, 0) == pytest.approx(predicted.get(name, 0), rel=COMM_RTOL), (
                policy,
                name,
            )
        got[policy] = measured[op]
    # the op the forward holds is sent again by both policies, by the same amount
    assert got["dots"] == got["every:2"] > got["none"]
