"""`jaxscale simulate server`: seed 002's minimal_inference_server.py on a virtual clock."""

from jaxscale.cliutil import (
    add_command,
    add_output_flags,
    guarded,
    non_negative_int,
    positive_float,
    positive_int,
)
from jaxscale.render import Col, Report
from jaxscale.sim import inference_server as srv

FAITHFUL_WHAT = "the seed's times, which sleep latency_ms as seconds (10 s per decode step)"


def add_parser(sim_sub) -> None:
    p = add_command(
        sim_sub,
        "server",
        help="the seed's minimal inference server: queue, one prefill at a time, decode batches",
        description="Seed 002's minimal_inference_server.py with its mock model (Python random, "
        "EOS with probability 0.1), on a virtual clock: FIFO admission, at most --batch-size "
        "running requests, a prefill whenever a slot is free, else a decode step for all.",
        example="jaxscale simulate server -n 5 -b 4",
    )
    p.add_argument("--num-requests", "-n", type=positive_int, default=5, help="requests (5)")
    p.add_argument("--batch-size", "-b", type=positive_int, default=4, help="running batch (4)")
    p.add_argument("--max-tokens", type=positive_int, default=20, help="tokens per request (20)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="random.seed of the mock")
    p.add_argument(
        "--latency-ms", type=positive_float, default=10.0, help="one decode step (10 ms)"
    )
    add_output_flags(p, faithful=True)
    p.set_defaults(func=guarded(run))


def run(args) -> int:
    if args.num_requests > 10_000:
        raise ValueError("--num-requests: at most 10,000")
    reqs, events = srv.run(
        args.num_requests,
        args.batch_size,
        args.max_tokens,
        args.seed,
        args.latency_ms,
        args.seed_faithful,
    )
    unit = "s" if args.seed_faithful else "ms"
    scale = 1.0 if args.seed_faithful else 1e3
    r = Report("simulate server")
    r.say("jaxscale simulate server — the seed's minimal inference server, virtual clock")
    r.mode(args.seed_faithful, FAITHFUL_WHAT)
    trace = [
        {
            "step": i,
            "kind": e.kind,
            "requests": " ".join(map(str, e.ids)),
            "prompt": e.prompt_tokens or "",
            "at": e.at * scale,
        }
        for i, e in enumerate(events)
    ]
    r.table(
        "events",
        [
            Col("step", "step"),
            Col("kind", "kind"),
            Col("requests", "requests"),
            Col("prompt", "prompt tokens"),
            Col("at", f"ends at {unit}", ".1f"),
        ],
        trace,
    )
    rows = [
        {
            "request": q.id,
            "prompt": len(q.prompt_tokens),
            "tokens": len(q.generated),
            "ttft": q.first_token_at * scale,
            "latency": q.finished_at * scale,
        }
        for q in reqs
    ]
    r.table(
        "requests",
        [
            Col("request", "request"),
            Col("prompt", "prompt tokens"),
            Col("tokens", "generated"),
            Col("ttft", f"TTFT {unit}", ".1f"),
            Col("latency", f"done at {unit}", ".1f"),
        ],
        rows,
    )
    total = sum(len(q.generated) for q in reqs)
    end = events[-1].at
    r.data["summary"] = {"tokens": total, "time_s": end, "tokens_per_s": total / end}
    r.say(
        f"{total} tokens in {end * scale:.1f} {unit} of virtual time: {total / end:,.1f} tokens/s"
    )
    r.emit(args)
    return 0
