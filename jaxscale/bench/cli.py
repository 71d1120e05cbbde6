"""`jaxscale bench [SUITE]`: the mesh comparison (`meshes`, the default when no suite is named),
the pipeline schedules, the MoE rows, strong/weak scaling, the serving engine, collective timings,
or PPO beside rejax's (`jaxscale.rl.bench`).

Each suite is a subcommand with only the flags it reads (a flag of another suite is an argparse
error), registered by its `_add_<suite>(sub)`, and runs through its `_run_<suite>` handler, which
imports the suite's module (and jax) only when it runs.
"""

from __future__ import annotations

import argparse

from jaxscale.cliutil import comma_list, positive_int, writable_dir, writable_path
from jaxscale.config import MODEL_PRESETS

DEFAULT_SUITE = "meshes"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="compare strategies x meshes: memory, FLOPs, collectives, equivalence (default), "
        "pipeline schedules against their formulas ('bench pipeline'), MoE rows with their "
        "all-to-alls ('bench experts'), context-parallel forms against their bytes ('bench "
        "context'), activation-checkpointing policies ('bench remat'), strong/weak scaling "
        "('bench scaling'), the serving "
        "engine under load ('bench serve'), time collectives ('bench collectives'), or PPO "
        "beside rejax ('bench rl')",
        description="The mesh comparison (default): every strategy x mesh compiled, its memory, "
        "FLOPs and collectives measured beside the predictions, and a short trajectory checked "
        "against one device. 'bench pipeline' runs each pipeline schedule: bubble and "
        "collective-permute bytes against their formulas, temporaries as M grows, the executed "
        "grids. 'bench experts' runs expert parallelism, TP of experts and the auto path on an "
        "MoE model: all-to-all bytes against 4 per MoE layer, the seed's EP-vs-TP table. "
        "'bench scaling' runs one strategy's strong and weak scaling over 1, 2, 4, 8 devices "
        "against its prediction (calc scaling's efficiencies). "
        "'bench serve' loads the serving engine in process and over HTTP. "
        "'bench collectives' times each collective over message sizes. "
        "'bench rl' "
        "times jaxscale's PPO beside rejax's on CartPole (steps/s, time to 475). "
        "With no SUITE, 'bench' is 'bench meshes' and takes its flags: "
        "'jaxscale bench meshes --help' lists them; 'jaxscale bench SUITE --help', each suite's.",
        epilog="examples:\n  jaxscale bench --model tiny --strategies auto:fsdp,manual:zero3 "
        "--steps 3\n  jaxscale bench --strategies manual:zero3+tp --meshes 'fsdp=2,tp=4;"
        "fsdp=4,tp=2'\n  jaxscale bench --target tpu:v5e:2x4\n  jaxscale bench collectives "
        "--sizes 1K:16M\n  jaxscale bench pipeline --sweep 4,8,16\n  "
        "jaxscale bench scaling --strategies auto:fsdp"
        "\n  jaxscale bench rl",
        usage="%(prog)s [-h] [SUITE] [flags]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    suites = p.add_subparsers(
        dest="suite", metavar="SUITE", title="suites (default meshes)", prog=p.prog
    )
    for add in SUITES:
        add(suites)
    _parse_suites(p, suites)


def _parse_suites(p: argparse.ArgumentParser, suites) -> None:
    """`jaxscale bench [flags]` parses as `jaxscale bench meshes [flags]`: argparse has no
    default subcommand, so the bench parser puts `meshes` before arguments that start with a flag
    (other than -h) or before none; a word that is no suite stays an invalid choice of SUITE. A
    flag the suite does not take is refused by the suite's parser, which names itself (exit 2)."""
    parse = p.parse_known_args

    def parse_known_args(args=None, namespace=None):
        args = [] if args is None else list(args)
        if not args or (args[0].startswith("-") and args[0] not in ("-h", "--help")):
            args.insert(0, DEFAULT_SUITE)
        namespace, extras = parse(args, namespace)
        if extras:
            suites.choices[namespace.suite].error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    p.parse_known_args = parse_known_args


def _suite(sub, name: str, *, help: str, description: str, examples: list[str]):
    """A suite's parser: its description, then its example commands as typed."""
    return sub.add_parser(
        name,
        help=help,
        description=description,
        epilog="examples:\n" + "\n".join(f"  {e}" for e in examples),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


# --- the flags several suites share -------------------------------------------------------------


def _add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default="small",
        choices=sorted(MODEL_PRESETS),
        help="model preset (default small)",
    )
    p.add_argument(
        "--global-batch", type=positive_int, default=16, help="sequences per step (default 16)"
    )
    p.add_argument(
        "--seq-len", type=positive_int, default=64, help="tokens per sequence (default 64)"
    )


