"""`jaxscale bench collectives`: latency and bus bandwidth of jitted collectives over message
sizes, an alpha-beta fit, and the census check that each variant moves the bytes it should
(seed 002 ch4 benchmark_algorithms.py).

Message size D is one device's buffer in the census convention (`jaxscale.analysis.hlo`): the
psum operand, the all_gather OUTPUT, the psum_scatter INPUT. Bus bandwidth follows NCCL
(`jaxscale.calc.comm.bus_bandwidth`; all-reduce 2(N-1)/N, as the seed's script). The fit is
t = alpha + bus_bytes / busbw per variant, least squares on relative error so small and large
messages count alike.

On CPU the "devices" share the host's cores and a collective is a memory copy: the numbers are
indicative, and say nothing about interconnects (the output says so).
"""

import json
import re
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from jaxscale.bench.collective_plots import plot_measurements
from jaxscale.calc import comm
from jaxscale.cliutil import fail, non_negative_int, positive_float, positive_int
from jaxscale.render import fmt_bytes

VARIANTS = ("psum", "all_gather", "psum_scatter", "all_to_all", "ppermute", "ring")
COLLECTIVE_OF = {  # variant -> (collective for busbw, HLO op the census must find)
    "psum": ("all-reduce", "all-reduce"),
    "all_gather": ("all-gather", "all-gather"),
    "psum_scatter": ("reduce-scatter", "reduce-scatter"),
    "all_to_all": ("all-to-all", "all-to-all"),
    "ppermute": ("collective-permute", "collective-permute"),
    "ring": ("all-reduce", "collective-permute"),
}
_UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "M": 2**20, "MB": 2**20, "G": 2**30, "GB": 2**30}


@dataclass(frozen=True)
class Row:
    variant: str
    size_bytes: int
    latency_s: float  # median of the timed calls
    algbw_Bps: float
    busbw_Bps: float
    census: str  # e.g. "14 x collective-permute 4.0 KB"
    census_ok: bool


@dataclass(frozen=True)
class Fit:
    variant: str
    alpha_s: float
    busbw_Bps: float  # 1 / beta
    r2: float  # on log latency


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?B?)\s*", text.upper())
    if not m:
        raise ValueError(f"cannot read size {text!r}; use e.g. 1K, 64M, 4096")
    size = int(float(m.group(1)) * _UNITS[m.group(2)])
    if size <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return size


def parse_sizes(text: str) -> list[int]:
    """'1K:64M' = powers of 4 from 1K to 64M; '1K,1M,64M' = exactly those."""
    if ":" in text:
        lo, hi = (parse_size(t) for t in text.split(":", 1))
        if hi < lo:
            raise ValueError(f"size range {text!r} runs backwards")
        sizes, s = [], lo
        while s <= hi:
            sizes.append(s)
            s *= 4
        return sizes
    return [parse_size(t) for t in text.split(",") if t.strip()]


def format_bytes(size: float) -> str:
    """Binary units (KiB, MiB, ...): message sizes here are powers of two."""
    return fmt_bytes(size, binary=True)


