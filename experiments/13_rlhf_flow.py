"""The RLHF computation flow on real models: seed 002 ch. 13 (rlhf_loop_pseudo.py, Try It 1-2,
reward_calculator.py on a real response).

    .venv/bin/python experiments/13_rlhf_flow.py [--iterations 40] [--no-sweep] [--random]

Part 1: the seed's one RLHF step on 4 prompts, stage by stage, with the SFT actor and the
Bradley-Terry reward model of `jaxscale rlhf` (cached under --runs), then one real PPO update (the
seed's placeholder never updates). Part 2: Try It 1's shapes and forward passes from the config.
Part 3: Try It 2's beta sweep on 8 devices (<out>/rlhf_beta_sweep.png). Part 4: `jaxscale calc
reward`'s shaping on one real response. `--random`: a random tiny model, in seconds (the test).
"""

import argparse
from functools import partial
from pathlib import Path

from jaxscale.devices import simulated_process

simulated_process()  # process edge: 8 simulated devices, XLA:CPU sized for them

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxscale.calc import reward as calc_reward  # noqa: E402
from jaxscale.cliutil import positive_int  # noqa: E402
from jaxscale.config import ModelConfig  # noqa: E402
from jaxscale.model import pieces  # noqa: E402
from jaxscale.render import grid  # noqa: E402
from jaxscale.rlhf import models, phases  # noqa: E402
from jaxscale.rlhf import report as rlhf_report  # noqa: E402
from jaxscale.rlhf import rewards as rw  # noqa: E402
from jaxscale.rlhf import run as rlhf_run  # noqa: E402
from jaxscale.rlhf import setup as rlhf_setup  # noqa: E402
from jaxscale.rlhf import task as tk  # noqa: E402
from jaxscale.rlhf.cli import add_stage_flags  # noqa: E402
from jaxscale.rlhf.config import RLHFConfig  # noqa: E402

RANDOM_CFG = ModelConfig(d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64, max_seq=64)
BIG_BETAS = (2.0, 10.0)  # Try It 2's "beta too high", held fixed (--kl-target 0)
SWEEP_KEYS = ("true_score", "parses_rate", "rm_score", "kl", "beta", "length")


def banner(title: str) -> None:
    print(f"\n{'=' * 60}\n {title}\n{'=' * 60}", flush=True)


def shape(x) -> str:
    return "[" + ", ".join(map(str, np.shape(x))) + "]"


def vec(x, fmt: str = "+.3f") -> str:
    return "[" + ", ".join(format(float(v), fmt) for v in np.ravel(x)) + "]"


def stages(tree, ref, rm, seq_BS, valid_BN, logp_BN, beta, rc: RLHFConfig, cfg, sh):
    """Stages 2-7 in one jit. Each stage calls the library piece that the `score` phase uses, and
    the phase itself runs as well so its advantages can be compared."""
    P, m_BN = sh.P, valid_BN.astype(jnp.float32)
    o = {"ref_logp": models.response_logits_logp(ref, seq_BS, P, cfg)[0] * m_BN}
    o["rm"] = models.reward_forward(rm, seq_BS, P + rw.last_index(valid_BN), cfg)
    o["k1"] = rw.kl_per_token(logp_BN, o["ref_logp"], "k1") * m_BN
    o["k3"] = rw.kl_per_token(logp_BN, o["ref_logp"], "k3") * m_BN
    o["values"] = phases.values(tree, seq_BS, P, cfg, pieces.DENSE) * m_BN
    o["rewards"] = rw.shaped_rewards(o["rm"], o["k1"], m_BN, beta, "response")
    o["adv"], o["ret"] = phases.advantages(rc, o["rewards"], o["values"], m_BN)
    o["adv_response"] = rw.whiten(o["adv"], m_BN, "response")
    o["adv_batch"] = rw.whiten(o["adv"], m_BN, "batch")
    o["new_logp"] = models.response_logits_logp(tree["actor"], seq_BS, P, cfg)[0]
    mb = {
        "seq": seq_BS,
        "mask": m_BN,
        "old_logp": logp_BN,
        "adv": o["adv_response"],
        "ret": o["ret"],
    }
    _, o["loss"] = phases.loss(tree, mb, beta, rc, cfg, sh, pieces.DENSE)
    o["phase"], _ = phases.score(
        tree, ref, rm, seq_BS, valid_BN, logp_BN, beta, rc.replace(whiten="response"), cfg, sh
    )
    return o


