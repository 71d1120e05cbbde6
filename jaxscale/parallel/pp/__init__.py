"""The pipe axis by hand: a static pipeline schedule executed in one jitted SPMD program.

A stage is a contiguous slice of the stacked layers (`layers` -> `pipe` in the rules table): with
P devices on the pipe axis and v virtual stages per device, virtual stage j = chunk * P + device
holds layers [j L/(vP), (j+1) L/(vP)), so device d stores [L/P] layers as v chunks. The embedding
runs inside the first virtual stage and the final norm, unembedding and loss inside the last, so
the microbatch's tokens are all the first stage needs and a scalar loss is what the last makes.
Their parameters are replicated over `pipe` (only the first / last stage touches them) and their
gradients are summed over `pipe` after the schedule: one all-reduce.

  plan.py      the host side: the simulator's grid as a static program (`make_plan`, `Plan`)
  execute.py   the device side: `accumulate` runs a plan's ticks (`lax.switch`, `ppermute`,
               the steady state as one `lax.scan`)
  circular.py  the interleaved schedule's circular layout (`circular_shard_map`)
"""

from jaxscale.parallel.pp.circular import circular_shard_map
from jaxscale.parallel.pp.execute import accumulate
from jaxscale.parallel.pp.plan import (
    AXIS,
    FIRST,
    LAST,
    MID,
    ROLES,
    Op,
    Plan,
    Segment,
    Tick,
    activation,
    check_layers,
    forward_plan,
    make_plan,
    pieces,
    predict_comm,
    tick_data,
    tick_shape,
)

__all__ = [
    "AXIS",
    "FIRST",
    "LAST",
    "MID",
    "ROLES",
    "Op",
    "Plan",
    "Segment",
    "Tick",
    "accumulate",
    "activation",
    "check_layers",
    "circular_shard_map",
    "forward_plan",
    "make_plan",
    "pieces",
    "predict_comm",
    "tick_data",
    "tick_shape",
]
