"""Seed 002 ch1-2 demonstrations in SPMD form: hello, the relay chain, the ring, the even<->odd swap
and a forward-only pipeline (hello_distributed.py; ch2's send_recv_basic.py and
pipeline_simulation.py).

torch's rank-conditional programs (`if rank == 0: send … else: recv …`) become one program on every
device: a `ppermute` names all (source, target) pairs at once and `jnp.where(axis_index == k, …)`
picks each rank's role. Results come back as numpy arrays with one row per rank.
"""

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

AXIS = "x"


def line_mesh(world_size: int) -> jax.sharding.Mesh:
    """A 1-D mesh over the first `world_size` devices (the seed's --world-size)."""
    if world_size < 1 or world_size > jax.device_count():
        raise ValueError(
            f"world size {world_size} needs 1..{jax.device_count()} devices; "
            f"this run sees {jax.device_count()}"
        )
    devices = jax.devices()[:world_size]
    return jax.make_mesh((world_size,), (AXIS,), axis_types=(AxisType.Auto,), devices=devices)


def _per_rank(mesh, body, *args):
    """Run body on every device; each output gets a leading rank dimension."""

    def stacked(*a):
        return jax.tree.map(lambda v: v[None], body(*a))

    specs = tuple(P() for _ in args)
    return jax.jit(jax.shard_map(stacked, mesh=mesh, in_specs=specs, out_specs=P(AXIS)))(*args)


# --- ch1: hello ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    world_size: int
    gathered: np.ndarray  # [W, 2]: row r is rank r's [10r, 10r + 1]
    rank_sum: float  # psum of the ranks
    expected_sum: int  # W (W - 1) / 2

    @property
    def correct(self) -> bool:
        return self.rank_sum == self.expected_sum and np.array_equal(
            self.gathered, 10.0 * np.arange(self.world_size)[:, None] + [0.0, 1.0]
        )


