"""Seed 002's json_constraint_demo.py: its printed run with seed 42 and the 685-of-5000 cut
(what the seed's script prints when run), and the corrected mask's guarantee."""

import json

from jaxscale.cli import main
from jaxscale.sim import json_demo as jd


def test_the_seed_42_run_as_printed(capsys):
    assert main(["simulate", "json", "--seed-faithful", "--json", "--fuzz", "10"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(s["state"], s["masked"], s["chosen"]) for s in out["masking"]] == [
        ("START", 15, "{"),
        ("OBJECT_START", 12, "}"),
    ]
    assert out["unconstrained"] == '"id""value""value":][456}{[' and out["constrained"] == "{}"


def test_the_seed_cuts_685_of_5000_documents_and_the_budgeted_mask_none():
    assert jd.fuzz(5000, 15, seed_faithful=True)["truncated"] == 685
    fixed = jd.fuzz(5000, 15, seed_faithful=False)
    assert fixed["truncated"] == 0 and fixed["parse"] == 5000


def test_tight_budgets_still_close_every_document():
    for budget in range(2, 9):
        r = jd.fuzz(300, budget, seed_faithful=False)
        assert r["parse"] == 300, (budget, r)


def test_seed_is_honoured_where_the_seed_ignores_it(capsys):
    runs = {}
    for seed in (0, 1, 42):
        main(["simulate", "json", "--json", "--fuzz", "1", "--seed", str(seed)])
        runs[seed] = json.loads(capsys.readouterr().out)["constrained"]
        main(["simulate", "json", "--json", "--fuzz", "1", "--seed", str(seed), "--seed-faithful"])
        assert json.loads(capsys.readouterr().out)["constrained"] == "{}"  # always seed 42's
    assert len(set(runs.values())) > 1
    for text in runs.values():
        json.loads(text)
