"""`loop_cost` counts every trip of a loop: a scan of matmuls costs what the same matmuls
unrolled cost (XLA's own cost_analysis counts the body once)."""

import jax
import jax.numpy as jnp
import pytest

from jaxscale.analysis.loop_cost import loop_cost


def _chain(unroll):
    def f(x_D, ws_LDD):
        def body(x_D, w_DD):
            return jnp.tanh(w_DD @ x_D), None

        return jax.lax.scan(body, x_D, ws_LDD, unroll=unroll)[0]

    args = (jnp.ones((64,)), jnp.ones((6, 64, 64)))
    return jax.jit(f).lower(*args).compile()


def test_a_scan_costs_its_unrolled_programs_flops():
    scanned, unrolled = _chain(1), _chain(6)
    flops = 2 * 6 * 64 * 64  # six [64, 64] x [64] products
    assert scanned.cost_analysis()["flops"] < flops / 2  # XLA: one body
    assert loop_cost(scanned)["flops"] == pytest.approx(flops, rel=0.05)
    assert loop_cost(unrolled)["flops"] == pytest.approx(flops, rel=0.05)


def test_a_program_with_donated_inputs_is_costed_the_same():
    """A training step donates its state: the module's input/output aliases name the entry's
    outputs (here six), not a loop body's (three), so they must not follow the body when the
    body is costed alone."""

    def f(x_D, ws_LDD, *rest_D):
        def body(x_D, w_DD):
            return jnp.tanh(w_DD @ x_D), None

        return jax.lax.scan(body, x_D, ws_LDD)[0], *(r + 1 for r in rest_D)

    args = (jnp.ones((64,)), jnp.ones((6, 64, 64)), *[jnp.ones((64,))] * 5)
    kept = jax.jit(f).lower(*args).compile()
    donated = jax.jit(f, donate_argnums=(0, 2, 3, 4, 5, 6)).lower(*args).compile()
    assert "input_output_alias" in donated.as_text()
    assert loop_cost(donated)["flops"] == pytest.approx(loop_cost(kept)["flops"], rel=1e-6)


def test_nested_loops_are_refused():
    def f(x_D, ws_LDD):
        def inner(x_D, w_DD):
            return jax.lax.scan(lambda y, w: (jnp.tanh(w @ y), None), x_D, ws_LDD)[0], None

        return jax.lax.scan(inner, x_D, ws_LDD)[0]

    args = (jnp.ones((64,)), jnp.ones((6, 64, 64)))
    with pytest.raises(ValueError, match="nested"):
        loop_cost(jax.jit(f).lower(*args).compile())
