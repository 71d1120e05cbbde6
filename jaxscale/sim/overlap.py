"""CPU overhead vs GPU work on a virtual clock (seed 002 ch10, scheduling and CUDA graphs).

Scheduling overhead (`scheduling_overhead_benchmark.py`): each batch needs CPU
scheduling S, GPU compute C and CPU postprocessing P. The seed sleeps and measures (271 vs 233 ms
in its run); its ideal figures are sequential N(S+C+P) = 260 ms and overlapped
(S+C+P) + (N-1)(max(C, S)+P) = 222 ms for N=20, S=2, C=10, P=1. Here each is an event
simulation on `jaxscale.sim.timeline` with one CPU and one GPU:
  sequential  S_n -> C_n -> P_n -> S_{n+1}
  overlap     S_{n+1} runs during C_n, but C_{n+1} waits for P_n (the next batch's inputs are
              the previous batch's sampled tokens): the seed's model, 222 ms
  futuremap   C_{n+1} needs only S_{n+1}: outputs stay on the device as placeholders that the
              next batch reads (SGLang's FutureMap, ch10 "Zero-Overhead Scheduling"), so P_n
              also overlaps: 203 ms (S + N*C + P whenever C >= S + P)
The "overlap" simulation reproduces the seed's formula for every S, C, P and N.

Launch overhead (`cuda_graph_simple.py --force-cpu`, its `run_simulation`): K kernels per
iteration, each launched by the CPU (L ms) before it runs. The seed's model adds launch and compute:
1000 x (5 x 0.05 + 0.5) = 750 ms normally, 1000 x (0.05 + 0.5) = 550 ms replaying one graph
(1.36x). "async" is an extra row: launches that don't wait for the previous kernel (JAX's async
dispatch), which hide launch cost whenever a kernel outlasts a launch.
"""

from dataclasses import dataclass

from jaxscale.checks import positive_fields
from jaxscale.sim import timeline
from jaxscale.sim.timeline import Op

SCHEDULING_MODES = ("sequential", "overlap", "futuremap")
LAUNCH_MODES = ("eager", "graph", "async")


@dataclass(frozen=True)
class SchedulingConfig:
    batches: int = 20  # --batches/-b
    scheduling_ms: float = 2.0  # S, CPU
    compute_ms: float = 10.0  # C, GPU
    postprocess_ms: float = 1.0  # P, CPU

    def validate(self) -> None:
        positive_fields(self, "batches", "scheduling_ms", "compute_ms", "postprocess_ms")


@dataclass(frozen=True)
class LaunchConfig:
    iterations: int = 1000
    kernels: int = 5  # Linear, ReLU, Linear, ReLU, Linear
    launch_ms: float = 0.05  # per launch
    compute_ms: float = 0.5  # GPU time per iteration, split evenly over the kernels

    def validate(self) -> None:
        positive_fields(self, "iterations", "kernels", "launch_ms", "compute_ms")


def scheduling_orders(cfg: SchedulingConfig, mode: str) -> dict[str, list[Op]]:
    cfg.validate()
    if mode not in SCHEDULING_MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {SCHEDULING_MODES}")
    n = cfg.batches
    sched = [Op(("S", i), "cpu", cfg.scheduling_ms, (), "S") for i in range(n)]
    post = [Op(("P", i), "cpu", cfg.postprocess_ms, (("C", i),), "P") for i in range(n)]
    gpu = []
    for i in range(n):
        deps = (("S", i),)
        if mode == "overlap" and i > 0:
            deps += (("P", i - 1),)
        gpu.append(Op(("C", i), "gpu", cfg.compute_ms, deps, "C"))
    if mode == "sequential":
        cpu = [op for i in range(n) for op in (sched[i], post[i])]
    else:
        # The seed's "Complete Overlap Scheduler": schedule next, launch it, process previous.
        cpu = [sched[0]]
        for i in range(n):
            cpu += ([sched[i + 1]] if i + 1 < n else []) + [post[i]]
    return {"cpu": cpu, "gpu": gpu}


def simulate_scheduling(cfg: SchedulingConfig, mode: str) -> dict:
    return timeline.run(scheduling_orders(cfg, mode))


def seed_ideal_ms(cfg: SchedulingConfig) -> dict[str, float]:
    """The seed's ideal totals (what its sleeps aim at): 260 and 222 ms at the defaults."""
    s, c, p, n = cfg.scheduling_ms, cfg.compute_ms, cfg.postprocess_ms, cfg.batches
    return {"sequential": n * (s + c + p), "overlap": (s + c + p) + (n - 1) * (max(c, s) + p)}


def scheduling_analysis(cfg: SchedulingConfig) -> dict[str, float]:
    """The seed's ANALYSIS block (its main): 23.1% overhead, 1.0 ms effective, 67% reduction."""
    s, c, p = cfg.scheduling_ms, cfg.compute_ms, cfg.postprocess_ms
    return {
        "overhead_fraction": (s + p) / (s + c + p),
        "effective_overhead_ms": p,
        "overhead_reduction": s / (s + p),
    }


def launch_orders(cfg: LaunchConfig, mode: str) -> dict[str, list[Op]]:
    cfg.validate()
    if mode not in LAUNCH_MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {LAUNCH_MODES}")
    kernel_ms = cfg.compute_ms / cfg.kernels
    cpu, gpu = [], []
    prev_kernel = None
    for it in range(cfg.iterations):
        for k in range(cfg.kernels):
            if mode != "graph" or k == 0:
                # eager/graph: the seed's additive model, the host waits for the previous kernel.
                wait = (prev_kernel,) if prev_kernel and mode != "async" else ()
                cpu.append(Op(("L", it, k), "cpu", cfg.launch_ms, wait, "L"))
            launch = ("L", it, k if mode != "graph" else 0)
            gpu.append(Op(("K", it, k), "gpu", kernel_ms, (launch,), "K"))
            prev_kernel = ("K", it, k)
    return {"cpu": cpu, "gpu": gpu}


def simulate_launch(cfg: LaunchConfig, mode: str) -> dict:
    return timeline.run(launch_orders(cfg, mode))


def launch_overhead_per_iteration_ms(cfg: LaunchConfig, mode: str) -> float:
    """CPU launch time per iteration in the seed's model: K launches, or one graph launch."""
    return cfg.launch_ms * (1 if mode == "graph" else cfg.kernels)


def bars(spans: dict, end: float, chars_per_ms: float) -> dict[str, str]:
    """CPU and GPU bars up to `end` ms (2 chars/ms in the seed's visualize_timeline)."""
    rows = timeline.by_resource(spans)
    return {
        r: timeline.render_bars([s for s in rows[r] if s.start < end], end, chars_per_ms)
        for r in ("cpu", "gpu")
    }
