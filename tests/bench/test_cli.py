"""`jaxscale bench [SUITE]`'s argument parsing, read from the real parser (`jaxscale.cli`): every
documented invocation parses to its suite and values, `bench` with no suite is `bench meshes`,
and a flag of another suite is refused. Parsing only: no suite runs (they compile for minutes)."""

import argparse
import shlex

import pytest

from jaxscale.bench import cli as bench_cli
from jaxscale.cli import build_parser

HANDLERS = {
    "meshes": bench_cli._run_meshes,
    "pipeline": bench_cli._run_pipeline,
    "experts": bench_cli._run_experts,
    "context": bench_cli._run_context,
    "scaling": bench_cli._run_scaling,
    "serve": bench_cli._run_serve,
    "collectives": bench_cli._run_collectives,
    "rl": bench_cli._run_rl,
    "remat": bench_cli._run_remat,
}
MESH_DEFAULTS = {
    "model": "small",
    "strategies": "",
    "meshes": "",
    "target": "cpu",
    "global_batch": 16,
    "seq_len": 64,
    "steps": 2,
    "remat_layers": 8,
    "out": "results",
    "plot": None,
    "no_plot": False,
    "json": False,
    "dry_run": False,
}
# (command line after `jaxscale`, its suite, values it must parse to); where each is documented
DOCUMENTED = [
    ("bench", "meshes", MESH_DEFAULTS),  # Makefile (empty BENCH_ARGS), docs/bench.md
    ("bench experts", "experts", {"steps": 2, "out": "results", "dry_run": False}),  # Makefile
    ("bench pipeline --sweep 8,32", "pipeline", {"sweep": [8, 32], "no_plot": False}),  # Makefile
    ("bench rl", "rl", {"out": "results", "plot": None, "dry_run": False}),  # Makefile, docs/rl.md
    (  # README, --help
        "bench --model tiny --strategies auto:fsdp,manual:zero3 --steps 3",
        "meshes",
        {"model": "tiny", "strategies": "auto:fsdp,manual:zero3", "steps": 3, "meshes": ""},
    ),
    (  # README
        "bench --model tiny --strategies manual:zero3+tp --meshes 'fsdp=2,tp=4;fsdp=4,tp=2'",
        "meshes",
        {"model": "tiny", "strategies": "manual:zero3+tp", "meshes": "fsdp=2,tp=4;fsdp=4,tp=2"},
    ),
    (  # --help
        "bench --strategies manual:zero3+tp --meshes 'fsdp=2,tp=4;fsdp=4,tp=2'",
        "meshes",
        {"model": "small", "strategies": "manual:zero3+tp", "meshes": "fsdp=2,tp=4;fsdp=4,tp=2"},
    ),
    ("bench --target tpu:v5e:2x4", "meshes", {"target": "tpu:v5e:2x4", "model": "small"}),
    (  # docs/tpu-aot.md
        "bench --target tpu:v5e:2x4 --strategies auto --meshes 'fsdp=8;dp=2,tp=4'",
        "meshes",
        {"target": "tpu:v5e:2x4", "strategies": "auto", "meshes": "fsdp=8;dp=2,tp=4"},
    ),
    (  # docs/hardware.md
        "bench --model medium --meshes dp=1 --global-batch 32 --seq-len 512 --steps 5",
        "meshes",
        {"model": "medium", "meshes": "dp=1", "global_batch": 32, "seq_len": 512, "steps": 5},
    ),
    (  # notebooks/tour.py
        "bench --model tiny --strategies auto,manual:zero3+tp --meshes 'fsdp=4,tp=2;fsdp=2,tp=4' "
        "--steps 1 --remat-layers 2 --out results/tour",
        "meshes",
        {
            "steps": 1,
            "remat_layers": 2,
            "out": "results/tour",
            "strategies": "auto,manual:zero3+tp",
        },
    ),
    ("bench meshes --dry-run", "meshes", {**MESH_DEFAULTS, "dry_run": True}),
    ("bench collectives --sizes 1K:16M", "collectives", {"sizes": "1K:16M", "repeats": 5}),
    ("bench collectives --sizes 1K:64M", "collectives", {"sizes": "1K:64M"}),  # docs/comm-lab.md
    ("bench pipeline --sweep 4,8,16", "pipeline", {"sweep": [4, 8, 16]}),  # README, docs
    ("bench pipeline", "pipeline", {"sweep": [4, 8, 16, 32], "out": "results"}),  # docs/pipeline
    ("bench scaling --strategies auto:fsdp", "scaling", {"strategies": "auto:fsdp"}),  # README
    (  # docs/bench.md
        "bench scaling --model tiny --steps 2",
        "scaling",
        {"model": "tiny", "steps": 2, "mode": "both", "devices": None, "global_batch": 16},
    ),
    (  # README
        "bench serve --requests 8 --no-http",
        "serve",
        {"requests": 8, "no_http": True, "dry_run": False},
    ),
    ("bench serve", "serve", {"requests": 24, "no_http": False}),  # docs/serving.md
]


