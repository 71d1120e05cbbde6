"""`jaxscale bench serve` on a small workload: the engine's step counts equal `simulate
batching`'s for static and continuous batching, paging fits as many more requests as `calc kv`'s
fragmentation model says, the prefix cache's hit rate equals `calc prefix`'s saved fraction, and
latency figures come back from both the in-process and the HTTP (openai client) runs."""

import json
import math

import pytest

pytest.importorskip("openai")
pytest.importorskip("uvicorn")
# every engine shape compiled, a server on a loopback port
pytestmark = [pytest.mark.slow, pytest.mark.first_line]

from jaxscale.bench import serve as bench  # noqa: E402
from jaxscale.cli import main as cli_main  # noqa: E402


@pytest.fixture(scope="module")
def result():
    """One run for the module (every engine shape compiled once): 8 requests on 2 slots, so
    static batching waits for each batch's longest request while continuous batching refills."""
    return bench.run(bench.Setup(n_requests=8, max_num_seqs=2, rates=(50.0,)), http=True)


def test_bench_serve_figures_against_their_predictions(result):
    b = result["batching"]
    for policy in ("static", "continuous"):
        assert b[policy]["steps"] == b[policy]["predicted_steps"], policy
    assert b["continuous"]["steps"] < b["static"]["steps"]
    assert b["continuous"]["tokens"] == b["static"]["tokens"] == sum(b["lengths"])

    c = result["capacity"]  # requests of 64 positions in a context of 256
    assert c["paged_at_full_length"] / c["contiguous"] == pytest.approx(c["calc_kv_ratio"])
    # the pool really held them at once (more, while some were still in prefill)
    assert c["paged_peak_running"] >= c["paged_at_full_length"] > c["contiguous"]
    # an int8 pool of the same bytes holds bf16 / (values + scales) times the pages and the
    # requests: 2K / (K + 4) for head_dim K (the pool's own arrays measured by bytes_per_token)
    K = c["head_dim"]
    assert c["bytes_per_token"]["bfloat16"] / c["bytes_per_token"]["int8"] == 2 * K / (K + 4)
    assert c["int8_pages"] == c["pages"] * 2 * K // (K + 4)
    assert c["int8_at_full_length"] == c["int8_pages"] // c["pages_per_request"]
    assert c["int8_peak_running"] >= c["int8_at_full_length"] > c["paged_at_full_length"]

    p = result["prefix"]
    assert p["hit_rate"] == pytest.approx(p["calc_prefix_saved_fraction"], abs=1e-12)
    assert p["hit_rate"] > 0.5

    for path in ("in_process", "read_first", "http"):
        m = result[path][50.0]
        assert all(
            math.isfinite(m[k]) and m[k] > 0 for k in ("ttft_p50_ms", "tpot_p50_ms", "tokens_per_s")
        )
        assert m["ttft_p99_ms"] >= m["ttft_p50_ms"]


def test_the_command_prints_its_table_and_writes_json_and_plot(
    result, tmp_path, capsys, monkeypatch
):
    """The command's own part -- its flags, the table, the JSON and the plot -- on the module's
    run (the same `run` the command calls, without its HTTP part), not a second workload."""
    calls = []

    def run(setup, http, progress=None, layouts=False, decoding=False):
        calls.append((setup.n_requests, http, layouts, decoding))
        return {k: v for k, v in result.items() if k != "http"}

    monkeypatch.setattr(bench, "run", run)
    rc = cli_main(["bench", "serve", "--requests", "4", "--no-http", "--out", str(tmp_path)])
    assert calls == [(4, False, False, False)]  # neither --layouts nor --decoding given
    out = capsys.readouterr().out
    assert rc == 0
    assert "in_process" in out and "steps measured / simulate batching" in out
    data = json.loads((tmp_path / "bench_serve.json").read_text())
    assert set(data) >= {"in_process", "batching", "capacity", "prefix"}
    assert (tmp_path / "bench_serve.png").read_bytes()[:4] == b"\x89PNG"
