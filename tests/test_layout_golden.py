"""Golden layouts: every parameter's PartitionSpec (stored, and as the optimizer sees its
gradient) per strategy and mesh of verify's case list, diffed against JSON files under
tests/golden/layouts/ -- so a layout change shows up in review as a diff, not as a surprise.

After an intended change, regenerate and review the diff:
    JAXSCALE_UPDATE_GOLDEN=1 pytest tests/test_layout_golden.py
"""

import json
import os
from pathlib import Path

import jax
import pytest

from jaxscale import verify
from jaxscale.parallel.compose import build

GOLDEN = Path(__file__).parent / "golden" / "layouts"
UPDATE = os.environ.get("JAXSCALE_UPDATE_GOLDEN") == "1"


# one file per strategy x mesh: the f32, AdamW, no-accumulation variant of each (dense, and the
# MoE cases' model)
def _plain(c: verify.Case) -> bool:
    return c.label in (c.strategy.label(), verify.Case(c.strategy, model=verify.MOE).label)


# the suite runs on 8 devices: the 16-device case is checked by `jaxscale verify` alone
CASES = {f"{c.label}@{c.mesh}": c for c in verify.CASES if _plain(c) and c.n_devices <= 8}


def _spec(sharding) -> list:
    return [list(e) if isinstance(e, tuple) else e for e in sharding.spec]


def layout(case: verify.Case) -> dict:
    built = build(case.strategy, *case.configs(verify.CFG, verify.TCFG))
    flat = jax.tree_util.tree_flatten_with_path(built.state_shardings["params"])[0]
    grads = jax.tree.leaves(built.grad_shardings)
    return {
        "strategy": built.label,
        "mesh": case.mesh,
        "zero_stage": built.zero_stage,
        "params": {
            jax.tree_util.keystr(path, simple=True, separator="/"): _spec(s) for path, s in flat
        },
        "grads": {
            jax.tree_util.keystr(path, simple=True, separator="/"): _spec(g)
            for (path, _), g in zip(flat, grads, strict=True)
        },
    }


def _dumps(d: dict) -> str:
    """JSON with one parameter per line, so a layout change is a one-line diff."""
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            items = [f"  {json.dumps(n)}: {json.dumps(s)}" for n, s in sorted(v.items())]
            out.append(f"{json.dumps(k)}: {{\n" + ",\n".join(items) + "\n }")
        else:
            out.append(f"{json.dumps(k)}: {json.dumps(v)}")
    return "{\n " + ",\n ".join(out) + "\n}\n"


def _path(key: str) -> Path:
    return GOLDEN / (key.replace(":", "_").replace(",", "_").replace(" ", "_") + ".json")


@pytest.mark.parametrize("key", sorted(CASES))
def test_layout_matches_golden(key):
    got = layout(CASES[key])
    path = _path(key)
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_dumps(got))
    assert path.exists(), f"no golden layout for {key}: run with JAXSCALE_UPDATE_GOLDEN=1"
    assert json.loads(path.read_text()) == got


def test_every_golden_file_belongs_to_a_case():
    assert {p.name for p in GOLDEN.glob("*.json")} == {_path(k).name for k in CASES}


def test_golden_layouts_say_what_each_strategy_shards():
    """Spot checks that read the files as a reviewer would (so they cannot be regenerated into
    nonsense unnoticed): ZeRO-3 + TP splits wq over fsdp and tensor; DP keeps it whole."""
    z3 = json.loads(_path("manual:zero3+tp@fsdp=4,tp=2").read_text())
    assert z3["params"]["blocks/wq_DHK"] == [None, "fsdp", "tensor", None]
    dp = json.loads(_path("manual:dp@dp=8").read_text())
    assert dp["params"]["blocks/wq_DHK"] == [None, None, None, None]
    z2 = json.loads(_path("manual:zero2@dp=8").read_text())
    assert z2["params"]["blocks/wq_DHK"] == [None, None, None, None]  # params whole ...
    assert z2["grads"]["blocks/wq_DHK"] == [None, "data", None, None]  # ... grads sharded