def parse(line: str):
    return build_parser().parse_args(shlex.split(line))


@pytest.mark.parametrize("line, suite, values", DOCUMENTED, ids=[d[0] for d in DOCUMENTED])
def test_every_documented_bench_command_parses_to_its_suite_and_values(line, suite, values):
    args = parse(line)
    assert (args.command, args.suite, args.func) == ("bench", suite, HANDLERS[suite])
    assert {k: getattr(args, k) for k in values} == values


def test_bench_with_no_suite_is_bench_meshes():
    assert vars(parse("bench")) == vars(parse("bench meshes"))
    assert vars(parse("bench --steps 3 --json")) == vars(parse("bench meshes --steps 3 --json"))


def _subcommands(parser: argparse.ArgumentParser) -> dict:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices


def _examples():
    """The example command lines that the bench parser's and each suite's --help show."""
    bench = _subcommands(build_parser())["bench"]
    parsers = [bench, *_subcommands(bench).values()]
    return sorted(
        {
            line.strip().removeprefix("jaxscale ")
            for p in parsers
            for line in (p.epilog or "").splitlines()
            if line.strip().startswith("jaxscale bench")
        }
    )


def test_the_help_examples_parse():
    examples = _examples()
    assert len(examples) >= 9 and "bench rl" in examples
    for line in examples:
        assert parse(line).command == "bench", line


@pytest.mark.parametrize(
    "line, suite",
    [
        ("bench pipeline --model tiny", "pipeline"),
        ("bench experts --no-plot", "experts"),
        ("bench experts --sweep 8", "experts"),
        ("bench rl --model tiny", "rl"),
        ("bench collectives --steps 3", "collectives"),
        ("bench serve --sweep 8,32", "serve"),
        ("bench scaling --meshes dp=8", "scaling"),
        ("bench scaling --target tpu:v5e:2x4", "scaling"),
        ("bench meshes --requests 4", "meshes"),
        ("bench --sweep 8,32", "meshes"),  # no suite: the mesh comparison's flags only
        ("bench --no-http", "meshes"),
        ("bench --dry-run pipeline", "meshes"),  # a suite goes first
    ],
)
def test_a_flag_of_another_suite_is_refused(line, suite, capsys):
    with pytest.raises(SystemExit) as exc:
        parse(line)
    assert exc.value.code == 2
    assert f"jaxscale bench {suite}: error: unrecognized arguments" in capsys.readouterr().err


def test_an_unknown_suite_is_an_invalid_choice(capsys):
    with pytest.raises(SystemExit) as exc:
        parse("bench pipline")
    assert exc.value.code == 2
    assert "invalid choice: 'pipline'" in capsys.readouterr().err


def test_bench_help_lists_every_suite(capsys):
    with pytest.raises(SystemExit) as exc:
        parse("bench --help")
    assert exc.value.code == 0
    shown = capsys.readouterr().out
    assert "usage: jaxscale bench [-h] [SUITE] [flags]" in shown
    assert all(f"\n    {name}" in shown for name in HANDLERS)


def test_the_top_level_help_names_every_bench_suite(capsys):
    """`jaxscale --help` tells a newcomer what `bench` runs, each suite by its name (the issue
    report: `bench serve` was missing from it)."""
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["--help"])
    assert exc.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps the help text
    suites = [name for name in HANDLERS if name != "meshes"]
    assert all(f"'bench {name}'" in shown for name in suites), shown
