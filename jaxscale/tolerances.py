"""Every tolerance jaxscale checks against, stated once (docs/architecture.md, "One harness, one
reference, one list"). verify, the bench and the tests import them from here; none is ever loosened
to make a check pass.
"""

# f32 strategies vs the single-device reference: first-step loss and every gradient leaf,
# |got - want| <= ATOL + RTOL * |want| elementwise (chex.assert_trees_all_close's rule).
RTOL, ATOL = 1e-5, 1e-6
# A trajectory with real updates (losses and final parameters, absolute), and its pre-clip
# gradient norms (relative: the norm is what exposes a gradient-scale bug that Adam's
# normalisation and clipping would hide from the losses).
TRAJ_ATOL = 1e-4
TRAJ_NORM_RTOL = 1e-4

# bf16 compute vs the f32 reference (bf16 keeps about 3 significant digits, and a sharded
# program sums partial products in another order): loss relative, each gradient leaf relative
# to its largest entry, trajectory absolute, gradient norms relative.
BF16_LOSS_RTOL, BF16_GRAD_RTOL, BF16_TRAJ_ATOL, BF16_NORM_RTOL = 2e-2, 2e-2, 1e-2, 2e-2
# bf16 vs a bf16 reference on one device: the same arithmetic in another summation order. Each
# gradient element's error against the f32 model may exceed the one-device bf16 run's own error
# by this band (jaxscale/verify.py `_ratio`).
BF16_SAME_RTOL, BF16_SAME_ATOL = 1e-2, 1e-3

# Predictions vs the compiled program.
MEMORY_RTOL = 0.02  # state and argument bytes per device vs the calculators
COMM_RTOL = 0.05  # collective bytes per op vs the axis modules' predictions (normalised census)
FLOPS_RTOL = 0.05  # analytic forward matmul FLOPs vs cost_analysis (layers unrolled)

# RL (jaxscale/rl): CartPole vs gymnasium's float64 step from the same float32 state (absolute,
# per state component); GAE's scan vs a float64 loop; the seed's GAE table (printed to 4
# decimals); the data-parallel run vs the single-device one (parameters and per-update metrics
# after a few updates with sampled actions, so any real difference shows up as a different
# trajectory, not a rounding error).
RL_ENV_ATOL = 1e-6
RL_GAE_ATOL = 1e-5
SEED_TABLE_ATOL = 1e-4
RL_DP_ATOL = 1e-5

# An int8 KV cache vs the model whose attention reads int8-rounded keys and values: equal but for
# a key or value lying within float rounding of a rounding boundary (the cached and uncached
# paths compute it in another summation order), which moves that element by one step of its
# scale. The largest logit difference from the oracle stays under this fraction of the largest
# difference int8 rounding itself makes (rounded model vs full precision): one such flip measured
# 0.07 of it; no rounding at all, or a coarser one, gives 1 or more.
INT8_KV_FRACTION = 0.2
