"""`jaxscale simulate batching`: static vs continuous batching (seed 000 ex. 3, seed 003 L93)."""

import numpy as np

from jaxscale.calc.training_format import (
    add_output_flags,
    comma_list,
    emit,
    format_table,
    mode_line,
    non_negative_float,
    positive_int,
)
from jaxscale.sim import batching as bt
from jaxscale.sim.cli import guarded

FAITHFUL_WHAT = "seed 003 L112's 22.5% static-batch waste for its 8-request example"


def add_command(sim_sub) -> None:
    p = sim_sub.add_parser(
        "batching",
        help="static vs continuous batching: steps, utilisation, waste, latency",
        description="Seed 000 exercise 3: a queue of requests served by static batches or by "
        "continuous batching (a finished slot is refilled at the next step). Defaults reproduce "
        "its 50-request workload (np.random.seed(42)); also seed 003's 8-request example.",
    )
    w = bt.Workload()
    p.add_argument("--num-requests", type=positive_int, default=w.num_requests)
    p.add_argument("--batch-size", type=positive_int, default=8, help="slots per batch")
    p.add_argument("--seed", type=int, default=w.seed, help="np.random seed of the workload")
    p.add_argument("--mean-length", type=float, default=w.mean_length)
    p.add_argument("--std-length", type=non_negative_float, default=w.std_length)
    p.add_argument("--min-length", type=positive_int, default=w.min_length)
    p.add_argument("--max-length", type=positive_int, default=w.max_length)
    p.add_argument(
        "--lengths",
        type=comma_list(positive_int),
        help="explicit request lengths (overrides "
        "the generated workload), e.g. 20,45,200,15,80,150,30,200",
    )
    add_output_flags(p, plot=True, faithful=True)
    p.set_defaults(func=guarded(run))


def _row(res: bt.BatchingResult) -> list[str]:
    return [
        res.strategy,
        res.total_steps,
        f"{res.avg_utilization:.1%}",
        res.slot_steps,
        res.wasted_slot_steps,
        f"{res.waste_fraction:.1%}",
        f"{res.avg_service_latency:.1f}",
        f"{res.avg_completion:.1f}",
        f"{res.tokens_per_step:.2f}",
    ]


def _summary(res: bt.BatchingResult, with_history: bool) -> dict:
    out = {
        "total_steps": res.total_steps,
        "avg_utilization": res.avg_utilization,
        "slot_steps": res.slot_steps,
        "wasted_slot_steps": res.wasted_slot_steps,
        "waste_fraction": res.waste_fraction,
        "avg_latency_steps": res.avg_service_latency,
        "avg_completion_step": res.avg_completion,
        "tokens_per_step": res.tokens_per_step,
    }
    if with_history:
        out["utilization_history"] = list(res.utilization)
    return out


def run(args) -> int:
    workload = bt.Workload(
        args.num_requests,
        args.seed,
        args.mean_length,
        args.std_length,
        args.min_length,
        args.max_length,
    )
    lengths = np.asarray(args.lengths) if args.lengths else workload.lengths()
    static = bt.simulate_static(lengths, args.batch_size)
    cont = bt.simulate_continuous(lengths, args.batch_size)
    example = bt.simulate_static(bt.SEED_003_LENGTHS, len(bt.SEED_003_LENGTHS))
    example_waste = bt.seed_003_claimed_waste() if args.seed_faithful else example.waste_fraction

    if args.lengths:
        source = "explicit --lengths"
    else:
        source = (
            f"lengths ~ N({workload.mean_length:g}, {workload.std_length:g}) cast to int, clipped "
            f"to [{workload.min_length}, {workload.max_length}], np.random.seed({workload.seed})"
        )
    lines = [
        "jaxscale simulate batching — static vs continuous batching "
        "(seed 000 exercise 3; one step = one token for every busy slot)",
        mode_line(args.seed_faithful, FAITHFUL_WHAT),
        "",
        f"workload: {len(lengths)} requests, {source}",
        f"  lengths {lengths.min()}..{lengths.max()}, mean {lengths.mean():.1f}, total "
        f"{int(lengths.sum())} tokens; batch size {args.batch_size}",
        f"  first 10 lengths: {lengths[:10].tolist()}",
        "",
        format_table(
            [
                "strategy",
                "steps",
                "avg util",
                "slot-steps",
                "wasted",
                "waste",
                "latency",
                "completion",
                "tokens/step",
            ],
            [_row(static), _row(cont)],
        ),
        f"continuous batching serves the queue in {static.total_steps / cont.total_steps:.2f}x "
        "fewer steps.",
        "latency: steps from a request's start of service until its batch (static) or itself "
        "(continuous) finishes, as seed 000 measures it;",
        "completion: the step at which a request is returned, counting from t=0 when all are "
        "queued (queueing included).",
        "",
        "utilisation over time (one character = mean over an equal chunk of steps; "
        "' ' = 0% ... '@' = 100%):",
        f"  static     |{bt.sparkline(static.utilization)}|",
        f"  continuous |{bt.sparkline(cont.utilization)}|",
        "",
        f"seed 003 L93 example: {len(bt.SEED_003_LENGTHS)} requests {list(bt.SEED_003_LENGTHS)} "
        "in one static batch",
        f"  {example.total_steps} steps x {example.batch_size} slots = {example.slot_steps} "
        f"slot-steps; useful {example.useful_tokens}; wasted {example.wasted_slot_steps}",
    ]
    if args.seed_faithful:
        lines.append(
            f"  waste (seed's figure): {example_waste:.2%} = 2 x (200 - 20) / 1600, counting only "
            f"two finished requests; the full waste is {example.waste_fraction:.2%}"
        )
    else:
        lines.append(
            f"  waste: {example_waste:.2%} (seed 003 L112 says 22.5%, counting only the two "
            "requests that finish near step 20)"
        )
    report = {
        "command": "simulate batching",
        "mode": "seed-faithful" if args.seed_faithful else "corrected",
        "batch_size": args.batch_size,
        "lengths": lengths.tolist(),
        "static": _summary(static, True),
        "continuous": _summary(cont, True),
        "step_ratio": static.total_steps / cont.total_steps,
        "seed_003_example": {
            "lengths": list(bt.SEED_003_LENGTHS),
            "slot_steps": example.slot_steps,
            "useful_tokens": example.useful_tokens,
            "wasted_slot_steps": example.wasted_slot_steps,
            "waste_fraction": example_waste,
        },
    }
    if args.plot:
        from jaxscale.sim import plots

        lines.append(f"\nplot written to {plots.batching(static, cont, args.plot)}")
        report["plot"] = args.plot
    emit(args, report, lines)
    return 0
