"""Fuzz `train --config FILE` field by field: every field of every section (model, train, run)
given each JSON value of a wrong type must be refused with one error line naming
`section.field`, before anything is written (the contract in tests/cli_fuzz.py)."""

import json

import pytest
from cli_fuzz import check, run

from jaxscale.cliutil import dataclass_kinds
from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.train.cli import RUN_KINDS

# JSON values of each type; a field refuses those that are not of its kind
VALUES = {"string": "x", "fraction": 1.5, "bool": True, "list": [], "object": {}, "null": None}
ACCEPTS = {  # the value types each kind of field takes
    "int": set(),
    "float": {"fraction"},
    "str": {"string"},
    "bool": {"bool"},
    "int?": {"null"},
    "str?": {"string", "null"},
}
SECTIONS = {
    "model": dataclass_kinds(ModelConfig)[0],
    "train": dataclass_kinds(TrainConfig)[0],
    "run": RUN_KINDS,
}
# a field that also takes an older spelling: remat was a switch before its policies (true:
# block, false: none; tests/train/test_workflow.py)
LEGACY = {("model", "remat"): {"bool"}}
CASES = [
    pytest.param(section, key, value, id=f"{section}.{key}={name}")
    for section, kinds in SECTIONS.items()
    for key, kind in kinds.items()
    for name, value in VALUES.items()
    if name not in ACCEPTS[kind] | LEGACY.get((section, key), set())
]


@pytest.mark.parametrize("section, key, value", CASES)
def test_a_wrong_type_in_a_config_file_is_named_and_refused(section, key, value, tmp_path):
    files = {"{config}": json.dumps({section: {key: value}})}
    outcome = run(["train", "--config", "{config}", "--dry-run"], tmp_path / "work", files)
    check(outcome, (f"{section}.{key}",), must_fail=True)


def test_every_field_kind_is_fuzzed():
    kinds = {kind for section in SECTIONS.values() for kind in section.values()}
    assert kinds <= set(ACCEPTS), kinds - set(ACCEPTS)
    assert len(CASES) > 200
