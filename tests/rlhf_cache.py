"""Tiny random SFT and reward models put where `jaxscale rlhf --sft-steps 1 --rm-steps 1` looks
for them, so a test's RLHF run loads them instead of training (tests/rlhf, the signal fuzz)."""

import json
from pathlib import Path

from jaxscale.config import ModelConfig
from jaxscale.rlhf import setup
from jaxscale.rlhf.task import TaskConfig

# the CLI's task is the default one: prompt 16 + response 24 tokens fill max_seq
CFG = ModelConfig(d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64, max_seq=40)
TINY = ["--sft-steps", "1", "--rm-steps", "1", "--responses", "8", "--epochs", "1"]
TINY += ["--minibatches", "1", "--no-progress"]


def seed_cache(runs: Path) -> None:
    c = setup.cache(runs, TaskConfig(), 1, 1)
    runs.mkdir(parents=True, exist_ok=True)
    actor, rm = setup.random_models(CFG, 0)
    setup.save_tree(c.sft, actor)
    c.sft.with_suffix(".json").write_text(json.dumps(CFG.__dict__))
    setup.save_tree(c.rm, rm)
    acc = {"train_pairs": 1, "held_out_pairs": 1, "train_accuracy": 1.0, "held_out_accuracy": 1.0}
    c.rm.with_suffix(".json").write_text(json.dumps(acc))
