"""`jaxscale calc inference|serving|kv|prefix|rl` run in-process: tables, --json, --plot, modes and
exit code 2 on bad input. Golden values cite the seeds as in the library tests."""

import json
import subprocess
import sys

import pytest

from jaxscale.cli import main

PCT_TOL = 0.05  # percentage points
GB_TOL = 0.05  # one-decimal GB as printed by the seeds


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["calc", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def run_json(capsys, *argv: str) -> dict:
    rc, out, _ = run(capsys, *argv, "--json")
    assert rc == 0
    return json.loads(out)


def test_inference_table_and_modes(capsys):
    rc, out, _ = run(capsys, "inference")
    assert rc == 0 and "mode: corrected" in out and "KV per token: 327,680 B" in out
    assert "Short prompt, short gen" in out and "156 FLOP/B" in out  # seed 003 A100 ridge
    rc, out, _ = run(capsys, "inference", "--seed-faithful")
    assert "mode: seed-faithful" in out and "KV per token: 2,621,440 B" in out
    assert "2103.7" in out and "181.6" in out  # seed 001's printed total ms and tokens/s


def test_inference_json(capsys):
    report = run_json(capsys, "inference", "--prompt-len", "2000", "--gen-len", "50")
    (row,) = report["scenarios"]
    assert (row["prompt_len"], row["batch_size"], row["prefill_bound"]) == (2000, 1, "compute")
    assert row["kv_per_seq_bytes"] == 2050 * 327_680
    mem = report["serving_memory"]  # seed 002 ch8 with ch9's KV (defect 19)
    assert mem["kv_per_request_bytes"] == 10 * 1024**3 and mem["num_requests"] == 100
    seed = run_json(capsys, "inference", "--seed-faithful")["serving_memory"]
    assert seed["kv_total_bytes"] == 200e9


def test_gpu_figures_from_the_hardware_table(capsys):
    # no --gpu: seed 001's H100 at its rounded 990 TFLOPS; --gpu h100: the datasheet's 989.5
    assert "on H100 80GB (990 TFLOPS, 3.35 TB/s)" in run(capsys, "inference")[1]
    assert "on H100 80GB (989.5 TFLOPS, 3.35 TB/s)" in run(capsys, "inference", "--gpu", "h100")[1]
    for gpu in ("h200", "a100-40", "4090"):  # figures the seeds never gave
        rc, out, _ = run(capsys, "serving", "--gpu", gpu)
        assert rc == 0 and "TB/s" in out


def test_serving_modes(capsys):
    seed = run_json(capsys, "serving", "--seed-faithful")
    assert [s["gpus_needed"] for s in seed["scenarios"]] == [22, 211, 1052]  # seed 001 output
    fixed = run_json(capsys, "serving")
    assert [s["gpus"] for s in fixed["scenarios"]] == [4, 4, 16]
    assert all(s["request_latency_s"] <= 1.0 for s in fixed["scenarios"])
    rc, out, _ = run(capsys, "serving", "--users", "100", "--target-latency-ms", "5")
    assert rc == 0 and "no tp <= 8 meets the target" in out


def test_kv_default_uses_an_8_gpu_node(capsys):
    report = run_json(capsys, "kv")
    per_token = [m["kv_bytes_per_token"] // 1024 for m in report["models"]]
    assert per_token == [512, 800, 320, 128, 320, 380]  # KiB, [R] six-model table
    cap = report["capacity"]
    assert (cap["num_gpus"], cap["min_gpus_to_fit"]) == (8, 2)
    rows = {r["context_len"]: r for r in cap["rows"]}
    assert rows[4096]["max_requests"] == 484 * 1024**3 // (327_680 * 4096)
    waste = [f["waste_fraction"] * 100 for f in report["fragmentation"]]
    assert waste == pytest.approx([93.75, 75.0, 87.5, 93.75], abs=PCT_TOL)


def test_kv_seed_faithful_single_gpu(capsys):
    rc, out, _ = run(capsys, "kv", "--seed-faithful")
    assert rc == 0 and out.count("Model does not fit in GPU memory") == 4  # defect 8
    report = run_json(capsys, "kv", "-m", "llama-7b", "--seed-faithful")
    row8k = {r["context_len"]: r for r in report["capacity"]["rows"]}[8192]
    assert report["capacity"]["rows"][0]["available_gib"] == 64.0  # [R] 64.0 GB available
    assert (row8k["requests_without_paging"], row8k["requests_with_paging"]) == (8, 15)


def test_kv_custom_and_prose_capacity(capsys):
    # the prose's 8 x H100 with ~20 GB overhead: 480 GB -> 1.57M tokens -> 384/192/48 (~375/187/46)
    report = run_json(capsys, "kv", "--num-gpus", "8", "--overhead-gb", "2.5")
    rows = {r["context_len"]: r["max_requests"] for r in report["capacity"]["rows"]}
    assert (rows[4096], rows[8192], rows[32768]) == (384, 192, 48)
    custom = run_json(capsys, "kv", "--custom", "--layers", "12", "--heads", "12", "--dim", "64")
    assert custom["models"][-1]["kv_bytes_per_token"] * 1024 == 37_748_736  # seed 003: 37.7 MB
    assert custom["capacity"]["model_size_gb"] == 14.0


def test_prefix_output(capsys):
    rc, out, _ = run(capsys, "prefix")
    assert rc == 0 and "saved 54.4%" in out and "16.22 GB (82.5%)" in out
    assert "163.84 MB" in out and "32.44 GB (94.3%)" in out  # [R]
    report = run_json(capsys, "prefix", "-n", "10")
    assert report["radix_demo"]["unique_kv_entries"] == 26
    assert report["system_prompt"]["saved_fraction"] == pytest.approx(1 - 1500 / 6000)


def test_rl_throughput_and_plot(capsys, tmp_path):
    seed = run_json(capsys, "rl", "throughput", "--seed-faithful")
    assert round(seed["speedup"], 2) == 1.10 and round(seed["average_speedup"], 2) == 1.09
    path = tmp_path / "rl.png"
    rc, out, _ = run(capsys, "rl", "throughput", "--plot", str(path))
    assert rc == 0 and "Async, best split" in out
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rl_memory_and_timeline(capsys):
    assert run_json(capsys, "rl", "memory")["total_gb"] == 132  # seed 002 ch13 (~130)
    fixed = run_json(capsys, "rl", "timeline")
    totals = [p["total_gb"] for p in fixed["phases"]]
    assert totals == pytest.approx([443.5, 161.5, 1227.4], abs=GB_TOL)  # [R]
    assert fixed["full_rlhf"]["fixed_gb"] == pytest.approx(1400.0)
    assert fixed["recommendation"]["gpus_needed"] == 20
    seed = run_json(capsys, "rl", "timeline", "--seed-faithful")
    assert seed["full_rlhf"]["fixed_gb"] == pytest.approx(560.0)  # defect 12
    assert seed["full_rlhf"]["scaling_gb"] == pytest.approx(968.8, abs=GB_TOL)
    assert seed["recommendation"]["gpus_needed"] == 19


def test_rl_transfer_modes(capsys):
    fixed = run_json(capsys, "rl", "transfer")
    assert [m["method"] for m in fixed["architectures"]["co-located"]] == [
        "disk_ssd",
        "disk_hdd",
        "cuda_ipc",
    ]
    seed = run_json(capsys, "rl", "transfer", "--seed-faithful")
    assert len(seed["architectures"]["co-located"]) == 6  # defect 13
    ib = seed["timelines"][1]
    assert round(ib["total_s"], 2) == 55.70 and round(ib["overhead"] * 100, 1) == 10.2


@pytest.mark.parametrize(
    "argv",
    [
        ["kv", "--model", "llama-9000"],
        ["kv", "--layers", "-3", "--custom"],
        ["kv", "--contexts", "0,4096"],
        ["inference", "--batch-size", "0"],
        ["serving", "--users", "-10"],
        ["rl", "throughput", "--gpus", "0"],
        ["rl", "timeline", "-m", "175b"],
        ["rl", "transfer", "--model-size", "-140"],
        ["prefix", "-n", "0"],
        ["rl", "transfer", "--transfers", "-1"],
    ],
)
def test_argparse_rejects_bad_input_with_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(["calc", *argv])
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["kv", "--seed-faithful", "--num-gpus", "8"], "drop --gpus"),
        (["rl", "throughput", "--gen-gpus", "256"], "none of --gpus 256 to train"),
        (["rl", "transfer", "--seed-faithful", "--transfers", "1"], "drop --transfers"),
    ],
)
def test_library_errors_exit_2_with_one_line(capsys, argv, message):
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    assert message in err and err.count("\n") == 1


def test_modules_do_not_import_jax():
    modules = [
        "kv",
        "prefix",
        "inference",
        "serving",
        "rl",
        "rlhf_memory",
        "weight_transfer",
        "commands.common",
        "commands.inference",
        "commands.serving",
        "commands.kv",
        "commands.prefix",
        "commands.rl",
        "commands.gae",
        "commands.reward",
    ]
    imports = "; ".join(f"import jaxscale.calc.{m}" for m in modules)
    code = f"import sys; {imports}; assert 'jax' not in sys.modules, 'jax imported'"
    code += "; assert 'matplotlib' not in sys.modules, 'matplotlib imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