def _program(variant: str, n: int, size_bytes: int):
    """(jitted shard_map program, global input length, expected census) for one variant."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import AxisType
    from jax.sharding import PartitionSpec as P

    from jaxscale.parallel import collectives

    mesh = jax.make_mesh((n,), ("x",), axis_types=(AxisType.Auto,), devices=jax.devices()[:n])
    elems = max(n * n, (size_bytes // 4) // (n * n) * (n * n))  # divisible for every variant
    d = elems * 4  # the buffer actually measured
    bodies = {
        "psum": (lambda a: jax.lax.psum(a, "x"), n * elems, [("all-reduce", d)]),
        "all_gather": (
            lambda a: jax.lax.all_gather(a, "x", tiled=True),
            elems,
            [("all-gather", d)],
        ),
        "psum_scatter": (
            lambda a: jax.lax.psum_scatter(a, "x", tiled=True),
            n * elems,
            [("reduce-scatter", d)],
        ),
        "all_to_all": (
            lambda a: jax.lax.all_to_all(a, "x", 0, 0, tiled=True),
            n * elems,
            [("all-to-all", d)],
        ),
        "ppermute": (
            lambda a: jax.lax.ppermute(a, "x", [(i, (i + 1) % n) for i in range(n)]),
            n * elems,
            [("collective-permute", d)],
        ),
        "ring": (
            lambda a: collectives.ring_all_reduce(a, "x"),
            n * elems,
            [("collective-permute", d / n)] * (2 * (n - 1)),
        ),
    }
    body, length, expected = bodies[variant]
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    make = jax.jit(
        lambda: jnp.ones((length,), jnp.float32),
        out_shardings=jax.NamedSharding(mesh, P("x")),
    )
    return f, make, d, expected


def measure(
    variant: str, n: int, size_bytes: int, repeats: int, warmup: int, budget_s: float | None = 1.0
) -> Row:
    """Median of up to `repeats` timed calls, stopping early once `budget_s` is spent (big
    messages on CPU take seconds; one timed call is the minimum). budget_s=None: exactly
    `repeats` calls, which several processes need (each must make the same collective calls)."""
    import jax

    from jaxscale.analysis import hlo

    f, make, d, expected = _program(variant, n, size_bytes)
    x = make()
    compiled = f.lower(x).compile()
    found = [(c.op, c.bytes_per_device) for c in hlo.normalize(hlo.collectives_of(compiled))]
    ok = sorted(found) == sorted(expected)
    counts = {}
    for op, b in found:
        counts[(op, b)] = counts.get((op, b), 0) + 1
    census = "; ".join(f"{k} x {op} {format_bytes(b)}" for (op, b), k in counts.items()) or "none"
    for _ in range(warmup):
        jax.block_until_ready(compiled(x))
    times = []
    while len(times) < repeats and (not times or budget_s is None or sum(times) < budget_s):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(x))
        times.append(time.perf_counter() - t0)
    latency = statistics.median(times)
    collective = COLLECTIVE_OF[variant][0]
    busbw = comm.bus_bandwidth(collective, d, latency, n)
    return Row(variant, d, latency, d / latency, busbw, census, ok)


def fit_alpha_beta(rows: list[Row], n: int) -> Fit:
    """t = alpha + beta * bus_bytes; minimise relative error (weights 1/t)."""
    collective = COLLECTIVE_OF[rows[0].variant][0]
    t = np.array([r.latency_s for r in rows])
    bus_bytes = np.array([comm.bus_bandwidth(collective, r.size_bytes, 1.0, n) for r in rows])
    a = np.stack([1 / t, bus_bytes / t], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    pred = np.maximum(alpha + beta * bus_bytes, 1e-12)
    resid = np.log(t) - np.log(pred)
    total = np.log(t) - np.log(t).mean()
    r2 = 1 - float(resid @ resid) / float(total @ total) if len(t) > 1 and total.any() else 1.0
    return Fit(rows[0].variant, float(alpha), float(1 / beta) if beta > 0 else float("inf"), r2)


def add_arguments(parser) -> None:
    """Flags of this suite (the mesh bench owns --json, --out, --model and friends)."""
    parser.add_argument(
        "--sizes",
        default="1K:64M",
        help="message sizes per device: 'A:B' powers of 4 from A to B, or a list '1K,1M' "
        "(default 1K:64M)",
    )
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=5,
        help="timed calls per size, median reported (default 5)",
    )
    parser.add_argument(
        "--warmup", type=non_negative_int, default=1, help="untimed calls per size (default 1)"
    )
    parser.add_argument(
        "--budget-s",
        type=positive_float,
        default=1.0,
        help="stop timing a size after this many seconds (default 1)",
    )
    parser.add_argument(
        "--ops", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)} (default: all)"
    )


def _validate(args) -> tuple[list[int], list[str]]:
    try:
        sizes = parse_sizes(args.sizes)
    except ValueError as e:
        raise ValueError(f"--sizes {args.sizes!r}: {e}") from None
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = [o for o in ops if o not in VARIANTS]
    if bad or not ops:
        raise ValueError(f"unknown --ops {', '.join(bad) or '(none)'}; choose from {VARIANTS}")
    if not sizes:
        raise ValueError("--sizes names no size")
    if max(sizes) > 1 << 30:
        raise ValueError(f"--sizes: at most 1 GiB per device, got {format_bytes(max(sizes))}")
    return sizes, ops


def main(args, dry_run: bool = False) -> int:
    try:
        sizes, ops = _validate(args)
    except ValueError as e:
        return fail("bench collectives", e)
    if dry_run:
        print(f"ops {', '.join(ops)}; sizes {', '.join(format_bytes(s) for s in sizes)}")
        return 0
    from jaxscale.launch import maybe_initialize_distributed

    maybe_initialize_distributed()  # under `jaxscale launch`: measure across processes
    import jax

    n = jax.device_count()
    platform = jax.default_backend()
    if n < 2:  # XLA drops collectives over one device: nothing to measure
        return fail(
            "bench collectives",
            f"needs at least 2 devices, {platform} has {n} (on CPU set JAX_NUM_CPU_DEVICES=8)",
        )
    budget = args.budget_s if jax.process_count() == 1 else None
    rows = [measure(op, n, s, args.repeats, args.warmup, budget) for op in ops for s in sizes]
    fits = [fit_alpha_beta([r for r in rows if r.variant == op], n) for op in ops]
    if jax.process_index() != 0:  # every process measured; one reports
        return 0
    plot = plot_measurements(rows, fits, n, args.plot) if args.plot else None
    census_ok = all(r.census_ok for r in rows)
    note = f"{platform}: {n} devices; " + (
        "simulated CPU devices share the host's cores: collectives are host-memory copies, "
        "timings are indicative only"
        if platform == "cpu"
        else "real devices"
    )
    report = {
        "platform": platform,
        "devices": n,
        "note": note,
        "census_ok": census_ok,
        "rows": [asdict(r) for r in rows],
        "fits": [asdict(f) for f in fits],
        "plot": plot,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_collectives.json").write_text(json.dumps(report, indent=1))
    if getattr(args, "json", False):
        print(json.dumps(report))
    else:
        print(format_report(rows, fits, note, plot) + f"\nwrote {out / 'bench_collectives.json'}")
    return 0 if census_ok else 1


def format_report(rows: list[Row], fits: list[Fit], note: str, plot: str | None) -> str:
    lines = [note, ""]
    head = f"{'variant':<13}{'size':>10}{'latency ms':>12}{'algbw GB/s':>12}{'busbw GB/s':>12}"
    lines.append(head + "  census (bytes per device)")
    for r in rows:
        lines.append(
            f"{r.variant:<13}{format_bytes(r.size_bytes):>10}{r.latency_s * 1e3:>12.3f}"
            f"{r.algbw_Bps / 1e9:>12.2f}{r.busbw_Bps / 1e9:>12.2f}  "
            f"{'ok' if r.census_ok else 'MISMATCH'}: {r.census}"
        )
    lines += ["", "alpha-beta fit  t = alpha + bus_bytes / busbw  (per call, dispatch included)"]
    lines.append(f"{'variant':<13}{'alpha us':>10}{'busbw GB/s':>12}{'R^2 (log t)':>13}")
    for f in fits:
        lines.append(
            f"{f.variant:<13}{f.alpha_s * 1e6:>10.1f}{f.busbw_Bps / 1e9:>12.2f}{f.r2:>13.3f}"
        )
    if plot:
        lines.append(f"\nplot: {plot}")
    return "\n".join(lines)