def flow(cfg, actor, rm, prompts_BP, args, task):
    """Part 1: one RLHF step, printed in the seed's order; returns what part 4 needs."""
    rc = RLHFConfig(seed=args.seed)
    sh = phases.Shapes(task.prompt_len, task.max_new, tk.EOS)
    B, P, N, beta = len(prompts_BP), sh.P, sh.N, rc.beta
    tree = models.policy_init(actor, cfg, rc.critic, actor)  # a fresh critic: the SFT backbone

    banner(f"(1) generate: the actor samples {B} responses with the KV cache")
    seeds = np.arange(B, dtype=np.uint32) + np.uint32(args.seed * 1000)
    gen = jax.jit(partial(phases.rollout, cfg=cfg, sh=sh))
    toks, valid, logp = jax.device_get(gen(actor, prompts_BP, seeds))
    lengths = valid.sum(-1)
    true = tk.scores(prompts_BP, toks, valid, task)
    print(
        f"prompts {shape(prompts_BP)}, responses {shape(toks)}, valid mask {shape(valid)}, "
        f"actor log-probs {shape(logp)} (temperature 1, read during decode)"
    )
    print(
        f"response lengths {lengths.tolist()} of budget {N} ({int(lengths.sum())} tokens; "
        "a newline ends a response)"
    )
    for b in range(B):
        text = bytes(prompts_BP[b].tolist()) + bytes(toks[b][valid[b]].tolist())
        print(f"  [{b}] true {true[b]:.2f}  {text.decode('utf-8', 'backslashreplace')!r}")

    seq = np.concatenate([prompts_BP, toks], 1)
    run = jax.jit(partial(stages, rc=rc, cfg=cfg, sh=sh))
    o = jax.device_get(run(tree, actor, rm, seq, valid, logp, jnp.float32(beta)))
    m = valid.astype(np.float32)

    banner("(2) score: the reward model reads the last valid token")
    print(f"RM scores {shape(o['rm'])}: {vec(o['rm'])}")
    print(
        f"rank by RM {np.argsort(-o['rm']).tolist()}, by true score "
        f"{np.argsort(-true, kind='stable').tolist()}"
    )

    banner("(3) reference log-probs and per-token KL")
    print(f"reference log-probs {shape(o['ref_logp'])}, KL per token {shape(o['k1'])}")
    mean_k1 = float(np.mean((o["k1"] * m).sum(-1) / np.maximum(lengths, 1)))
    print(
        f"mean KL (the seed's: per-token mean, then over responses): k1 {mean_k1:+.2e}, "
        f"k3 {float(np.mean(o['k3'].sum(-1) / np.maximum(lengths, 1))):.2e}"
    )
    print(
        f"max |k1| over tokens {np.abs(o['k1']).max():.1e}. At the first step the actor IS the "
        "reference,\n  so the KL is rounding (KV-cached decode vs full forward); the seed's "
        "mean KL 0.1520 is random placeholders"
    )

    banner("(4) critic values")
    print(
        f"values {shape(o['values'])}: mean {float(rw.masked_mean(o['values'], m)):+.4f}, max "
        f"|V| {np.abs(o['values']).max():.1e}: a fresh value head is zeros, so V = 0 until "
        "the PPO epochs train it"
    )

    banner(f"(5) per-token rewards: -beta*KL (beta {beta:g}), + RM score at the last token")
    print(f"rewards {shape(o['rewards'])}; row 0 ({lengths[0]} tokens):")
    print("  " + vec(o["rewards"][0][: lengths[0]], "+.4f"))
    for b in range(B):
        print(
            f"  [{b}] final token reward {o['rewards'][b, lengths[b] - 1]:+.3f} "
            f"(score={o['rm'][b]:+.3f}, kl_penalty included)"
        )

    banner(f"(6) GAE (gamma {rc.gamma:g}, lambda {rc.lam:g}), advantages and returns")
    print(f"advantages {shape(o['adv'])}, returns {shape(o['ret'])} = values + advantages")
    means = lambda a: (a * m).sum(-1) / np.maximum(lengths, 1)  # noqa: E731
    stds = lambda a: np.sqrt((np.square(a - means(a)[:, None]) * m).sum(-1) / lengths)  # noqa: E731
    print(f"raw advantages: row means {vec(means(o['adv']))}")
    r, bt = o["adv_response"], o["adv_batch"]
    print(
        f"whitened per response (the seed's): row means {vec(means(r), '+.4f')} "
        f"row stds {vec(stds(r), '.3f')}"
    )
    print(f"whitened per batch (the lab's default): row means {vec(means(bt), '+.4f')}")
    print(
        "  per response, every row has mean 0, so the loss cannot favour one response over "
        "another;\n  per batch keeps the differences between responses"
    )
    diff = np.abs(o["phase"]["adv"] - r).max()
    print(f"the library's score phase (phases.score, whiten=response): max |difference| {diff:.1e}")

    banner("(7) PPO losses before any update (the seed's placeholder: ratio 1)")
    L, lr_ = o["loss"], (o["new_logp"] - logp) * m
    print(
        f"ratio = exp(new - old log-probs): max |log ratio| {np.abs(lr_).max():.1e} "
        "(the training forward vs the cached decode)"
    )
    print(f"clip fraction {float(L['clip_frac']):.4f}")
    print(
        f"policy loss {float(L['policy_loss']):+.6f} (= -mean(whitened A) "
        f"{-float(rw.masked_mean(r, m)):+.6f})"
    )
    mse_ret = float(rw.masked_mean(np.square(o["values"] - o["ret"]), m))
    mse_rew = float(rw.masked_mean(np.square(o["values"] - o["rewards"]), m))
    print(
        f"value loss mean((V - returns)^2) {mse_ret:.4f}, the right target (the GAE return, "
        f"V + A; phases.loss: 0.5 x it = {float(L['value_loss']):.4f})"
    )
    print(
        f"value loss mean((V - rewards)^2) {mse_rew:.4f}, the seed's target. It is wrong: a "
        "per-token reward leaves\n  out the future, so V would learn the RM score on the "
        "last token only"
    )

    banner("(8) one PPO update on this batch (which the seed never makes)")
    batch = dict(o["phase"], adv=o["adv_batch"])  # the library's default whitening
    opt = phases.optimizer(rc).init(tree)
    train = phases.Train(jax.jit(partial(phases.update, rc=rc, cfg=cfg, sh=sh)), rc)
    new, _, tm = train(tree, opt, batch, beta)
    new_lp = (
        np.asarray(
            jax.jit(lambda a, s: models.response_logits_logp(a, s, P, cfg)[0])(new["actor"], seq)
        )
        * m
    )
    ratio = np.exp(new_lp - logp)[valid]
    k1 = (new_lp - o["ref_logp"]) * m
    print(
        f"{rc.epochs} epochs x {rc.minibatches} minibatches of {B // rc.minibatches}: mean "
        f"policy loss {float(tm['policy_loss']):+.4f}, value loss {float(tm['value_loss']):.4f}, "
        f"clip fraction {float(tm['clip_frac']):.3f}"
    )
    print(
        f"after: ratio in [{ratio.min():.3f}, {ratio.max():.3f}], clipped (|ratio-1| > "
        f"{rc.clip_eps:g}) {np.mean(np.abs(ratio - 1) > rc.clip_eps):.3f}; KL to the reference "
        f"per response (k1 sums) {vec(k1.sum(-1))}"
    )
    print(
        f"  {rc.epochs * rc.minibatches} Adam steps on {B} responses fit them: the clip zeroes a "
        "token's gradient past 1 +- eps,\n  but the shared weights keep moving (the lab's "
        f"iterations use {rc.rows} responses)"
    )

    logits = lambda a, s: models.lm_logits(a, models.hidden(a, s, cfg)[:, P - 1 : -1], cfg)  # noqa: E731
    seed_shapes = (
        ("prompts", "(4, 64)", shape(prompts_BP)),
        ("generated tokens", "(4, 128)", shape(toks)),
        ("actor logits", "(4, 128, 50257)", shape(jax.eval_shape(logits, actor, seq))),
        ("old / reference log probs", "(4, 128)", shape(o["ref_logp"])),
        ("scores", "[0.73, 0.45, 0.91, 0.62]", vec(o["rm"], ".2f")),
        ("mean KL", "0.23", f"{mean_k1:.2e}"),
        ("total rewards", "[0.50, 0.28, 0.75, 0.41]", vec(o["rewards"].sum(-1), ".2f")),
        ("values, GAE advantages", "(4, 128)", shape(o["adv"])),
        ("actor loss", "-0.042", f"{float(L['policy_loss']):+.3f}"),
        ("critic loss", "0.156", f"{float(L['value_loss']):.3f}"),
    )
    print("\nthe seed page's example vs this step (vocab 256: byte tokens):")
    print(grid(["", "seed page", "here"], seed_shapes))
    return rc, o, new_lp, lengths


