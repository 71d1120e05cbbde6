"""Every difference between the supported jax lines, one shim each (pyproject.toml states the
tested ranges: Python 3.11 resolves jax 0.10.x; Python >= 3.12 resolves jax 0.12.x, what Colab
runs; a GPU image with jax 0.11.2 ran the suite too, docs/hardware.md). CI runs the whole suite
on both lines. Code elsewhere calls these instead of testing versions.

One difference needs no shim, only a rule: pass `jax.make_mesh` its shape and axis names
positionally (the first keyword was renamed between jax 0.10 and 0.12)."""

from __future__ import annotations


def cost_analysis(compiled) -> dict:
    """A compiled program's cost dict: older jax returned a list with one dict per program."""
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, list):
        cost = cost[0] if cost else {}
    return cost


def varying_axes(aval) -> frozenset:
    """The manual (shard_map) axes a value varies over: jax 0.10-0.12 keep them in the aval's
    `manual_axis_type.varying`; later lines in `vma`."""
    mat = getattr(aval, "manual_axis_type", None)
    return frozenset(mat.varying) if mat is not None else frozenset(getattr(aval, "vma", ()))


def fast_compile_xla_flags() -> str:
    """XLA flags that make XLA:CPU compile faster where the installed line has them (read
    before jax starts its backend: call this without importing jax). jaxlib 0.10's XLA:CPU
    generates kernels with its MLIR fusion emitters by default; its older elemental emitters
    compile a typical training step in about 40% of the time at the test suite's optimisation
    level (the same HLO, the same collectives and memory figures). Later lines have only the
    MLIR emitters, and refuse the flag."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = (int(p) for p in version("jaxlib").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return ""
    return "--xla_cpu_use_fusion_emitters=false" if (major, minor) == (0, 10) else ""


def use_fast_compile_xla_flags() -> None:
    """Add `fast_compile_xla_flags()` to XLA_FLAGS (process edges: the CLI, the test session),
    unless the user's XLA_FLAGS already choose the emitters. Read when jax starts its backend,
    so call it before; the environment carries it into child processes."""
    import os

    flags, fast = os.environ.get("XLA_FLAGS", ""), fast_compile_xla_flags()
    if fast and "xla_cpu_use_fusion_emitters" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {fast}".strip()


def pipeline_compiler_options() -> dict:
    """`jax.jit` compiler options for a pipeline schedule's programs: XLA's default emitters
    where `use_fast_compile_xla_flags` chose the older ones for the process. The older emitters
    set up each kernel with a walk over every computation of the module, and a schedule's
    step holds a conditional per tick, each with its branches: at pp=8 the older emitters take
    26 s to the MLIR emitters' 17 s (docs/testing.md), where a plain step compiles 3x faster
    with them. Empty elsewhere (the flag is the user's, or the line has only MLIR emitters)."""
    import os

    fast = fast_compile_xla_flags()
    if fast and fast in os.environ.get("XLA_FLAGS", "").split():
        return {"xla_cpu_use_fusion_emitters": True}
    return {}
