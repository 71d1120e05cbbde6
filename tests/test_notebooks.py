"""The notebooks: each `.ipynb` (what Colab opens) is its paired jupytext script with outputs
stripped, and the tour runs top to bottom in a real Jupyter kernel (nbclient) on 8 simulated CPU
devices, its cells producing what they claim to."""

import json
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext", reason="dev extra: pip install -e '.[dev]'")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
PAIRS = sorted(NOTEBOOKS.glob("*.py"))


def test_there_is_a_tour():
    assert NOTEBOOKS / "tour.py" in PAIRS


@pytest.mark.parametrize("script", PAIRS, ids=lambda p: p.stem)
def test_ipynb_is_its_script_with_outputs_stripped(script):
    ipynb = script.with_suffix(".ipynb")
    assert ipynb.exists(), f"run `make notebooks` to write {ipynb.name}"
    want = jupytext.read(script)
    got = json.loads(ipynb.read_text())
    assert [(c["cell_type"], "".join(c["source"])) for c in got["cells"]] == [
        (c.cell_type, c.source) for c in want.cells
    ], f"{ipynb.name} differs from {script.name}: run `make notebooks`"
    for cell in got["cells"]:
        assert cell.get("outputs", []) == [] and cell.get("execution_count") is None


def _text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts.append(out.get("text", ""))
        parts.append(out.get("data", {}).get("text/plain", ""))
    return "".join(parts)


@pytest.mark.slow  # CI runs it on the newest-jax line: Colab's (not first_line)
def test_the_tour_runs_top_to_bottom_in_a_kernel(tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # the CPU runtime's path: 8 simulated devices
    monkeypatch.delenv("JAX_NUM_CPU_DEVICES", raising=False)  # the notebook chooses
    nb = jupytext.read(NOTEBOOKS / "tour.py")
    client = nbclient.NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    code = [c for c in nb.cells if c.cell_type == "code"]
    texts = [_text(c) for c in code]
    assert "CPU runtime" in texts[0]
    assert "psum over 8 devices of (index+1) = 36" in texts[1]
    assert texts[2].count("holds rows") == 4
    images = sum(
        o.get("output_type") == "display_data" and "image/png" in o.get("data", {})
        for c in code
        for o in c.get("outputs", [])
    )
    assert images >= 4  # bench, loss curve, pipeline grids, PPO learning curve
    for name in (
        "results/tour/bench_meshes.json",
        "runs/tour/metrics.jsonl",
        "results/tour/ppo/learning_curve.png",
    ):
        assert (tmp_path / name).exists(), name
    served = next(t for t in texts if "engine steps" in t)
    assert served.startswith("def ") and "compiled shapes" in served
    rows = json.loads((tmp_path / "results/tour/bench_meshes.json").read_text())["rows"]
    assert all(r["equivalent"] for r in rows), [r["label"] for r in rows if not r["equivalent"]]
