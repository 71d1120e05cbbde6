"""`jaxscale serve`: the OpenAI-compatible server on a trained checkpoint (or a random tiny model,
with a warning)."""

from __future__ import annotations

import sys

from jaxscale.cliutil import guarded, positive_int


def add_parser(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server (completions, streaming) on the continuous-batching "
        "engine",
        description="Serve a model trained by `jaxscale train` over an OpenAI-compatible API: "
        "POST /v1/completions (stream or not), GET /v1/models, GET /health. Continuous batching "
        "over a paged KV cache with a radix prefix cache (jaxscale/serve/).",
        epilog="example:\n  jaxscale train --out runs/a --steps 300\n  jaxscale serve "
        "--ckpt-dir runs/a/checkpoints --port 8000\n  curl localhost:8000/v1/completions -H "
        '\'Content-Type: application/json\' -d \'{"model": "jaxscale", "prompt": "def ", '
        '"max_tokens": 32}\'',
    )
    p.add_argument(
        "--ckpt-dir",
        default=None,
        help="checkpoint directory of a `jaxscale train` run, or its --out "
        "(default: a random tiny model, which prints noise)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=positive_int, default=8000, help="port (default 8000)")
    p.add_argument("--model-name", default="jaxscale", help="the model id clients ask for")
    p.add_argument("--max-num-seqs", type=positive_int, default=8, help="requests running at once")
    p.add_argument(
        "--max-num-batched-tokens",
        type=positive_int,
        default=64,
        help="tokens fed per engine step (decode + prefill chunks)",
    )
    p.add_argument("--page-size", type=positive_int, default=16, help="KV page size in tokens")
    p.add_argument("--n-pages", type=positive_int, default=256, help="pages in the KV pool")
    p.add_argument("--no-prefix-cache", action="store_true", help="turn the radix cache off")
    p.set_defaults(func=main)


def main(args) -> int:
    from jaxscale.train.checkpoint import CheckpointError

    return guarded(_main, CheckpointError)(args)  # bad input: one line and exit 2


def _main(args) -> int:
    import uvicorn

    from jaxscale.serve.engine import Engine, EngineConfig
    from jaxscale.serve.server import make_app
    from jaxscale.train.checkpoint import load_model

    cfg, params = load_model(args.ckpt_dir)
    ecfg = EngineConfig(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        page_size=args.page_size,
        n_pages=args.n_pages,
        prefix_cache=not args.no_prefix_cache,
    )
    if cfg.n_experts:
        raise ValueError("serving an MoE model is not implemented (its cached decode)")
    engine = Engine(params, cfg, ecfg)
    print(
        f"serving {args.model_name} (d_model {cfg.d_model}, {cfg.n_layers} layers, context "
        f"{cfg.max_seq}) on http://{args.host}:{args.port}/v1",
        file=sys.stderr,
    )
    uvicorn.run(
        make_app(engine, args.model_name), host=args.host, port=args.port, log_level="warning"
    )
    return 0