def try_it_1(cfg, rc: RLHFConfig, P: int, B: int = 4, N: int = 100) -> None:
    banner(f"Try It 1: data flow for {B} prompts, max response {N}")
    S, M, G, K = P + N, rc.minibatches, cfg.n_kv_heads, cfg.head_dim
    sep = rc.critic == "separate"
    print(
        grid(
            ["tensor", "shape"],
            [
                ["prompts", f"[{B}, {P}]"],
                ["responses, valid mask, old log-probs", f"[{B}, {N}]"],
                ["actor logits per decode step", f"[{B}, {cfg.vocab}]"],
                ["KV cache (K and V, per layer)", f"2 x {cfg.n_layers} x [{B}, {S}, {G}, {K}]"],
                ["RM score", f"[{B}]"],
                ["ref log-probs, KL, values, rewards, advantages, returns", f"[{B}, {N}]"],
                ["PPO minibatch (prompt + response)", f"[{B // M}, {S}]"],
            ],
        )
    )
    crit = "critic" if sep else "actor backbone + value head (shared critic)"
    print(
        grid(
            ["model", "passes per RLHF step", "each over"],
            [
                ["actor (generate)", f"1 prefill + {N} decode steps", f"[{B}, {P}], then [{B}, 1]"],
                ["reference", "1 forward", f"[{B}, {S}]"],
                ["reward model", "1 forward (read at the last valid token)", f"[{B}, {S}]"],
                [crit, "1 forward", f"[{B}, {S}]"],
                [
                    "actor (train)",
                    f"{M} fwd+bwd per epoch, {rc.epochs * M} per step",
                    f"[{B // M}, {S}]",
                ],
                [
                    "critic (train)",
                    f"{M} fwd+bwd per epoch, {rc.epochs * M} per step"
                    if sep
                    else "shares the actor's forward",
                    f"[{B // M}, {S}]",
                ],
            ],
        )
    )
    print(
        f"the decode loop is a scan of exactly {N} steps: a row that has stopped at its newline "
        "keeps stepping, masked (static shapes)"
    )
    print(
        "communication on fsdp=8: every forward all-gathers each layer's weights, every backward "
        "reduce-scatters\n  the gradients, and once per iteration the actor is resharded "
        "to the generation layout"
    )


