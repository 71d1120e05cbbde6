"""`jaxscale bench collectives`: sizes, the census check, bus bandwidth, the alpha-beta fit, and
the output flags it shares with the mesh bench (tiny sizes; timings are not asserted)."""

import json
import os
import subprocess
import sys

import pytest

from jaxscale.bench import collectives as bench
from jaxscale.cli import main as cli_main


def _run(argv, out_dir, capsys):
    """`jaxscale bench collectives ...` in-process: (exit code, stdout, stderr)."""
    try:
        rc = cli_main(["bench", "collectives", "--out", str(out_dir), *argv])
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_parse_sizes():
    assert bench.parse_sizes("1K:64M") == [2**10 * 4**k for k in range(9)]  # 1 KB .. 64 MB
    assert bench.parse_sizes("1K,1M,4096") == [1024, 2**20, 4096]
    for bad in ("0", "1X", "64M:1K"):
        with pytest.raises(ValueError):
            bench.parse_sizes(bad)


def test_fit_recovers_a_known_alpha_and_bandwidth():
    alpha, busbw, n = 50e-6, 2e9, 8
    rows = []
    for size in (1e3, 1e5, 1e7):
        bus = size * 2 * (n - 1) / n  # all-reduce bus bytes
        t = alpha + bus / busbw
        rows.append(bench.Row("psum", int(size), t, size / t, bus / t, "", True))
    fit = bench.fit_alpha_beta(rows, n)
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert fit.busbw_Bps == pytest.approx(busbw, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0)


def test_json_report_census_and_bus_bandwidth(tmp_path, capsys):
    plot = tmp_path / "plots" / "collectives.png"  # a missing parent directory is created
    rc, out, _ = _run(
        [
            "--json",
            "--sizes",
            "1K,16K",
            "--repeats",
            "2",
            "--ops",
            "psum,ring,all_gather",
            "--plot",
            str(plot),
        ],
        tmp_path,
        capsys,
    )
    assert rc == 0
    report = json.loads(out)
    assert report == json.loads((tmp_path / "bench_collectives.json").read_text())  # --out
    assert report["census_ok"] is True and report["devices"] == 8
    rows = {(r["variant"], r["size_bytes"]): r for r in report["rows"]}
    assert len(rows) == 6
    ring = rows[("ring", 16384)]
    # seed 002 ch4 ring: 2(N-1) steps of D/N -> 14 collective-permutes of 2 KB on 8 devices
    assert ring["census"] == "14 x collective-permute 2.0 KiB"
    psum = rows[("psum", 1024)]
    assert psum["busbw_Bps"] == pytest.approx(psum["algbw_Bps"] * 2 * 7 / 8)  # seed 002 ch4
    assert {f["variant"] for f in report["fits"]} == {"psum", "ring", "all_gather"}
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_report_labels_cpu_timings(capsys, tmp_path):
    argv = [
        "--sizes",
        "4K",
        "--repeats",
        "1",
        "--ops",
        "psum_scatter,all_to_all,ppermute",
        "--no-plot",
    ]
    rc, out, _ = _run(argv, tmp_path, capsys)
    assert rc == 0
    assert "indicative only" in out and "host-memory copies" in out
    assert "ok: 1 x reduce-scatter 4.0 KiB" in out
    assert "ok: 1 x all-to-all 4.0 KiB" in out and "ok: 1 x collective-permute 4.0 KiB" in out
    assert "alpha-beta fit" in out
    assert not list(tmp_path.glob("*.png"))  # --no-plot


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--ops", "psum,allreduce"], "unknown --ops allreduce"),
        (["--sizes", "0"], "positive"),
        (["--repeats", "0"], "--repeats"),
    ],
)
def test_bad_input_exits_2(argv, message, capsys, tmp_path):
    rc, _, err = _run([*argv, "--no-plot"], tmp_path, capsys)
    assert rc == 2 and message in err


def test_a_single_device_is_refused():
    code = (
        "import sys; from jaxscale.cli import main; "
        "sys.exit(main(['bench', 'collectives', '--sizes', '1K', '--no-plot']))"
    )
    env = dict(os.environ, JAX_NUM_CPU_DEVICES="1", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 2 and "at least 2 devices" in out.stderr
