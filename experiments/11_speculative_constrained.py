"""Seed 002 chapter 11 on the real model: speculative decoding beside the simulator's closed form,
and constrained decoding with the chapter's regex examples and JSON.

    python experiments/11_speculative_constrained.py [--k 4] [--tokens 48]

1. speculative decoding with a draft that is the target plus noise (the noise sets how often the
   draft is right): measured acceptance rate and tokens per target pass, beside
   (1 - g^(k+1)) / (1 - g) at the measured per-token acceptance g (`simulate speculative`);
   greedy output checked equal to the target's own;
2. constrained decoding of the chapter's patterns (email, phone number, Python def) and of JSON,
   sampled with several seeds: every output matches / parses;
3. constrained + speculative: JSON through the draft and the target, a copy of the grammar state
   in the draft;
4. a real draft model: a target and a smaller draft config trained by `jaxscale train` on the
   standard-library corpus (kept under --runs and reused), their acceptance beside the closed
   form, greedy output checked equal to the target's own.
"""

import argparse
import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp

from jaxscale.cli import main as jaxscale_main
from jaxscale.config import ModelConfig
from jaxscale.model import counts
from jaxscale.model import state as ms
from jaxscale.serve import constrained, speculative
from jaxscale.serve import generate as gen
from jaxscale.serve.sampling import SamplingParams
from jaxscale.sim.speculative import expected_tokens_per_pass

PATTERNS = {  # seed 002 ch11 "Regex Constraints", Exercise 2
    "email": r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}",
    "phone": r"\(\d{3}\) \d{3}-\d{4}",
    "python def": r"def [a-z_]{1,12}\(([a-z_]{1,8}(, [a-z_]{1,8}){0,2})?\):",
}


def noisy(params, scale: float, seed: int):
    """The target's parameters plus Gaussian noise of `scale` x each leaf's std."""
    keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(params))))
    return jax.tree.map(
        lambda x: x + scale * jnp.std(x) * jax.random.normal(next(keys), x.shape), params
    )


