"""`jaxscale calc inference|serving|kv|prefix|rl`: the serving- and RL-side calculators.

This module wires them, holds `serving` and the flags several of them share (model shape, GPU);
`inference` lives in cli_serving_inference.py, `kv` and `prefix` in cli_serving_kv.py, `rl` in
cli_serving_rl.py and cli_serving_rlhf.py. Nothing here imports jax.
"""

from dataclasses import asdict, dataclass

from jaxscale.calc import inference as inf
from jaxscale.calc import serving as srv
from jaxscale.calc.gpus import GPUS, GpuSpec, get_gpu
from jaxscale.calc.kv import kv_bytes_per_token
from jaxscale.calc.models import MODELS, get_model
from jaxscale.calc.training_format import (
    add_output_flags,
    emit,
    format_count,
    format_table,
    guarded,
    mode_line,
    parse_count,
    positive_float,
    positive_int,
)

SERVING_FAITHFUL = "seed 001 L1176-1275: one unbatched request per GPU"


def add_commands(calc_sub) -> None:
    from jaxscale.calc import cli_serving_inference, cli_serving_kv, cli_serving_rl

    cli_serving_inference.add_parser(calc_sub)
    _add_serving(calc_sub)
    cli_serving_kv.add_parsers(calc_sub)  # kv, prefix
    cli_serving_rl.add_parser(calc_sub)  # rl throughput|memory|timeline|transfer


def record(obj, *properties: str, **extra) -> dict:
    """A frozen dataclass as a JSON-ready dict: its fields, the named properties, and extras."""
    out = asdict(obj)
    out.update({name: getattr(obj, name) for name in properties}, **extra)
    return out


def mode_name(seed_faithful: bool) -> str:
    return "seed-faithful" if seed_faithful else "corrected"


@dataclass(frozen=True)
class Transformer:
    name: str
    n_params: float
    num_layers: int
    d_model: int
    kv_heads: int
    head_dim: int

    def kv_bytes_per_token(self, seed_faithful: bool = False) -> int:
        """Corrected: K/V heads (GQA); seed 001: every d_model channel (L1045)."""
        if seed_faithful:
            return inf.seed_kv_bytes_per_token(self.num_layers, self.d_model)
        return kv_bytes_per_token(self.num_layers, self.kv_heads, self.head_dim)


def add_model_flags(p, default: str = "llama-70b") -> None:
    p.add_argument("--model", default=default, choices=list(MODELS), help=f"default {default}")
    p.add_argument("--params", type=parse_count, help="override the parameter count, e.g. 70B")
    p.add_argument("--layers", type=positive_int, help="override the number of layers")
    p.add_argument("--d-model", type=positive_int, help="override the hidden size")
    p.add_argument("--kv-heads", type=positive_int, help="override the K/V heads (GQA)")
    p.add_argument("--head-dim", type=positive_int, help="override the head dimension")


def model_from_args(args) -> Transformer:
    m = get_model(args.model)
    return Transformer(
        m.name,
        args.params or m.n_params,
        args.layers or m.n_layers,
        args.d_model or m.d_model,
        args.kv_heads or m.n_kv_heads,
        args.head_dim or m.head_dim,
    )


def add_gpu_flags(p) -> None:
    p.add_argument("--gpu", default="h100", choices=list(GPUS), help="default h100")
    p.add_argument("--gpu-tflops", type=positive_float, help="override the peak dense TFLOP/s")
    p.add_argument("--hbm-tbs", type=positive_float, help="override the memory bandwidth, TB/s")


def gpu_from_args(args) -> GpuSpec:
    g = get_gpu(args.gpu)
    spec = GpuSpec(
        g.name, g.memory_gb, args.gpu_tflops or g.bf16_tflops, args.hbm_tbs or g.hbm_tb_s
    )
    if spec.bf16_tflops is None or spec.hbm_tb_s is None:
        raise ValueError(
            f"the seeds give no FLOP/s or bandwidth for {g.name}: pass --gpu-tflops and --hbm-tbs"
        )
    return spec


