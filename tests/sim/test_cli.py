"""`jaxscale simulate …`: tables, --json, --plot, --seed-faithful, exit code 2, no jax import."""

import json
import subprocess
import sys

import pytest

from jaxscale.cli import main

MY_MODULES = [
    "batching",
    "speculative",
    "speculative_demo",
    "pipeline",
    "pipeline_seed",
    "overlap",
    "param_server",
    "timeline",
    "plots",
    "cli",
    "cli_batching",
    "cli_speculative",
    "cli_pipeline",
    "cli_overlap",
    "cli_param_server",
]
FAST_SPEC = ["--trials", "20"]  # the K sweeps' trial count does not touch the demo's goldens


def run(capsys, *argv):
    rc = main(["simulate", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def run_json(capsys, *argv):
    rc, out, _ = run(capsys, *argv, "--json")
    assert rc == 0
    return json.loads(out)  # exactly one JSON object


def test_importing_does_not_import_jax_or_matplotlib():
    # One fresh interpreter (conftest has imported jax into this one); building the parser
    # imports every command module too.
    imports = "; ".join(f"import jaxscale.sim.{m}" for m in MY_MODULES)
    code = (
        f"import sys, argparse; {imports}; "
        "jaxscale.sim.cli.add_parser(argparse.ArgumentParser().add_subparsers()); "
        "bad = [m for m in ('jax', 'flax', 'matplotlib') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_batching_table(capsys):
    rc, out, _ = run(capsys, "batching")
    assert rc == 0
    assert "mode: corrected" in out
    static = next(line for line in out.splitlines() if line.startswith("static "))
    continuous = next(line for line in out.splitlines() if line.startswith("continuous "))
    assert static.split()[1:3] == ["1016", "43.4%"]  # seed 000 totals
    assert continuous.split()[1:3] == ["527", "83.6%"]
    assert "53.75%" in out


def test_batching_json_and_seed_faithful(capsys):
    report = run_json(capsys, "batching", "--seed-faithful")
    assert report["mode"] == "seed-faithful"
    assert report["static"]["total_steps"] == 1016
    assert report["continuous"]["total_steps"] == 527
    assert len(report["static"]["utilization_history"]) == 1016
    assert report["seed_003_example"]["waste_fraction"] == pytest.approx(0.225)
    assert run_json(capsys, "batching")["seed_003_example"]["waste_fraction"] == pytest.approx(
        0.5375
    )


def test_batching_custom_lengths(capsys):
    report = run_json(capsys, "batching", "--lengths", "20,45,200,15,80,150,30,200")
    assert report["static"]["total_steps"] == 200  # one batch of 8
    assert report["static"]["wasted_slot_steps"] == 860


def test_speculative_corrected_and_seed_faithful(capsys):
    rc, out, _ = run(capsys, "speculative", *FAST_SPEC)
    assert rc == 0 and "mode: corrected" in out
    assert "3.68928" in out and "3.05078" in out and "2.54x" in out
    rc, out, _ = run(capsys, "speculative", "--seed-faithful", *FAST_SPEC)
    assert rc == 0 and "mode: seed-faithful" in out
    assert "3.36160" in out
    demo_row = out.splitlines()[
        out.splitlines().index(
            next(line for line in out.splitlines() if line.startswith("tokens  target calls"))
        )
        + 2
    ]
    assert demo_row.split() == ["50", "13", "13", "58", "45", "5", "0", "3.85", "90.00%", "3.50x"]


def test_speculative_json(capsys):
    faithful = run_json(capsys, "speculative", "--seed-faithful", *FAST_SPEC)
    assert faithful["demo"]["target_calls"] == 13
    assert faithful["demo"]["speedup"] == pytest.approx(50 / (13 + 13 * 0.1))
    corrected = run_json(capsys, "speculative", *FAST_SPEC)
    d = corrected["demo"]
    assert d["speedup"] == pytest.approx(
        d["tokens"] / (d["target_calls"] + 0.1 * d["drafted_tokens"])
    )
    assert [p["k"] for p in corrected["k_sweep"]] == list(range(1, 9))


GOLDEN_1F1B_ROW0 = "GPU0: F0 F1 F2 F3 .. .. .. B0 F4 B1 F5 B2 F6 B3 F7 B4 .. B5 .. B6 .. B7"


def test_pipeline_table_and_grid(capsys):
    rc, out, _ = run(capsys, "pipeline")
    assert rc == 0
    assert GOLDEN_1F1B_ROW0 in out.splitlines()
    row = next(line for line in out.splitlines() if line.startswith("1f1b "))
    assert row.split()[:4] == ["1f1b", "22", "16", "27.27%"]
    assert row.split()[-4:] == ["4", "3", "2", "1"]


def test_pipeline_json_and_seed_faithful(capsys):
    report = run_json(capsys, "pipeline", "-s", "4", "-m", "8")
    by_name = {s["schedule"]: s for s in report["schedules"]}
    assert by_name["1f1b"]["peak_activations"] == [4, 3, 2, 1]
    assert by_name["interleaved"]["bubble_s2"] == pytest.approx(3 / 19)
    effs = [r["efficiency_s4"] for r in report["bubble_vs_microbatches"] if r["microbatches"] >= 4]
    assert effs == pytest.approx([0.25, 0.625, 0.8125, 0.90625, 0.953125])
    rc, out, _ = run(capsys, "pipeline", "--seed-faithful")
    assert rc == 0 and "Bubble ratio: 68.6%" in out and "mode: seed-faithful" in out


def test_overlap(capsys):
    rc, out, _ = run(capsys, "overlap")
    assert rc == 0
    for text in ("260.00", "222.00", "750.00", "550.00", "23.1%", "67%"):
        assert text in out
    report = run_json(capsys, "overlap", "-b", "10")
    assert report["scheduling"]["total_ms"]["sequential"] == pytest.approx(130.0)
    assert report["scheduling"]["total_ms"]["overlap"] == pytest.approx(13 + 9 * 11)


def test_param_server(capsys):
    rc, out, _ = run(capsys, "param-server", "--updates", "100")
    assert rc == 0
    sync = next(line for line in out.splitlines() if line.startswith("sync "))
    asyn = next(line for line in out.splitlines() if line.startswith("async "))
    assert sync.split()[-1] == "converged" and asyn.split()[-1] == "diverged"
    report = run_json(capsys, "param-server", "--workers", "2", "--updates", "100")
    assert report["runs"]["async"]["max_staleness"] == 1
    assert report["runs"]["async"]["status"] != "diverged"


@pytest.mark.parametrize(
    "argv",
    [
        ["batching", "--num-requests", "30"],
        ["speculative", "--trials", "5", "--max-k", "3"],
        ["pipeline", "-m", "4"],
        ["overlap", "-b", "4", "--iterations", "10"],
        ["param-server", "--updates", "30"],
    ],
)
def test_plot_writes_png(capsys, tmp_path, argv):
    path = tmp_path / "sub" / "plot.png"
    rc, out, _ = run(capsys, *argv, "--plot", str(path))
    assert rc == 0 and str(path) in out
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["batching", "--min-length", "50", "--max-length", "20"], "--min-length"),
        (["pipeline", "--schedule", "interleaved", "-m", "6"], "divisible"),
        (["param-server", "--jitter", "1"], "--jitter"),
        (["param-server", "--samples", "4"], "samples"),
    ],
)
def test_bad_input_exit_code_2(capsys, argv, needle):
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err


@pytest.mark.parametrize(
    "argv",
    [
        ["overlap", "--batches", "0"],
        ["speculative", "-a", "1.5"],
        ["pipeline", "-s", "-4"],
        ["batching", "--batch-size", "0"],
        ["param-server", "--staleness-sweep", "1,-1"],
        ["param-server", "--jitter", "1.5"],
    ],
)
def test_bad_flags_exit_code_2(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", *argv])
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err