def _add_steps(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--steps",
        type=positive_int,
        default=2,
        help="timed steps per row: the checked trajectory runs one more, untimed (default 2)",
    )


def _add_outputs(p: argparse.ArgumentParser, png: str | None) -> None:
    """--out; --plot and --no-plot where the suite draws a PNG (`png`: its default path);
    --json; --dry-run."""
    p.add_argument(
        "--out",
        type=writable_dir,
        default="results",
        help="directory for the JSON report and the PNG (default results)"
        if png
        else "directory for the JSON report (default results)",
    )
    if png:
        p.add_argument("--plot", type=writable_path, default=None, help=f"PNG path (default {png})")
        p.add_argument("--no-plot", action="store_true", help="write no PNG")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of tables")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check the arguments and list the rows, compile nothing",
    )


# --- the suites, in the order `jaxscale bench --help` lists them --------------------------------


def _add_time(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--time", action="store_true", help=what + " (docs/time.md)")
    p.add_argument(
        "--time-steps",
        type=positive_int,
        default=3,
        metavar="N",
        help="profiled steps per row with --time (default 3)",
    )


def _add_meshes(sub) -> None:
    p = _suite(
        sub,
        "meshes",
        help="strategies x meshes: memory, FLOPs, collectives, equivalence (the default suite)",
        description="The mesh comparison (the default: 'jaxscale bench' runs it): every "
        "strategy x mesh compiled, its memory, FLOPs and collectives measured beside the "
        "predictions, and a short trajectory checked against one device.",
        examples=[
            "jaxscale bench --model tiny --strategies auto:fsdp,manual:zero3 --steps 3",
            "jaxscale bench --strategies manual:zero3+tp --meshes 'fsdp=2,tp=4;fsdp=4,tp=2'",
            "jaxscale bench --target tpu:v5e:2x4",
        ],
    )
    _add_model(p)
    _add_rows(p)
    _add_steps(p)
    p.add_argument(
        "--remat-layers",
        type=positive_int,
        default=8,
        help="layers of the model used for the remat vs sqrt(L) comparison (default 8)",
    )
    _add_time(
        p,
        "also profile each row's step: collective time per op measured in the trace beside an "
        "alpha-beta prediction fitted on isolated collectives in this run, and the exposed "
        "fraction",
    )
    p.add_argument(
        "--profile",
        type=writable_dir,
        default=None,
        metavar="DIR",
        help="--time, keeping each row's trace in DIR/<strategy>@<mesh> (TensorBoard, Perfetto)",
    )
    _add_outputs(p, "OUT/bench_meshes.png; OUT/bench_<topology>.png with --target")
    p.set_defaults(func=_run_meshes)


def _add_rows(p: argparse.ArgumentParser) -> None:
    """The mesh comparison's rows: strategies, meshes, and where they run."""
    p.add_argument(
        "--strategies",
        default="",
        help="comma-separated labels (auto:dp, manual:zero3, or a bare name such as "
        "dp for both paths); with --meshes, 'auto' or 'manual:...' on every mesh "
        "given (default: the bench's rows)",
    )
    p.add_argument(
        "--target",
        default="cpu",
        help="'cpu' (run on the simulated devices; default) or a TPU topology such "
        "as tpu:v5e:2x4 (compile only; needs the tpu-aot extra)",
    )
    p.add_argument(
        "--meshes",
        default="",
        help="mesh specs, ';'-separated (dp=4,tp=2;...): the auto path on each, or "
        "every --strategies entry on each",
    )


def _add_pipeline(sub) -> None:
    p = _suite(
        sub,
        "pipeline",
        help="pipeline schedules against their formulas: bubble, permute bytes, temporaries",
        description="Runs each pipeline schedule: bubble and collective-permute bytes against "
        "their formulas, temporaries as M grows, the executed grids.",
        examples=["jaxscale bench pipeline --sweep 4,8,16"],
    )
    p.add_argument(
        "--sweep",
        type=comma_list(positive_int),
        default=[4, 8, 16, 32],
        help="microbatch counts M at which every schedule is compiled for its compile time, "
        "tick programs and temporaries (default 4,8,16,32; make bench runs 8,32)",
    )
    _add_time(
        p,
        "also profile each checked row's step: per device compute, collectives and idle, the "
        "time not computing beside the tick bubble's share of the step",
    )
    _add_outputs(p, "OUT/bench_pipeline.png")
    p.set_defaults(func=_run_pipeline)


def _add_experts(sub) -> None:
    p = _suite(
        sub,
        "experts",
        help="MoE rows with their all-to-alls, EP vs TP",
        description="Runs expert parallelism, TP of experts and the auto path on an MoE model: "
        "all-to-all bytes against 4 per MoE layer, the seed's EP-vs-TP table.",
        examples=["jaxscale bench experts"],
    )
    _add_steps(p)
    _add_outputs(p, None)
    p.set_defaults(func=_run_experts)


def _add_context(sub) -> None:
    p = _suite(
        sub,
        "context",
        help="context parallelism: ring, all-gather and Ulysses side by side",
        description="Runs each context-parallel form (ring attention zigzag and contiguous, "
        "all-gather, Ulysses): collective bytes measured against cp.predict_comm, the "
        "trajectory against one device, per-device attention FLOPs (max/mean: the load "
        "balance), and the training step's temporaries as the sequence grows, with the "
        "longest sequence within a per-device memory budget.",
        examples=["jaxscale bench context", "jaxscale bench context --seq-lens 1024,2048"],
    )
    p.add_argument(
        "--cp",
        type=positive_int,
        default=8,
        help="context devices of the balance and memory tables (default 8)",
    )
    p.add_argument(
        "--seq-lens",
        type=comma_list(positive_int),
        default=[1024, 2048, 4096, 8192],
        help="sequence lengths of the temporaries table (default 1024,2048,4096,8192)",
    )
    p.add_argument(
        "--balance-t",
        type=positive_int,
        default=4096,
        help="sequence length of the balance table (default 4096)",
    )
    p.add_argument(
        "--budget-mib",
        type=positive_int,
        default=256,
        help="per-device memory budget of the longest-sequence column (default 256 MiB)",
    )
    p.add_argument(
        "--all-splits",
        action="store_true",
        help="the temporaries table for the contiguous ring too (default: each form once)",
    )
    _add_steps(p)
    _add_outputs(p, "results/bench_context.png")
    p.set_defaults(func=_run_context)


def _add_remat(sub) -> None:
    p = _suite(
        sub,
        "remat",
        help="activation-checkpointing policies: memory vs recompute, against the seeds' rules",
        description="Compiles the one-device training step under each --remat policy: "
        "temporaries (memory_analysis, scanned layers) and FLOPs (cost_analysis, unrolled), "
        "beside the segment model of seed 001's N/(C+1), seed 004's sqrt(L) rule and the "
        "recompute the model's matmul counts predict.",
        examples=["jaxscale bench remat", "jaxscale bench remat --layers 8 --policies block,sqrt"],
    )
    p.add_argument(
        "--layers", type=_layers, default=16, help="layers of the model (default 16, >= 2)"
    )
    p.add_argument(
        "--global-batch", type=positive_int, default=8, help="sequences per step (default 8)"
    )
    p.add_argument(
        "--seq-len", type=positive_int, default=512, help="tokens per sequence (default 512)"
    )
    p.add_argument(
        "--policies",
        type=comma_list(_remat_policy),
        default=["none", "block", "dots", "every:2", "sqrt", "every:8"],
        help="policies to compare (none and block always run: the segment model needs them; "
        "default none,block,dots,every:2,sqrt,every:8)",
    )
    _add_outputs(p, "results/bench_remat.png")
    p.set_defaults(func=_run_remat)


def _layers(text: str) -> int:
    n = positive_int(text)
    if n < 2:
        raise argparse.ArgumentTypeError(f"must be at least 2 (one layer has no segments), got {n}")
    return n


def _remat_policy(text: str) -> str:
    from jaxscale.config import ModelConfig

    try:
        ModelConfig(remat=text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("remat ")) from None
    if text == "offload":  # the bench compiles for the CPU devices
        raise argparse.ArgumentTypeError(
            "offload needs a TPU or GPU compiler: XLA:CPU drops the host copies, so this bench "
            "would show block's figures"
        )
    return text


def _add_scaling(sub) -> None:
    p = _suite(
        sub,
        "scaling",
        help="strong/weak scaling of one strategy over 1, 2, 4, 8 devices",
        description="Runs one strategy's strong and weak scaling over 1, 2, 4, 8 devices "
        "against its prediction (calc scaling's efficiencies).",
        examples=["jaxscale bench scaling --strategies auto:fsdp"],
    )
    _add_model(p)
    p.add_argument(
        "--strategies",
        default="",
        help="the strategy to scale, a label such as auto:fsdp or manual:zero3 (a list: its "
        "first; default auto:dp)",
    )
    _add_steps(p)
    p.add_argument(
        "--devices",
        type=comma_list(positive_int),
        default=None,
        help="device counts, starting at 1 (default 1,2,4,... up to the devices there are), "
        "e.g. 1,2,4,8",
    )
    p.add_argument(
        "--mode",
        choices=("strong", "weak", "both"),
        default="both",
        help="strong (global batch fixed), weak (--global-batch per device) or both (default)",
    )
    _add_outputs(p, "OUT/bench_scaling.png")
    p.set_defaults(func=_run_scaling)


def _add_serve(sub) -> None:
    p = _suite(
        sub,
        "serve",
        help="the serving engine under load, in process and over HTTP",
        description="The engine under Poisson load in process and over HTTP (TTFT, TPOT, "
        "throughput), continuous vs static batching beside 'simulate batching', paged vs "
        "contiguous capacity beside 'calc kv', the prefix cache's hit rate beside 'calc prefix'.",
        examples=["jaxscale bench serve --requests 8 --no-http"],
    )
    p.add_argument(
        "--requests",
        type=positive_int,
        default=24,
        help="requests per load level (default 24)",
    )
    p.add_argument("--no-http", action="store_true", help="skip the HTTP runs")
    p.add_argument(
        "--layouts",
        action="store_true",
        help="also the engine on 1 device, tp=2, tp=4, dp=2 and an MoE model on ep=4: its "
        "programs' collectives against the prediction and tokens/s",
    )
    p.add_argument(
        "--decoding",
        action="store_true",
        help="also speculative decoding with no draft and three drafts (tokens/s, acceptance, "
        "tokens per pass against the closed form) and structured outputs on and off (the "
        "JSON automaton's host cost per token)",
    )
    _add_outputs(p, "OUT/bench_serve.png")
    p.set_defaults(func=_run_serve)


def _add_collectives(sub) -> None:
    from jaxscale.bench import collectives

    p = _suite(
        sub,
        "collectives",
        help="time each collective over message sizes, with a fitted alpha-beta model",
        description="Times each collective over message sizes: latency and bus bandwidth, an "
        "alpha-beta fit.",
        examples=["jaxscale bench collectives --sizes 1K:16M"],
    )
    collectives.add_arguments(p)
    _add_outputs(p, "OUT/bench_collectives.png")
    p.set_defaults(func=_run_collectives)


def _add_rl(sub) -> None:
    p = _suite(
        sub,
        "rl",
        help="jaxscale's PPO beside rejax's on CartPole",
        description="Times jaxscale's PPO beside rejax's on CartPole (steps/s, time to 475).",
        examples=["jaxscale bench rl"],
    )
    _add_outputs(p, "OUT/bench_rl.png")
    p.set_defaults(func=_run_rl)


SUITES = (
    _add_meshes,
    _add_pipeline,
    _add_experts,
    _add_context,
    _add_remat,
    _add_scaling,
    _add_serve,
    _add_collectives,
    _add_rl,
)  # help order; each registers its subcommand


# --- the handlers: each imports its suite (and jax) only when it runs ---------------------------


def _fast_cpu_compiles() -> None:
    """On simulated CPU devices the pipeline and experts suites are mostly compiling, their
    figures are bytes and memory: at XLA's lowest backend optimisation level, as the test suite
    compiles (the HLO passes that fix collectives and memory are the same; ~2x faster compiles)."""
    import jax

    if jax.default_backend() == "cpu":
        jax.config.update("jax_disable_most_optimizations", True)


def _run_pipeline(args) -> int:
    from jaxscale.bench import pipeline

    _fast_cpu_compiles()
    return pipeline.main(args)


def _run_experts(args) -> int:
    from jaxscale.bench import experts

    _fast_cpu_compiles()
    return experts.main(args)


def _run_context(args) -> int:
    from jaxscale.bench import context

    _fast_cpu_compiles()
    return context.main(args)


def _run_remat(args) -> int:
    from jaxscale.bench import remat

    return remat.main(args)


def _run_scaling(args) -> int:
    from jaxscale.bench import scaling

    return scaling.main(args)


def _run_serve(args) -> int:
    from jaxscale.bench import serve

    return serve.main(args)


def _run_collectives(args) -> int:
    from jaxscale.bench import collectives
    from jaxscale.bench.report import plot_path

    args.plot = plot_path(args, "bench_collectives")
    return collectives.main(args, dry_run=args.dry_run)


def _run_rl(args) -> int:
    from jaxscale.rl import bench as rl_bench

    return rl_bench.main(args)


def _run_meshes(args) -> int:
    from jaxscale.bench import meshes_cli

    return meshes_cli.run(args)
