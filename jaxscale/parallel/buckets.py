"""Bucketed data-parallel gradients (`manual:dp` with `--grad-buckets N`): the layers' gradient
all-reduce issued in N buckets inside the backward, each as soon as its layers' gradients
exist, in place of one all-reduce after the backward (seed 002 ch. 5: DDP overlaps the
gradient all-reduce with the backward, in buckets).

How: the layer stack is scanned in N runs of L/N layers (model/pieces.run_layers, `run_groups`);
each run's slice of the replicated stacked parameters, invariant over the data axes, is cast to
varying as the run starts (`run_hook`). The transpose of that cast is a psum over the data axes,
so autodiff places the run's all-reduce (one per leaf; XLA's combiner may join them) in the
backward loop's body, right after that run's backward. The embedding, final norm and head keep
DP's explicit all-reduce after the backward (common.accumulate casts only them to varying).
Bytes are DP's (zero.predict_comm); where they sit is what changes. On XLA:CPU a collective
holds its device until every device arrives, so nothing overlaps; on a GPU the scheduler can run
run i's all-reduce beside the backward of the run before it.
"""

from __future__ import annotations

import jax

from jaxscale.model.pieces import Pieces
from jaxscale.parallel import common

REDUCED_IN_BACKWARD = ("blocks",)  # the params whose gradients the runs all-reduce


def pieces(pc: Pieces, comp: common.Composition) -> Pieces:
    """Runs of L/N layer groups, each cast to varying over the data axes as it starts."""
    if not comp.grad_buckets:
        return pc
    axes = comp.data_axes

    def vary(layers):  # transpose: the run's all-reduce over the data axes, in the backward
        return jax.tree.map(lambda p: jax.lax.pcast(p, axes, to="varying"), layers)

    return pc.replace(run_hook=vary, run_groups=_groups(comp.cfg) // comp.grad_buckets)


def _groups(cfg) -> int:
    """The layer groups the scan runs over (MoE: groups of moe_every layers)."""
    return cfg.n_layers // (cfg.moe_every if cfg.n_experts else 1)


def check(strategy, ways: dict, cfg, tcfg) -> None:
    """The compositions buckets are defined for: plain DP (with TP), one microbatch, N dividing
    the layer groups, no remat runs of another length."""
    n = strategy.grad_buckets
    if not n:
        return
    if n < 0:
        raise ValueError(f"--grad-buckets must be >= 1, got {n}")
    if strategy.path != "manual" or strategy.zero != 0:
        raise ValueError(
            "--grad-buckets splits DP's gradient all-reduce: use it with manual:dp (or "
            "manual:dp+tp); ZeRO and the auto path reduce their gradients otherwise"
        )
    if strategy.schedule or ways.get("expert", 1) > 1 or ways.get("context", 1) > 1:
        raise ValueError(
            "--grad-buckets is for data (and tensor) parallelism: a pipeline, expert or "
            "context axis reduces its gradients in its own place"
        )
    if ways["data"] * ways["fsdp"] == 1:
        raise ValueError("--grad-buckets needs a data axis (dp=N) to all-reduce over")
    if tcfg.grad_accum != 1:
        raise ValueError(
            f"--grad-buckets with --grad-accum {tcfg.grad_accum} would all-reduce every "
            "microbatch's gradients; use one of the two"
        )
    groups = _groups(cfg)
    if groups % n:
        what = "layers" if not cfg.n_experts else f"groups of {cfg.moe_every} layers"
        raise ValueError(f"--grad-buckets {n} does not divide the model's {groups} {what}")
    if cfg.remat.startswith("every:") or cfg.remat == "sqrt":
        raise ValueError(
            f"--grad-buckets runs the layers in buckets; --remat {cfg.remat} runs them in "
            "checkpointed runs of its own length: use --remat block or dots with buckets"
        )