def header(model: Transformer, gpu: GpuSpec) -> str:
    return (
        f"{model.name} ({format_count(model.n_params)} params) on {gpu.name} "
        f"({gpu.bf16_tflops:g} TFLOPS, {gpu.hbm_tb_s:g} TB/s)"
    )


# ------------------------------------------------------------------------------------ serving
def _add_serving(calc_sub) -> None:
    p = calc_sub.add_parser(
        "serving",
        help="GPUs to serve a load at a latency target (seed 001)",
        description="GPUs needed for users x requests/s at a per-request latency target. "
        "Without --users it prints the seed's three load scenarios.",
    )
    add_model_flags(p)
    add_gpu_flags(p)
    p.add_argument("--users", type=positive_int, help="concurrent users")
    p.add_argument(
        "--rps-per-user",
        type=positive_float,
        default=0.01,
        help="requests per second per user, with --users (default 0.01)",
    )
    p.add_argument("--prompt-len", type=positive_int, default=srv.SEED_PROMPT_LEN)
    p.add_argument("--gen-len", type=positive_int, default=srv.SEED_GEN_LEN)
    p.add_argument("--target-latency-ms", type=positive_float, default=1000.0)
    add_output_flags(p, faithful=True)
    p.set_defaults(func=guarded(_run_serving))


def _run_serving(args) -> int:
    model, gpu, sf = model_from_args(args), gpu_from_args(args), args.seed_faithful
    kv_tok = model.kv_bytes_per_token(sf)
    loads = (
        [("Custom", args.users, args.rps_per_user)] if args.users else list(srv.SEED_LOAD_SCENARIOS)
    )
    common = dict(
        kv_bytes_per_token=kv_tok,
        gpu_memory_bytes=gpu.memory_gb * 1e9,
        flops_per_s=gpu.flops_per_s,
        hbm_bytes_per_s=gpu.hbm_bytes_per_s,
    )
    target_s = args.target_latency_ms / 1e3
    rows, out = [], []
    for name, users, per_user in loads:
        rps = users * per_user
        head = [name, f"{users:,}", f"{per_user:g}", f"{rps:.1f}"]
        load = {"scenario": name, "users": users}
        if sf:
            e = srv.seed_serving_estimate(
                model.n_params, rps, args.prompt_len, args.gen_len, target_s, **common
            )
            latency_ms = f"{e.single_request_latency_s * 1e3:.1f}"
            rows.append(head + [f"{e.requests_per_gpu:.2f}", e.gpus_needed, latency_ms])
            out.append(record(e, **load))
            continue
        plan = srv.plan_serving(
            model.n_params, rps, args.prompt_len, args.gen_len, target_s, **common
        )
        if plan is None:
            rows.append(head + ["-"] * 5 + ["no tp <= 8 meets the target"])
            out.append({**load, "total_rps": rps, "gpus": None})
            continue
        cells = [plan.tp, plan.batch_per_replica, f"{plan.request_latency_s * 1e3:.1f}"]
        cells += [f"{plan.rps_per_replica:.1f}", plan.replicas, plan.gpus]
        rows.append(head + cells)
        out.append(record(plan, "rps_per_replica", "gpus", **load))
    heads = ["Scenario", "Users", "RPS/user", "Total RPS"]
    if sf:
        heads += ["Req/GPU", "GPUs", "Latency ms"]
    else:
        heads += ["TP", "Batch", "Latency ms", "RPS/replica", "Replicas", "GPUs"]
    lines = [
        f"Serving {header(model, gpu)}: prompt {args.prompt_len}, generate {args.gen_len}, "
        f"target {args.target_latency_ms:g} ms per request",
        mode_line(sf, SERVING_FAITHFUL),
        "",
        format_table(heads, rows),
    ]
    if not sf:
        lines.append(
            "replica = tp GPUs holding the weights; batch = largest that meets the "
            "target and fits; ideal TP, no queueing"
        )
    report = {
        "command": "serving",
        "mode": mode_name(sf),
        "model": model.name,
        "gpu": gpu.name,
        "prompt_len": args.prompt_len,
        "gen_len": args.gen_len,
        "target_latency_s": target_s,
        "scenarios": out,
    }
    emit(args, report, lines)
    return 0
