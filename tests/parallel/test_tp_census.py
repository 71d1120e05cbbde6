"""What the compiler really runs for manual tensor parallelism: a collective census per mode.

Mesh data=2 x tensor=4, so a collective over `tensor` has groups of 4 (two of them) and one over
`data` groups of 2. Layers are unrolled (`unroll_layers=True`) because the census counts a loop
body once. Every expected count and size below is a prediction from the shapes:

  L layers, B_l = B/2 local rows, ACT = B_l*T*D*4 bytes (one f32 [B_l, T, D] activation)
  megatron  forward: 2 all-reduces of ACT per layer (attention wo, MLP w_down: Megatron g)
            + 1 for the vocab-parallel embedding; the cross-entropy adds one all-reduce (max) of
            [B_l, T] and one (sum) of two [B_l, T] arrays. Backward: 2 more per layer (Megatron f
            at the attention and MLP inputs) + 1 at the unembedding input.
            Per layer: 2 forward, 4 forward+backward (seed 002 ch6).
  sequence  the all-reduces of ACT become all-gathers + reduce-scatters of ACT (the embedding
            reduce-scatters, the final norm's output is all-gathered before the unembedding).
  gather_output  megatron's all-reduces plus, per layer, one all-gather of the fused QKV output
            (B_l*T*(H+2G)*K*4 bytes) and one of the MLP activation (B_l*T*F*4 bytes): seed 004's
            "2 AllGather + 2 AllReduce per layer" (seed 004 §7).
XLA:CPU may print a reduce-scatter as all-reduce + dynamic-slice; `hlo.normalize` folds it back.
"""

from collections import Counter

import jax
import jax.numpy as jnp

from jaxscale.analysis import hlo
from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.model import state
from jaxscale.parallel.compose import Strategy, build

F32 = 4  # bytes per element
DATA, TENSOR = 2, 4
B, T = 8, 16
L = 3
CFG = ModelConfig(n_layers=L, n_kv_heads=8, d_ff=256, unroll_layers=True)
B_LOCAL = B // DATA
ACT = B_LOCAL * T * CFG.d_model * F32  # one all-reduce of the residual stream
ROW = B_LOCAL * T * F32  # one f32 per token (cross-entropy statistics)
QKV = B_LOCAL * T * (CFG.n_heads + 2 * CFG.n_kv_heads) * CFG.head_dim * F32
MLP = B_LOCAL * T * CFG.d_ff * F32
assert len({ACT, ROW, 2 * ROW, QKV, MLP}) == 5  # sizes tell the collectives apart

_CENSUS: dict = {}


def census(mode: str, grads: bool) -> Counter:
    """Counter of (op, bytes per device) over `tensor` for the compiled step; cached per case."""
    key = (mode, grads)
    if key not in _CENSUS:
        name = {"megatron": "tp", "sequence": "tp_sp", "gather_output": "tp_gather"}[mode]
        strategy = Strategy.parse(f"manual:dp+{name}", f"dp={DATA},tp={TENSOR}")
        built = build(strategy, CFG, TrainConfig(global_batch=B, seq_len=T))
        batch = jax.ShapeDtypeStruct((B, T + 1), jnp.int32)
        f = built.loss_and_grads if grads else built.loss
        found = hlo.normalize(
            hlo.collectives_of(f.lower(state.abstract_params(CFG), batch).compile())
        )
        tensor = [c for c in found if c.group_size == TENSOR and c.num_groups == DATA]
        other = [c for c in found if c not in tensor]
        _CENSUS[key] = Counter((c.op, c.bytes_per_device) for c in tensor), other
    return _CENSUS[key]


def test_megatron_forward_one_all_reduce_per_attention_and_per_mlp_block():
    over_tensor, other = census("megatron", grads=False)
    assert over_tensor == Counter(
        {
            ("all-reduce", ACT): 2 * L + 1,  # 2 per layer + the vocab-parallel embedding
            ("all-reduce", ROW): 1,  # cross-entropy: row maxima
            ("all-reduce", 2 * ROW): 1,  # cross-entropy: sum of exp and target logit together
        }
    )
    # over data: only the loss mean, one f32 scalar
    assert [(c.op, c.bytes_per_device, c.group_size) for c in other] == [("all-reduce", 4, DATA)]


def test_megatron_all_reduce_bytes_are_one_activation():
    over_tensor, _ = census("megatron", grads=False)
    big = [size for (op, size), n in over_tensor.items() if op == "all-reduce" and size > 2 * ROW]
    assert big == [B_LOCAL * T * CFG.d_model * F32]


def test_megatron_forward_and_backward_four_all_reduces_per_layer():
    fwd, _ = census("megatron", grads=False)
    both, _ = census("megatron", grads=True)
    per_layer = (both[("all-reduce", ACT)] - 2) / L  # minus embedding (fwd) and unembedding (bwd)
    assert both[("all-reduce", ACT)] == 4 * L + 2 and per_layer == 4
    assert (fwd[("all-reduce", ACT)] - 1) / L == 2
    assert not {op for op, _ in both} - {"all-reduce"}  # no gathers, no scatters


def test_sequence_mode_swaps_all_reduces_for_all_gathers_and_reduce_scatters():
    fwd, _ = census("sequence", grads=False)
    assert fwd == Counter(
        {
            ("all-gather", ACT): 2 * L + 1,  # before each column matmul + before the unembedding
            ("reduce-scatter", ACT): 2 * L + 1,  # after each row matmul + the embedding
            ("all-reduce", ROW): 1,
            ("all-reduce", 2 * ROW): 1,
        }
    )
    both, _ = census("sequence", grads=True)
    # each is the other's transpose: the backward adds as many of the opposite kind
    assert both[("all-gather", ACT)] == both[("reduce-scatter", ACT)] == 2 * (2 * L + 1)
    assert ("all-reduce", ACT) not in both


def test_gather_output_mode_adds_two_all_gathers_per_layer():
    fwd, _ = census("gather_output", grads=False)
    assert fwd == Counter(
        {
            ("all-reduce", ACT): 2 * L + 1,
            ("all-gather", QKV): L,  # ColumnParallel(gather_output=True) on the fused QKV
            ("all-gather", MLP): L,  # ... and on the MLP activation
            ("all-reduce", ROW): 1,
            ("all-reduce", 2 * ROW): 1,
        }
    )
    extra_bytes = sum(size * n for (op, size), n in fwd.items() if op == "all-gather")
    assert extra_bytes == L * (QKV + MLP)
    both, _ = census("gather_output", grads=True)
    assert both[("reduce-scatter", QKV)] == both[("reduce-scatter", MLP)] == L