TRAIN = [
    "--data",
    "stdlib",
    "--seq-len",
    "64",
    "--global-batch",
    "16",
    "--no-progress",
    "--sample-tokens",
    "0",
    "--eval-every",
    "0",
    "--log-every",
    "100",
]
TARGET_FLAGS = ["--d-model", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2"]
DRAFT_FLAGS = [
    "--d-model",
    "32",
    "--layers",
    "1",
    "--heads",
    "2",
    "--kv-heads",
    "1",
    "--d-ff",
    "64",
]


def trained(run_dir: Path, flags: list[str], steps: int):
    """(cfg, params) of a model trained on the standard-library corpus by `jaxscale train`,
    reused from `run_dir` when it already holds a finished run."""
    from jaxscale.train.checkpoint import load_model

    if not (run_dir / "checkpoints").is_dir():
        argv = ["train", *TRAIN, *flags, "--steps", str(steps), "--run-dir", str(run_dir)]
        if jaxscale_main(argv) != 0:
            raise SystemExit(f"training into {run_dir} failed")
    return load_model(str(run_dir))


def trained_pair(a) -> None:
    print(
        f"\n4. a trained draft: target d_model 64 x 2 layers, draft d_model 32 x 1 layer, "
        f"{a.trained_steps} steps each on the standard library (runs in {a.runs})"
    )
    tcfg, tparams = trained(Path(a.runs) / "target", TARGET_FLAGS, a.trained_steps)
    dcfg, dparams = trained(Path(a.runs) / "draft", DRAFT_FLAGS, a.trained_steps)
    print(f"  target {counts.param_count(tcfg):,} parameters, draft {counts.param_count(dcfg):,}")
    prompt = list(b"    def __init__(self, ")
    want = gen.generate(tparams, [prompt], tcfg, a.tokens).row(0)
    print(
        f"{'model':>8} {'mode':>7} {'accepted':>9} {'gamma':>7} {'tok/pass':>9} "
        f"{'closed form':>12} {'= target':>9}"
    )
    for mode, s in (
        ("greedy", SamplingParams(0.0)),
        ("T=0.7", SamplingParams(0.7, seed=1)),
        ("T=1", SamplingParams(1.0, seed=0)),
    ):
        out, st = speculative.generate(tparams, tcfg, dparams, dcfg, prompt, a.tokens, a.k, s)
        same = ("yes" if out == want else "no") if mode == "greedy" else "-"
        print(
            f"{'trained':>8} {mode:>7} {st.acceptance:>9.1%} {st.gamma:>7.1%} "
            f"{st.tokens_per_pass:>9.2f} {expected_tokens_per_pass(st.gamma, a.k):>12.2f} "
            f"{same:>9}"
        )
        if mode == "T=0.7":
            print(f"{'':>8} {'':>7} {bytes(prompt + out).decode(errors='replace')!r}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--k", type=int, default=4, help="draft tokens per target pass")
    p.add_argument("--tokens", type=int, default=48, help="tokens per generation")
    p.add_argument(
        "--trained-steps",
        type=int,
        default=300,
        help="training steps of the trained pair (0: skip part 4)",
    )
    p.add_argument(
        "--runs", default="runs/11_speculative", help="where the trained pair is kept (and reused)"
    )
    a = p.parse_args()
    cfg = ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2, max_seq=128)
    target = ms.init_params(cfg, 0)
    prompt = list(b"def main():\n    ")

    print(f"1. speculative decoding, k = {a.k}, {a.tokens} tokens, draft = target + noise")
    print(
        f"{'noise':>6} {'mode':>7} {'accepted':>9} {'gamma':>7} {'tok/pass':>9} "
        f"{'closed form':>12} {'= target':>9}"
    )
    want = gen.generate(target, [prompt], cfg, a.tokens).row(0)
    for scale in (0.0, 0.3, 1.0, 3.0):
        draft = noisy(target, scale, 1)
        for mode, s in (("greedy", SamplingParams(0.0)), ("T=1", SamplingParams(1.0, seed=3))):
            out, st = speculative.generate(target, cfg, draft, cfg, prompt, a.tokens, a.k, s)
            same = "yes" if out == want else "no"
            print(
                f"{scale:>6g} {mode:>7} {st.acceptance:>9.1%} {st.gamma:>7.1%} "
                f"{st.tokens_per_pass:>9.2f} {expected_tokens_per_pass(st.gamma, a.k):>12.2f} "
                f"{same if mode == 'greedy' else '-':>9}"
            )
    print("  accepted: share of drafted tokens kept; gamma: accepted / tested (a round tests its")
    print("  drafts up to the first rejection); closed form (1 - g^(k+1)) / (1 - g) at that gamma")

    print("\n2. constrained decoding, three seeds each")
    for name, pattern in PATTERNS.items():
        c = constrained.RegexConstraint(pattern)
        outs = [
            c.text(
                constrained.generate(
                    target, cfg, list(b"contact: "), c, 40, SamplingParams(1.0, seed=s)
                )
            ).decode()
            for s in range(3)
        ]
        ok = all(re.fullmatch(pattern, o) for o in outs)
        print(f"  {name:<11} {'all match' if ok else 'MISMATCH'}: {outs}")
    c = constrained.JsonConstraint()
    docs = [
        bytes(
            constrained.generate(target, cfg, list(b"data = "), c, 40, SamplingParams(1.0, seed=s))
        ).decode()
        for s in range(3)
    ]
    for d in docs:
        json.loads(d)  # raises if one does not parse
    print(f"  json        all parse: {docs}")

    print("\n3. constrained + speculative (JSON, draft = target + 0.3 noise)")
    draft = noisy(target, 0.3, 1)
    for s in range(2):
        out, st = speculative.generate(
            target,
            cfg,
            draft,
            cfg,
            list(b"data = "),
            40,
            a.k,
            SamplingParams(1.0, seed=s),
            constraint=c,
        )
        json.loads(bytes(out))
        print(
            f"  seed {s}: {bytes(out).decode()}   accepted {st.acceptance:.0%}, "
            f"{st.tokens_per_pass:.2f} tokens per target pass"
        )

    if a.trained_steps > 0:
        trained_pair(a)


if __name__ == "__main__":
    main()
