"""`jaxscale calc serving`: GPUs to serve a load at a latency target (seed 001 §9,
`estimate_serving_gpus`). Nothing here imports jax."""

from jaxscale.calc import serving as srv
from jaxscale.calc.commands.common import (
    add_gpu_flags,
    add_model_flags,
    gpu_from_args,
    header,
    kv_bytes_per_token,
    model_from_args,
    ms,
    record,
)
from jaxscale.cliutil import add_command, add_output_flags, guarded, positive_float, positive_int
from jaxscale.render import Col, Report

SERVING_FAITHFUL = "seed 001 §9: one unbatched request per GPU"
NO_PLAN = "no tp <= 8 meets the target"


def add_parser(calc_sub) -> None:
    p = add_command(
        calc_sub,
        "serving",
        help="GPUs to serve a load at a latency target (seed 001)",
        description="GPUs needed for users x requests/s at a per-request latency target. "
        "Without --users it prints the seed's three load scenarios.",
        example="jaxscale calc serving --model llama-70b --users 1000 --rps-per-user 0.1",
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
    p.add_argument(
        "--prompt-len",
        type=positive_int,
        default=srv.SEED_PROMPT_LEN,
        help="prompt tokens per request",
    )
    p.add_argument(
        "--gen-len",
        type=positive_int,
        default=srv.SEED_GEN_LEN,
        help="generated tokens per request",
    )
    p.add_argument(
        "--target-latency-ms",
        type=positive_float,
        default=1000.0,
        help="latency target per request",
    )
    add_output_flags(p, faithful=True)
    p.set_defaults(func=guarded(run))


LOAD_COLS = [
    Col("scenario", "Scenario"),
    Col("users", "Users", ","),
    Col("rps_per_user", "RPS/user", "g"),
    Col("total_rps", "Total RPS", ".1f"),
]
SEED_COLS = [
    Col("requests_per_gpu", "Req/GPU", ".2f"),
    Col("gpus_needed", "GPUs"),
    Col("single_request_latency_s", "Latency ms", ms),
]
PLAN_COLS = [
    Col("tp", "TP"),
    Col("batch_per_replica", "Batch"),
    Col("request_latency_s", "Latency ms", ms),
    Col("rps_per_replica", "RPS/replica", ".1f"),
    Col("replicas", "Replicas"),
    Col("gpus", "GPUs"),
]


def run(args) -> int:
    model, gpu, sf = model_from_args(args), gpu_from_args(args), args.seed_faithful
    loads = [("Custom", args.users, args.rps_per_user)] if args.users else srv.SEED_LOAD_SCENARIOS
    common = dict(
        kv_bytes_per_token=kv_bytes_per_token(model, sf),
        gpu_memory_bytes=gpu.memory_bytes,
        flops_per_s=gpu.flops_per_s,
        hbm_bytes_per_s=gpu.hbm_bytes_per_s,
    )
    shape = (args.prompt_len, args.gen_len, args.target_latency_ms / 1e3)
    rows = []
    for name, users, per_user in loads:
        load = {"scenario": name, "users": users, "rps_per_user": per_user}
        if sf:
            e = srv.seed_serving_estimate(model.n_params, users * per_user, *shape, **common)
            rows.append(record(e, **load))
        elif plan := srv.plan_serving(model.n_params, users * per_user, *shape, **common):
            rows.append(record(plan, "rps_per_replica", "gpus", **load))
        else:
            rows.append({**load, "total_rps": users * per_user, "gpus": None})
    r = Report("serving")
    r.say(
        f"Serving {header(model, gpu)}: prompt {args.prompt_len}, generate {args.gen_len}, "
        f"target {args.target_latency_ms:g} ms per request"
    )
    r.mode(sf, SERVING_FAITHFUL).say("")
    r.put(
        model=model.name,
        gpu=gpu.name,
        prompt_len=args.prompt_len,
        gen_len=args.gen_len,
        target_latency_s=shape[2],
        scenarios=rows,
    )
    shown = rows if sf else [{**row, "gpus": row["gpus"] or NO_PLAN} for row in rows]
    r.table(None, LOAD_COLS + (SEED_COLS if sf else PLAN_COLS), shown)
    if not sf:
        r.say(
            "replica = tp GPUs holding the weights; batch = largest that meets the target and "
            "fits; ideal TP, no queueing"
        )
    r.emit(args)
    return 0
