"""`jaxscale bench serve`'s decoding rows: speculative decoding and structured outputs, on and off,
in the engine in process (the bench's model and slots; greedy requests).

Speculative (`serve --draft-ckpt D --speculative-tokens k`): the same requests with no draft,
then with drafts of three qualities -- the target itself (every draft accepted: the ceiling,
k + 1 tokens per target pass), the target's first half of layers under its own embedding and
head (a LayerSkip-style self-draft), and a random one-layer model (the floor: almost never
right). Per row: generated tokens/s, the acceptance rate, tokens per target pass measured and
the closed form (1 - g^(k+1)) / (1 - g) at the measured per-token acceptance g (Leviathan et
al. 2023; `simulate speculative`), and whether the outputs equal the run without a draft (they
must: greedy). On two CPU cores every model shares the same cores, so tokens/s shows the
bookkeeping as much as the saving; the passes are the result.

Structured (`response_format` json_object): the same requests free and under the JSON
automaton, whose mask the host computes before every token (and, while one runs, reads each
step before scheduling the next): engine seconds per generated token with and without, and the
share of outputs that parse.
"""

from __future__ import annotations

import json
import time

import jax

from jaxscale.bench.serve_setup import engine
from jaxscale.serve.sampling import SamplingParams
from jaxscale.sim.speculative import expected_tokens_per_pass

GREEDY = SamplingParams(0.0)
K = 4  # drafts per round


def _timed(eng, requests) -> tuple[dict, float]:
    eng.warmup()
    t0 = time.perf_counter()
    done = eng.run(requests)
    return done, time.perf_counter() - t0


def half_layers(params, cfg):
    """The target's first half of layers with its own embedding, final norm and head: (params,
    cfg) of a self-draft."""
    n = max(1, cfg.n_layers // 2)
    blocks = jax.tree.map(lambda x: x[:n], params["blocks"])
    return {**params, "blocks": blocks}, cfg.replace(n_layers=n)


def speculative(setup, params, prompts) -> list[dict]:
    """One row per draft (none first)."""
    from jaxscale.model import state as ms
    from jaxscale.serve.scheduler import Request

    cfg = setup.cfg
    small = cfg.replace(n_layers=1, d_model=32, d_ff=64, n_heads=2, n_kv_heads=1)
    drafts = {
        "none": None,
        "the target itself": (params, cfg),
        f"first {max(1, cfg.n_layers // 2)} of {cfg.n_layers} layers": half_layers(params, cfg),
        "random 1-layer": (ms.init_params(small, 1), small),
    }
    rows, want = [], None
    for name, draft in drafts.items():
        eng = engine(setup, params, draft=draft, k=K)
        reqs = [Request(f"r{i}", p, setup.max_new, GREEDY) for i, p in enumerate(prompts)]
        done, seconds = _timed(eng, reqs)
        outs = [done[r.id].out for r in reqs]
        want = want or outs
        s = eng.spec
        rows.append(
            {
                "draft": name,
                "tokens_per_s": sum(map(len, outs)) / seconds,
                "acceptance": s.acceptance,
                "gamma": s.gamma,
                "tokens_per_pass": s.tokens_per_pass if draft else 1.0,
                "predicted_per_pass": expected_tokens_per_pass(s.gamma, K) if draft else 1.0,
                "same_output": outs == want,
            }
        )
    return rows


def structured(setup, params, prompts) -> dict:
    """Engine seconds per generated token, free and under the JSON automaton."""
    from jaxscale.serve.constrained import JsonConstraint
    from jaxscale.serve.scheduler import Request

    out = {}
    for name, constraint in (("free", None), ("json_object", JsonConstraint)):
        reqs = [
            Request(f"r{i}", p, setup.max_new, GREEDY, constraint=constraint and constraint())
            for i, p in enumerate(prompts)
        ]
        done, seconds = _timed(engine(setup, params), reqs)
        tokens = sum(len(r.out) for r in done.values())
        out[name] = {"s_per_token": seconds / tokens, "tokens": tokens}
        if constraint:
            out[name]["parsed"] = sum(_parses(r.out) for r in done.values()) / len(done)
    out["host_ms_per_token"] = 1e3 * (
        out["json_object"]["s_per_token"] - out["free"]["s_per_token"]
    )
    return out


def _parses(tokens: list[int]) -> bool:
    try:
        json.loads(bytes(tokens).decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    return True


def run(setup, params, prompts, progress=None) -> dict:
    res = {"speculative": speculative(setup, params, prompts), "k": K}
    if progress:
        progress.update(1, note="speculative")
    res["structured"] = structured(setup, params, prompts)
    if progress:
        progress.update(1, note="structured")
    return res


def format_rows(res: dict) -> str:
    lines = [
        f"speculative decoding, k = {res['k']} (greedy; tokens per target pass measured / "
        "closed form at the measured per-token acceptance g)",
        f"  {'draft':<22} {'tok/s':>7} {'accepted':>9} {'per pass':>14}  same output",
    ]
    for r in res["speculative"]:
        per = f"{r['tokens_per_pass']:.2f}/{r['predicted_per_pass']:.2f}"
        same = "yes" if r["same_output"] else "NO"
        lines.append(
            f"  {r['draft']:<22} {r['tokens_per_s']:>7.0f} {r['acceptance']:>9.1%} {per:>14}  "
            f"{same}"
        )
    s = res["structured"]
    lines += [
        "",
        f"structured outputs (response_format json_object): "
        f"{1e3 * s['free']['s_per_token']:.2f} ms per token free, "
        f"{1e3 * s['json_object']['s_per_token']:.2f} under the JSON automaton "
        f"({s['host_ms_per_token']:+.2f} ms: the host's mask and the read before each step); "
        f"{s['json_object']['parsed']:.0%} of the outputs parse",
    ]
    return "\n".join(lines)