def sweep(args, cfg, actor, rm, train_p, held_p, task) -> None:
    base = RLHFConfig(iterations=args.iterations, seed=args.seed)
    fixed = {f"beta {b:g} fixed": base.replace(beta=b, kl_target=0.0) for b in BIG_BETAS}
    runs = {
        "beta 0 (no KL)": base.replace(beta=0.0, kl_target=0.0),
        f"adaptive (beta {base.beta:g}, target {base.kl_target:g})": base,
        **fixed,
    }
    banner(
        f"Try It 2: the KL coefficient, {args.iterations} iterations x {base.rows} responses "
        "on fsdp=8"
    )
    hist, rows, ends, held = {}, [], {}, {}
    for label, rc in runs.items():
        res = rlhf_run.iterate(
            rlhf_run.build(rc, cfg, actor, rm, "fsdp=8", task), train_p, held_p, task
        )
        h = hist[label] = res.history
        k = min(5, len(h))
        first, last = (
            {key: np.mean([r[key] for r in part]) for key in SWEEP_KEYS} for part in (h[:k], h[-k:])
        )
        ends[label], held[label] = (first, last), res.final_true
        rows.append(
            [
                label,
                *(f"{first[key]:.3f} -> {last[key]:.3f}" for key in SWEEP_KEYS),
                f"{res.initial_true:.3f} -> {res.final_true:.3f}",
            ]
        )
        print(f"  {label}: done", flush=True)
    print(f"first {k} -> last {k} iterations (means):")
    print(grid(["run", *SWEEP_KEYS, "held-out true"], rows))
    print(f"wrote {rlhf_report.plot(hist, Path(args.out) / 'rlhf_beta_sweep.png')}")
    print(
        "the seed: beta = 0 gives reward hacking (degenerate text the RM likes); beta = 10: "
        "the policy\n  barely moves; tune beta to a KL target (the adaptive controller). "
        "Here:"
    )
    for label, (f, la) in ends.items():
        print(
            f"  {label}: KL {la['kl']:.2f} nats per response; change over the run: RM score "
            f"{la['rm_score'] - f['rm_score']:+.2f}, true score "
            f"{la['true_score'] - f['true_score']:+.3f}, parse rate "
            f"{la['parses_rate'] - f['parses_rate']:+.3f}, length "
            f"{la['length'] - f['length']:+.1f}"
        )
    best = max(held, key=held.get)
    print(
        f"  largest KL: {max(ends, key=lambda lab: ends[lab][1]['kl'])}; best held-out true "
        f"score: {best} ({held[best]:.3f})"
    )


