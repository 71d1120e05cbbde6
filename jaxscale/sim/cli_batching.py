"""`jaxscale simulate batching`: static vs continuous batching (seed 000 ex. 3, seed 003)."""

import numpy as np

from jaxscale.checks import at_most
from jaxscale.cliutil import (
    add_command,
    add_output_flags,
    comma_list,
    finite_float,
    guarded,
    non_negative_float,
    non_negative_int,
    overrides,
    positive_int,
)
from jaxscale.render import Col, Report
from jaxscale.sim import batching as bt

FAITHFUL_WHAT = "seed 003's 22.5% static-batch waste for its 8-request example"
MAX_TOKENS = 400_000  # ~2 s, plot included
WHY = "every token is a simulated step: a larger workload is slow"


def add_parser(sim_sub) -> None:
    p = add_command(
        sim_sub,
        "batching",
        help="static vs continuous batching: steps, utilisation, waste, latency",
        description="Seed 000 exercise 3: a queue of requests served by static batches or by "
        "continuous batching (a finished slot is refilled at the next step). Defaults reproduce "
        "its 50-request workload (np.random.seed(42)); also seed 003's 8-request example.",
        example="jaxscale simulate batching --num-requests 200 --batch-size 16 --plot batch.png",
    )
    w = bt.Workload()
    p.add_argument(
        "--num-requests", type=positive_int, default=w.num_requests, help="requests in the queue"
    )
    p.add_argument("--batch-size", type=positive_int, default=8, help="slots per batch")
    p.add_argument(
        "--seed", type=non_negative_int, default=w.seed, help="np.random seed of the workload"
    )
    p.add_argument(
        "--mean-length",
        type=finite_float,
        default=w.mean_length,
        help="mean request length in tokens",
    )
    p.add_argument(
        "--std-length",
        type=non_negative_float,
        default=w.std_length,
        help="standard deviation of the request length",
    )
    p.add_argument(
        "--min-length",
        type=positive_int,
        default=w.min_length,
        help="shortest request (lengths are clipped)",
    )
    p.add_argument(
        "--max-length",
        type=positive_int,
        default=w.max_length,
        help="longest request (lengths are clipped)",
    )
    p.add_argument(
        "--lengths",
        type=comma_list(positive_int),
        help="explicit request lengths (overrides the generated workload), e.g. "
        "20,45,200,15,80,150,30,200",
    )
    add_output_flags(p, plot=True, faithful=True)
    p.set_defaults(func=guarded(run))


def _lengths(args, workload: bt.Workload) -> np.ndarray:
    """The request lengths, refused (naming the flags) when the run would take minutes: every
    token is a simulated slot-step."""
    if args.lengths:
        lengths = np.asarray(args.lengths)
    else:
        if args.min_length > args.max_length:
            raise ValueError(
                f"--min-length {args.min_length} exceeds --max-length {args.max_length}"
            )
        at_most(MAX_TOKENS, "requests", WHY, num_requests=args.num_requests)
        lengths = workload.lengths()
    if (tokens := int(lengths.sum())) > MAX_TOKENS:
        flags = "--lengths" if args.lengths else "--num-requests, --mean-length, --max-length"
        raise ValueError(
            f"{tokens:,} tokens in the workload ({flags}): at most {MAX_TOKENS:,} ({WHY})"
        )
    return lengths


def _summary(res: bt.BatchingResult) -> dict:
    return {
        "strategy": res.strategy,
        "total_steps": res.total_steps,
        "avg_utilization": res.avg_utilization,
        "slot_steps": res.slot_steps,
        "wasted_slot_steps": res.wasted_slot_steps,
        "waste_fraction": res.waste_fraction,
        "avg_latency_steps": res.avg_service_latency,
        "avg_completion_step": res.avg_completion,
        "tokens_per_step": res.tokens_per_step,
        "utilization_history": list(res.utilization),
    }


COLS = [
    Col("strategy", "strategy"),
    Col("total_steps", "steps"),
    Col("avg_utilization", "avg util", ".1%"),
    Col("slot_steps", "slot-steps"),
    Col("wasted_slot_steps", "wasted"),
    Col("waste_fraction", "waste", ".1%"),
    Col("avg_latency_steps", "latency", ".1f"),
    Col("avg_completion_step", "completion", ".1f"),
    Col("tokens_per_step", "tokens/step", ".2f"),
]


def run(args) -> int:
    workload = bt.Workload(**overrides(args, bt.Workload))
    lengths = _lengths(args, workload)
    static = bt.simulate_static(lengths, args.batch_size)
    cont = bt.simulate_continuous(lengths, args.batch_size)
    example = bt.simulate_static(bt.SEED_003_LENGTHS, len(bt.SEED_003_LENGTHS))
    example_waste = bt.seed_003_claimed_waste() if args.seed_faithful else example.waste_fraction
    w = workload
    source = (
        "explicit --lengths"
        if args.lengths
        else (
            f"lengths ~ N({w.mean_length:g}, {w.std_length:g}) cast to int, clipped to "
            f"[{w.min_length}, {w.max_length}], np.random.seed({w.seed})"
        )
    )

    r = Report("simulate batching")
    r.say(
        "jaxscale simulate batching — static vs continuous batching "
        "(seed 000 exercise 3; one step = one token for every busy slot)"
    )
    r.mode(args.seed_faithful, FAITHFUL_WHAT)
    r.say(
        "",
        f"workload: {len(lengths)} requests, {source}",
        f"  lengths {lengths.min()}..{lengths.max()}, mean {lengths.mean():.1f}, total "
        f"{int(lengths.sum())} tokens; batch size {args.batch_size}",
        f"  first 10 lengths: {lengths[:10].tolist()}",
        "",
    )
    r.put(batch_size=args.batch_size, lengths=lengths.tolist())
    summaries = {res.strategy: _summary(res) for res in (static, cont)}  # JSON "static", ...
    r.table(None, COLS, summaries.values())
    ratio = static.total_steps / cont.total_steps
    r.put(**summaries, step_ratio=ratio)
    r.say(
        f"continuous batching serves the queue in {ratio:.2f}x fewer steps.",
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
        f"seed 003 example: {len(bt.SEED_003_LENGTHS)} requests {list(bt.SEED_003_LENGTHS)} "
        "in one static batch",
        f"  {example.total_steps} steps x {example.batch_size} slots = {example.slot_steps} "
        f"slot-steps; useful {example.useful_tokens}; wasted {example.wasted_slot_steps}",
        f"  waste (seed's figure): {example_waste:.2%} = 2 x (200 - 20) / 1600, counting only "
        f"two finished requests; the full waste is {example.waste_fraction:.2%}"
        if args.seed_faithful
        else f"  waste: {example_waste:.2%} (seed 003 says 22.5%, counting only the two "
        "requests that finish near step 20)",
    )
    r.put(
        seed_003_example={
            "lengths": list(bt.SEED_003_LENGTHS),
            "slot_steps": example.slot_steps,
            "useful_tokens": example.useful_tokens,
            "wasted_slot_steps": example.wasted_slot_steps,
            "waste_fraction": example_waste,
        }
    )
    if args.plot:
        from jaxscale.sim import plots

        r.say(f"\nplot written to {plots.batching(static, cont, args.plot)}")
        r.put(plot=args.plot)
    r.emit(args)
    return 0