def hello(mesh) -> Hello:
    """all_gather of [10r, 10r+1] and psum of r (seed 002 ch1 hello_distributed.py). Works across
    processes: the outputs are replicated, so every process can read them."""

    def body():
        r = jax.lax.axis_index(AXIS)
        mine = jnp.stack([r * 10, r * 10 + 1]).astype(jnp.float32)
        gathered = jax.lax.all_gather(mine, AXIS, to="invarying")  # stacked [W, 2]
        return gathered, jax.lax.psum(r.astype(jnp.float32), AXIS)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(), out_specs=(P(), P())))
    gathered, total = f()
    w = mesh.shape[AXIS]
    return Hello(w, np.asarray(gathered), float(total), w * (w - 1) // 2)


# --- ch2: point to point ---------------------------------------------------------------------


@dataclass(frozen=True)
class Chain:
    init: float
    add: float
    held: np.ndarray  # [W]: what each rank holds after its turn
    relays: int  # ranks that add: 1 .. W-2 (the source only sends, the sink only receives)

    @property
    def final(self) -> float:
        return float(self.held[-1])

    @property
    def expected(self) -> float:
        """The invariant: init + add x (#relays). (The seed prints init + add x (W-1).)"""
        return self.init + self.add * self.relays

    @property
    def seed_printed_expected(self) -> float:
        return self.init + self.add * (len(self.held) - 1)


def relay_chain(mesh, init: float = 42.0, add: float = 10.0) -> Chain:
    """send_recv_basic.py: rank 0 sends, ranks 1..W-2 receive, add and forward, W-1 receives.

    W-1 hops, each a ppermute with a single (h, h+1) pair, exactly the seed's blocking chain.
    """
    w = mesh.shape[AXIS]
    if w < 2:
        raise ValueError("the chain needs at least 2 ranks (a source and a sink)")

    def body(init_value):
        r = jax.lax.axis_index(AXIS)
        held = jnp.where(r == 0, init_value, jnp.zeros_like(init_value))
        for h in range(w - 1):
            received = jax.lax.ppermute(held, AXIS, [(h, h + 1)])
            relay_add = add if h + 1 < w - 1 else 0.0  # the sink only receives
            held = jnp.where(r == h + 1, received + relay_add, held)
        return held

    held = _per_rank(mesh, body, jnp.float32(init))
    return Chain(init, add, np.asarray(held), relays=w - 2)


def ring_pass(mesh, init: float = 0.0, add: float = 10.0) -> np.ndarray:
    """Ch2 Ex1: the value goes round the ring once (r -> r+1 mod W); every rank except the origin
    adds `add`. Returns what each rank holds; rank 0 ends with init + add x (W-1)."""
    w = mesh.shape[AXIS]

    def body(init_value):
        r = jax.lax.axis_index(AXIS)
        held = jnp.where(r == 0, init_value, jnp.zeros_like(init_value))
        for h in range(w):
            received = jax.lax.ppermute(held, AXIS, [(h, (h + 1) % w)])
            arriving = (h + 1) % w
            held = jnp.where(r == arriving, received + (add if arriving else 0.0), held)
        return held

    return np.asarray(_per_rank(mesh, body, jnp.float32(init)))


def even_odd_swap(mesh) -> tuple[np.ndarray, np.ndarray]:
    """Ch2 Ex2: even ranks send to odd ranks and back at once, one ppermute [(0,1),(1,0),…].

    With blocking sends this pattern deadlocks (see jaxscale.sim.p2p); a ppermute is one global
    exchange and cannot. Returns (sent, received) per rank; rank r receives rank r^1's data.
    """
    w = mesh.shape[AXIS]
    if w % 2:
        raise ValueError(
            f"the even<->odd swap pairs ranks, so it needs an even world size, got {w}"
        )

    def body():
        r = jax.lax.axis_index(AXIS)
        mine = jnp.stack([100 * r, 100 * r + 1]).astype(jnp.float32)
        return mine, jax.lax.ppermute(mine, AXIS, [(i, i ^ 1) for i in range(w)])

    sent, received = _per_rank(mesh, body)
    return np.asarray(sent), np.asarray(received)


def pipeline_forward(mesh, w_SHH, b_SH, x_MBH) -> np.ndarray:
    """pipeline_simulation.py, forward only: stage s = ReLU(x @ W_s + b_s), one stage per rank.

    M + S - 1 ticks: at tick t stage s works on microbatch t - s, then every stage hands its
    activations to s+1 with one ppermute (S - 1 hops per microbatch). Returns [M, B, H] from the
    last stage. Shapes: S stages, M microbatches, B batch, H hidden.
    """
    s_stages = mesh.shape[AXIS]
    m, b, h = x_MBH.shape
    if w_SHH.shape != (s_stages, h, h) or b_SH.shape != (s_stages, h):
        raise ValueError(f"need one [H, H] weight and [H] bias per stage for {s_stages} stages")

    def body(w_1HH, b_1H, xs_MBH):
        r = jax.lax.axis_index(AXIS)
        state_BH = jax.lax.pcast(jnp.zeros((b, h), xs_MBH.dtype), AXIS, to="varying")
        out_MBH = jax.lax.pcast(jnp.zeros((m, b, h), xs_MBH.dtype), AXIS, to="varying")
        for t in range(m + s_stages - 1):
            feed = xs_MBH[t] if t < m else jnp.zeros((b, h), xs_MBH.dtype)
            inp_BH = jnp.where(r == 0, feed, state_BH)
            y_BH = jax.nn.relu(inp_BH @ w_1HH[0] + b_1H[0])
            done = t - (s_stages - 1)  # microbatch leaving the last stage at this tick
            if 0 <= done < m:
                out_MBH = out_MBH.at[done].set(jnp.where(r == s_stages - 1, y_BH, out_MBH[done]))
            state_BH = jax.lax.ppermute(y_BH, AXIS, [(i, i + 1) for i in range(s_stages - 1)])
        return out_MBH[None]

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(AXIS), P(AXIS), P()), out_specs=P(AXIS)))
    return np.asarray(f(w_SHH, b_SH, x_MBH))[-1]