def shaping_table(o, new_lp, lengths, beta: float) -> None:
    banner("calc reward on a real response: row 0, the updated actor vs the reference")
    n = int(lengths[0])
    actor_lps, ref_lps = new_lp[0, :n].tolist(), o["ref_logp"][0, :n].tolist()
    out = calc_reward.compute_rewards(actor_lps, ref_lps, float(o["rm"][0]), beta)
    k3 = calc_reward.compute_rewards(actor_lps, ref_lps, float(o["rm"][0]), beta, estimator="k3")
    cols = zip(actor_lps, ref_lps, out.kl, out.penalties, out.rm, out.rewards, strict=True)
    rows = [
        [t, f"{a:+.3f}", f"{r:+.3f}", f"{k:+.4f}", f"{p:+.4f}", f"{m:+.4f}", f"{x:+.4f}"]
        for t, (a, r, k, p, m, x) in enumerate(cols)
    ]
    rows.append(
        [
            "Total",
            "-",
            "-",
            f"{out.total_kl:+.4f}",
            f"{out.penalty:+.4f}",
            f"{sum(out.rm):+.4f}",
            f"{out.net:+.4f}",
        ]
    )
    print(f"beta {beta:g}, RM score {out.rm_score:+.4f} at the last token, {n} tokens")
    print(grid(["Token", "actor lp", "ref lp", "KL (k1)", "penalty beta*KL", "RM", "Reward"], rows))
    print(
        f"net reward {out.net:+.4f} = RM - beta*sum k1 "
        f"({calc_reward.effect(out.rm_score, out.penalty)}); with k3 (>= 0 per token): sum KL "
        f"{k3.total_kl:.4f}, net {k3.net:+.4f}"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_stage_flags(p)
    p.add_argument("--iterations", type=positive_int, default=40, help="RLHF iterations per run")
    p.add_argument("--random", action="store_true", help="a random tiny model (fast)")
    p.add_argument("--no-sweep", dest="sweep", action="store_false", help="skip the beta sweep")
    p.add_argument("--seed", type=int, default=0, help="seed of prompts and rollouts")
    p.add_argument("--out", default="results", help="directory for the PNG")
    args = p.parse_args()
    task = tk.TaskConfig()
    if args.random:
        cfg = RANDOM_CFG
        actor, rm = rlhf_setup.random_models(cfg, args.seed)
        train_p, held_p = tk.load_prompts(task)
        print(f"random tiny model {cfg.d_model}x{cfg.n_layers} (--random), random reward head")
    else:
        cfg, actor, rm, _, train_p, held_p = rlhf_setup.prepare(
            args.runs, task, args.sft_steps, args.rm_steps, say=print
        )
    pick = np.random.default_rng(args.seed).choice(len(train_p), 4, replace=False)
    rc, o, new_lp, lengths = flow(cfg, actor, rm, train_p[pick].astype(np.int32), args, task)
    try_it_1(cfg, rc, task.prompt_len)
    if args.sweep:
        sweep(args, cfg, actor, rm, train_p, held_p, task)
    shaping_table(o, new_lp, lengths, rc.beta)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
