"""The expert axis by hand: expert parallelism inside the manual step's shard_map.

With N devices on `expert`, device i holds experts [i*E/N, (i+1)*E/N) whole (we_up_EDF
[E/N, D, F], ...) and, outside the experts, is one more data-parallel shard: the batch is split
over the data axes and `expert`, and every non-expert parameter is replicated over `expert`.

Per MoE layer, on this device's dispatch buffer [E, B_l, C, D] (moe.moe_mlp builds it):

  forward   all-to-all #1 (dispatch): split E into N blocks of E/N, block j goes to device j;
            device i receives [E/N, N*B_l, C, D], the slots of its experts from every source
            local experts on their slots
            all-to-all #2 (combine): the reverse, each source gets its slots' outputs back
  backward  the transposes of the two: two more all-to-alls of the same size

so 4 all-to-alls of E*B_l*C*D values per MoE layer and step (6 with remat: the forward runs
again). With C = cf*T*k/E that is cf*k*B_l*T*D: each all-to-all moves k*cf tokens' worth per
local token, of which (N-1)/N cross devices; the seed's "EP = 2kS/N" counts S = B*T*D over N
ranks per direction (docs/experts.md: both readings of N).

Non-expert parameters see every shard's rows through the loss: `local_loss` returns the mean
over the expert axis (one psum of the scalar), so autodiff sums their gradients over `expert`
(the transpose of the implicit broadcast: one all-reduce of their bytes), while an expert's
gradient arrives through the all-to-all's transpose and needs no reduction.
"""

from __future__ import annotations

import jax

from jaxscale.config import ModelConfig
from jaxscale.model import moe
from jaxscale.model.pieces import Pieces
from jaxscale.parallel.common import F32, Composition, StepShape

AXIS = "expert"


def check(cfg: ModelConfig, ep: int) -> None:
    """Raise ValueError for a model or composition the expert axis cannot run."""
    if not cfg.n_experts:
        raise ValueError(f"ep={ep} needs a mixture-of-experts model (--experts E)")
    if cfg.n_experts % ep:
        raise ValueError(
            f"n_experts={cfg.n_experts} is not divisible by the expert-parallel size ep={ep}"
        )


def dispatch_experts(buf_EBCD, p, cfg: ModelConfig, *, axis: str = AXIS):
    """The experts of this device on every device's slots for them (module docstring)."""
    # all-to-all #1: E/N experts' slots to each device, gathered over the sources' rows
    mine_EGCD = jax.lax.all_to_all(buf_EBCD, axis, split_axis=0, concat_axis=1, tiled=True)
    out_EGCD = moe.local_experts(mine_EGCD, p, cfg)
    # all-to-all #2: each source's rows back, all E experts' outputs for its slots
    return jax.lax.all_to_all(out_EGCD, axis, split_axis=1, concat_axis=0, tiled=True)


def pieces(pc: Pieces, comp: Composition) -> Pieces:
    """The experts on every device's slots for them (with an expert axis; else `pc`)."""
    return pc if comp.ep == 1 else expert_pieces(pc)


def expert_pieces(pc: Pieces, axis: str = AXIS) -> Pieces:
    return pc.replace(experts=lambda buf, p, cfg: dispatch_experts(buf, p, cfg, axis=axis))


def local_loss(loss_fn, ep: int, axis: str = AXIS):
    """The loss as the mean over the expert axis's shards (one all-reduce of the scalar), so
    autodiff sums the non-expert parameters' gradients over it."""
    if ep == 1:
        return loss_fn
    return lambda params, rows: jax.lax.psum(loss_fn(params, rows) / ep, axis)


def a2a_bytes(cfg: ModelConfig, rows_local: int, seq_len: int, dtype_bytes: int = F32) -> float:
    """Bytes of one all-to-all of one MoE layer's buffer [E, B_l, C, D] (the census counts the
    operand, which is also the result)."""
    return float(cfg.n_experts * rows_local * cfg.capacity(seq_len) * cfg.d_model * dtype_bytes)


def predict_comm(shape: StepShape, comp: Composition) -> dict:
    """{op: bytes per device} over the expert axis for one step: 4 all-to-alls per MoE layer
    (6 with remat), the non-expert gradients' all-reduce (M_shared / t + norms) and the loss."""
    cfg, ep, t = comp.cfg, comp.ep, comp.t
    rows_local, seq_len = shape.rows_local, shape.seq_len
    if ep == 1:
        return {}
    per_layer = 4 if cfg.remat == "none" else 6  # dots too: expert matmuls have a batch dim
    dtype = 2 if cfg.compute_dtype != "float32" else F32
    a2a = per_layer * cfg.n_moe_layers * a2a_bytes(cfg, rows_local, seq_len, dtype)
    shared = F32 * (shape.shared_matrix_params / t + shape.norm_params) + F32
    return {"all-to-all": a2a, "all-reduce": shared}
