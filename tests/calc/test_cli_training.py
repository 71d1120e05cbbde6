"""`jaxscale calc memory|flops|chinchilla|moe|time|comm|scaling`: tables, --json, errors."""

import json
import subprocess
import sys

import pytest

from jaxscale.cli import main

REL = 1e-9
PNG_MAGIC = b"\x89PNG"
MY_MODULES = (
    "cli",
    "commands.memory",
    "commands.flops",
    "commands.chinchilla",
    "commands.moe",
    "commands.time",
    "commands.comm",
    "commands.scaling",
    "memory",
    "models",
    "flops",
    "scaling_laws",
    "training_time",
    "training_comm",
    "scaling",
)


def run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exit_:  # argparse rejects bad flag values with exit code 2
        return exit_.code


def run_json(argv: list[str], capsys) -> dict:
    assert run(["calc", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_importing_training_calculators_does_not_import_jax():
    code = "import sys\n"
    code += "".join(f"import jaxscale.calc.{m}\n" for m in MY_MODULES)
    code += "assert 'jax' not in sys.modules, 'jax was imported'\n"
    code += "assert 'matplotlib' not in sys.modules, 'matplotlib was imported'\n"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_memory_default_reproduces_seed000(capsys):
    assert run(["calc", "memory"]) == 0
    out = capsys.readouterr().out
    assert "mode: corrected" in out
    # seed 000 Exercise 1's ZeRO cell (8 GPUs): 70B stages 840 / 350 / 227.5 / 105 GB
    for value in ("840.0 GB", "350.0 GB", "227.5 GB", "105.0 GB", "248.0 MB", "84.0 GB"):
        assert value in out
    assert "210.0 GB" not in out


def test_memory_seed_faithful_prints_210(capsys):
    assert run(["calc", "memory", "--model", "llama-70b", "--seed-faithful"]) == 0
    out = capsys.readouterr().out
    assert "mode: seed-faithful" in out
    assert "210.0 GB" in out and "227.5 GB" not in out


def test_memory_json(capsys):
    report = run_json(["memory", "--model", "llama-70b,llama-7b"], capsys)
    assert report["mode"] == "corrected" and report["bytes_per_param"] == 12
    stages = report["per_gpu"][0]["stages"]
    assert [s["total"] / 1e9 for s in stages] == pytest.approx([840, 350, 227.5, 105], rel=REL)
    assert report["single_gpu"][1]["total"] / 1e9 == pytest.approx(84, rel=REL)
    assert report["single_gpu"][1]["fits"] is False


def test_memory_tp_and_master(capsys):
    report = run_json(["memory", "--params", "70B", "--tp", "8", "--zero", "3", "--master"], capsys)
    assert (report["dp"], report["tp"], report["bytes_per_param"]) == (1, 8, 16)
    assert report["per_gpu"][0]["stages"][0]["total"] / 1e9 == pytest.approx(140, rel=REL)


def test_memory_scenarios(capsys):
    assert run(["calc", "memory", "--scenario", "s4"]) == 0
    out = capsys.readouterr().out
    # seed 004 §12 prints [RUN]
    assert "2119.33 GB" in out and "2101.97 GB" in out and "19.33 GB" in out
    report = run_json(["memory", "--scenario", "seed001"], capsys)
    # seed 001 §6, closed form: 70B * (2 + 2 + 8 + 10 * 2) bytes = 2240 GB
    assert report["rows"][0]["total"] / 1e9 == pytest.approx(2240, rel=REL)
    assert report["rows"][2]["total"] / 1e9 == pytest.approx((140 + 140 + 560 + 420) / 8, rel=REL)


def test_memory_plot(tmp_path, capsys):
    path = tmp_path / "memory.png"
    assert run(["calc", "memory", "--model", "llama-70b", "--plot", str(path)]) == 0
    assert path.read_bytes()[:4] == PNG_MAGIC
    assert str(path) in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "gpt-5"], "unknown model 'gpt-5'"),
        (["--params=-5B"], "> 0"),
        (["--params", "lots"], "not a count"),
        (["--gpus", "8", "--tp", "3"], "--gpus 8 does not factor into --tp 3"),
        (["--gpus", "0"], "must be a positive integer"),
        (["--params", "7B", "--activations", "simple"], "needs --d-model and --layers"),
        (["--scenario", "s4", "--model", "llama-7b"], "cannot be combined"),
    ],
)
def test_memory_bad_input(argv, message, capsys):
    assert run(["calc", "memory", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err


def test_flops(capsys):
    assert run(["calc", "flops"]) == 0
    out = capsys.readouterr().out
    # 24 d^2 for d = 12288 (seed 001 §5); ratios of its 6N check
    assert "3,623,878,656" in out and "2.0x" in out and "3.0x" in out
    for ratio in ("0.95", "0.93", "1.00"):
        assert ratio in out
    report = run_json(["flops", "--attention", "--seed-faithful"], capsys)
    assert report["mode"] == "seed-faithful"
    assert report["attention_scores_per_layer"] == 2 * 12288 * 2048**2
    report = run_json(["flops", "--attention", "--model", "gpt2-124m"], capsys)
    assert report["attention_scores_per_layer"] == 4 * 1024 * 768


def test_chinchilla(tmp_path, capsys):
    path = tmp_path / "chinchilla.png"
    assert run(["calc", "chinchilla", "--plot", str(path)]) == 0
    out = capsys.readouterr().out
    # seed 001 §2: 6 * 175e9 * 3.5e12 / 1e21 = 3675.00; ratios 1.7x and 28.6x
    assert "3,675.00" in out and "1.7x" in out and "28.6x" in out
    assert path.read_bytes()[:4] == PNG_MAGIC
    report = run_json(["chinchilla", "--params", "1B", "--tokens", "100B"], capsys)
    assert report["models"][0]["optimal_tokens"] == pytest.approx(20e9, rel=REL)
    assert report["actual"][0]["tokens_per_param"] == pytest.approx(100, rel=REL)
    assert run(["calc", "chinchilla", "--params", "7B,0"]) == 2
    assert "> 0" in capsys.readouterr().err
    assert run(["calc", "chinchilla", "--tokens", "1T"]) == 2


def test_moe(capsys):
    assert run(["calc", "moe"]) == 0
    out = capsys.readouterr().out
    # seed 001 §3 (code values) and seed 002 ch7 (DeepSeek-V3)
    for value in ("1,860.0B", "320.0B", "17.2%", "31.1%", "8.0%", "671.0B", "37.0B"):
        assert value in out
    report = run_json(
        ["moe", "--shared", "2B", "--experts", "8", "--expert-size", "1B", "--top-k", "2"], capsys
    )
    assert report["models"][0]["total_params"] == pytest.approx(10e9, rel=REL)
    assert report["models"][0]["active_params"] == pytest.approx(4e9, rel=REL)
    assert run(["calc", "moe", "--experts", "8"]) == 2
    assert "needs all of" in capsys.readouterr().err
    bad = ["--shared", "2B", "--experts", "8", "--expert-size", "1B", "--top-k", "9"]
    assert run(["calc", "moe", *bad]) == 2


def test_time(capsys):
    assert run(["calc", "time"]) == 0
    out = capsys.readouterr().out
    # 8.4e23 FLOPs / (512 * 312e12 * 0.5) = 121.7 days; seed 004 §2
    assert "121.7" in out and "83,333 hours (3,472 days)" in out
    assert "$26,280" in out and "$27,648" in out and "20,833" in out
    report = run_json(["time", "--gpu", "h100", "--gpus", "1024"], capsys)
    seconds = 6 * 70e9 * 2e12 / (1024 * 989.5e12 * 0.5)  # a named GPU: jaxscale/hardware.py
    assert report["runs"][0]["days"] == pytest.approx(seconds / 86400, rel=REL)
    assert report["throughput_hours"] == pytest.approx(300e9 / 1000 / 3600, rel=REL)
    assert run(["calc", "time", "--mfu", "1.5"]) == 2
    assert run(["calc", "time", "--gpu", "v100"]) == 2
    assert "unknown GPU 'v100'" in capsys.readouterr().err


def test_time_default_is_seed001_table_at_its_990(capsys):
    # seed 001 §4 GPUSpecs: the seed's table uses H100 990 TFLOPS (hardware.py: 989.5)
    report = run_json(["time"], capsys)
    h100 = [r for r in report["runs"] if r["gpu"] == "h100"]
    assert {r["peak_tflops"] for r in h100} == {990}
    assert (report["sweep_gpu"], report["sweep_peak_tflops"]) == ("h100", 990)
    seconds = 6 * 70e9 * 2e12 / (1024 * 990e12 * 0.5)
    assert report["mfu_sweep"][2]["days"] == pytest.approx(seconds / 86400, rel=REL)
    report = run_json(["time", "--gpu", "h100,tpu-v5e", "--sweep-gpu", "h100"], capsys)
    assert [r["peak_tflops"] for r in report["runs"][::3]] == [989.5, 197]
    assert report["sweep_peak_tflops"] == 989.5


def test_comm(capsys):
    assert run(["calc", "comm"]) == 0
    out = capsys.readouterr().out
    # seed 002 ch6 tp_mlp goldens and the 2.5x of the ch5 volume table
    for value in ("4,096", "16.0 KB", "24.0 KB", "96.0 KB", "2.5x", "134.22M", "16.78M"):
        assert value in out
    assert "InfiniBand (50 GB/s)" in out
    report = run_json(["comm", "--seed-faithful"], capsys)
    # seed 001 §7 seed model: ZeRO-1 all-reduce of 2 x 140 GB at 400 GB/s + 2 us
    assert report["zero"][1]["step_ms"] == pytest.approx(700.002, rel=REL)
    assert report["tensor_parallel"][1]["bandwidth_gb_s"] == 400
    assert run(["calc", "comm", "--tp", "0"]) == 2
    assert run(["calc", "comm", "--link", "carrier-pigeon"]) == 2


def test_scaling(tmp_path, capsys):
    path = tmp_path / "scaling.png"
    assert run(["calc", "scaling", "--plot", str(path)]) == 0
    out = capsys.readouterr().out
    # seed 004 §4, §10 and §5 goldens
    for value in ("96.2%", "62.5%", "76.9%", "52.1%", "4.71x", "2.11x", "WARNING"):
        assert value in out
    assert "130 ms" in out and "260 ms" in out and "30.8%" in out
    assert path.read_bytes()[:4] == PNG_MAGIC
    report = run_json(["scaling", "--layers", "13", "--seed-faithful"], capsys)
    assert report["naive_model_parallel"]["layers_per_gpu"] == [4, 4, 4]
    report = run_json(["scaling", "--compute-s", "50", "--comm-s", "50", "--num-gpus", "4"], capsys)
    assert report["amdahl"][0]["max_speedup"] == pytest.approx(1 / (0.5 + 0.5 / 4), rel=REL)
    assert run(["calc", "scaling", "--strong-times", "1,2"]) == 2
    assert "one time per GPU count" in capsys.readouterr().err
    assert run(["calc", "scaling", "--compute-s", "5"]) == 2
    assert run(["calc", "scaling", "--layers", "2", "--mp-gpus", "3"]) == 2


@pytest.mark.parametrize("command", ["memory", "flops", "chinchilla", "moe", "time", "comm"])
def test_json_is_one_object(command, capsys):
    report = run_json([command], capsys)
    assert report["command"] == command
