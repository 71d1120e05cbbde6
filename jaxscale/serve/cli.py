"""`jaxscale serve`: the OpenAI-compatible server on a trained checkpoint (or a random tiny model,
with a warning)."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import threading
import time
from functools import partial

from jaxscale.cliutil import add_command, guarded, positive_int, writable_dir


def port(text: str) -> int:
    """A TCP port a server can listen on: 1..65535."""
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a port in 1..65535, got {text!r}")
    return value


def model_name(text: str) -> str:
    """The id clients ask for: printable, no spaces, not empty."""
    if not text or not text.isprintable() or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(
            f"must be a non-empty name without spaces (what clients send as 'model'), got {text!r}"
        )
    return text


def add_parser(sub) -> None:
    p = add_command(
        sub,
        "serve",
        help="OpenAI-compatible HTTP server (completions, streaming) on the continuous-batching "
        "engine",
        description="Serve a model trained by `jaxscale train` over an OpenAI-compatible API: "
        "POST /v1/completions (stream or not), GET /v1/models, GET /health. Continuous batching "
        "over a paged KV cache with a radix prefix cache (jaxscale/serve/). The engine's programs "
        "are compiled before the server listens, so the first request does not wait for them.",
        example="jaxscale train --out runs/a --steps 300\n  jaxscale serve "
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
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=port, default=8000, help="TCP port to listen on")
    p.add_argument(
        "--model-name", type=model_name, default="jaxscale", help="the model id clients ask for"
    )
    p.add_argument("--max-num-seqs", type=positive_int, default=8, help="requests running at once")
    p.add_argument(
        "--max-num-batched-tokens",
        type=positive_int,
        default=64,
        help="tokens fed per engine step (decode + prefill chunks)",
    )
    p.add_argument("--page-size", type=positive_int, default=16, help="KV page size in tokens")
    p.add_argument("--n-pages", type=positive_int, default=256, help="pages in the KV pool")
    p.add_argument(
        "--kv-dtype",
        choices=("auto", "int8"),
        default="auto",
        help="the KV pool's storage: auto (the model's compute dtype) or int8 (per token-and-head "
        "scales: about half the bytes of bf16 per token)",
    )
    p.add_argument("--no-prefix-cache", action="store_true", help="turn the radix cache off")
    p.add_argument(
        "--mesh",
        default=None,
        help="tensor-parallel decode over the first N devices, e.g. tp=2: heads and MLP over "
        "`tensor`, the KV pages split by kv head; dp=R: R replicas behind one server, each on "
        "its own devices with its own KV pool, requests to the least loaded, e.g. dp=2,tp=2; "
        "ep=N for an MoE checkpoint: each device holds E/N experts, their outputs summed over "
        "`expert` (default: one device)",
    )
    p.add_argument(
        "--draft-ckpt",
        default=None,
        metavar="DIR",
        help="speculative decoding: a smaller model's training checkpoint (the same byte "
        "vocabulary) drafts tokens that the served model verifies in one pass; greedy output "
        "is the served model's own, sampled output keeps its distribution",
    )
    p.add_argument(
        "--speculative-tokens",
        type=positive_int,
        default=None,
        metavar="K",
        help="tokens the draft proposes per round (default 4 with --draft-ckpt)",
    )
    p.add_argument(
        "--profile",
        type=writable_dir,
        default=None,
        metavar="DIR",
        help="trace the engine's first busy steps after the first (every program: prefills "
        "and decodes) into DIR and print their compute / collective / idle split",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check every flag, load the checkpoints, place them on the mesh and bind the port, "
        "then say what would be served and exit: nothing compiles, nothing is served",
    )
    p.add_argument(
        "--profile-steps",
        type=positive_int,
        default=20,
        metavar="N",
        help="engine steps the --profile trace holds (default 20)",
    )
    p.set_defaults(func=main)


def main(args) -> int:
    from jaxscale.train.checkpoint import CheckpointError

    return guarded(_main, CheckpointError)(args)  # bad input: one line and exit 2


def _main(args) -> int:
    with _exit_on_signal():
        return _start_and_serve(args)


def _start_and_serve(args) -> int:
    import jax
    import uvicorn  # noqa: F401  (the serve extra: if missing, this fails before compiling)

    from jaxscale.serve.engine import Engine, EngineConfig
    from jaxscale.serve.replicas import replica_meshes
    from jaxscale.serve.server import make_app
    from jaxscale.train.checkpoint import load_model

    if args.speculative_tokens and not args.draft_ckpt:  # before any checkpoint is read
        raise ValueError("--speculative-tokens needs a draft model: --draft-ckpt DIR")
    cfg, params = load_model(args.ckpt_dir)
    draft = {}
    if args.draft_ckpt:
        draft_cfg, draft_params = load_model(args.draft_ckpt, "--draft-ckpt")
        draft = {"draft_params": draft_params, "draft_cfg": draft_cfg}
    ecfg = EngineConfig(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        page_size=args.page_size,
        n_pages=args.n_pages,
        prefix_cache=not args.no_prefix_cache,
        kv_dtype=None if args.kv_dtype == "auto" else args.kv_dtype,
        speculative_tokens=(args.speculative_tokens or 4) if draft else 0,
    )
    # the address first: a port in use is one line and exit 2, before anything compiles
    sock = _listen(args.host, args.port)
    meshes = replica_meshes(args.mesh, jax.devices())
    engines = [Engine(params, cfg, ecfg, mesh=m, **draft) for m in meshes]
    if args.dry_run:
        sock.close()
        spec = ""
        if draft:
            spec = f", draft {draft['draft_cfg'].n_layers} layers, k={ecfg.speculative_tokens}"
        print(
            f"dry run: would serve {args.model_name} (d_model {cfg.d_model}, {cfg.n_layers} "
            f"layers, context {cfg.max_seq}{spec}) on "
            f"{len(engines)} engine(s) at http://{args.host}:{args.port}/v1; all checks passed"
        )
        return 0
    t0 = time.perf_counter()
    shapes = sum(e.warmup() for e in engines)  # every program the engines step with, compiled
    seconds = time.perf_counter() - t0
    pool_mib = sum(x.nbytes for x in engines[0].pool.values()) / 2**20
    dtype = engines[0].pool["k"].dtype.name
    where = f"{len(engines)} replicas, " if len(engines) > 1 else ""
    print(
        f"serving {args.model_name} (d_model {cfg.d_model}, {cfg.n_layers} layers, context "
        f"{cfg.max_seq}; {where}KV pool {args.n_pages} pages x {args.page_size} tokens, "
        f"{dtype}, {pool_mib:.1f} MiB{' each' if where else ''}; {shapes} step shapes compiled "
        f"in {seconds:.1f} s) on http://{args.host}:{args.port}/v1",
        file=sys.stderr,
    )
    profile = None
    if args.profile:
        from jaxscale.profiling import StepWindow

        profile = StepWindow(args.profile, args.profile_steps, partial(print, file=sys.stderr))
    _serve(make_app(engines, args.model_name, profile), sock)
    return 0


def _serve(app, sock: socket.socket) -> None:
    """uvicorn serving `app` on `sock` until Ctrl-C or SIGTERM (a graceful stop: open requests
    finish, then the process returns, exit 0); a second signal while it waits ends the process at
    once."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            if self.should_exit:  # the second: uvicorn's own forced exit would cancel the
                # app's lifespan mid-shutdown and log its CancelledError as a traceback
                sys.stderr.flush()
                os._exit(128 + sig)
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):
            # uvicorn's own restores the handlers it found and raises the signal it stopped on
            # again: a stop is a normal end here, and the start-up's handler (exit 130) is gone
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, self.handle_exit)
            yield
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            # the server is down; a further Ctrl-C while the interpreter cleans up ends the
            # process at once instead of printing a traceback from jax's exit handler
            signal.signal(signal.SIGINT, lambda *_: os._exit(130))

    Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


@contextlib.contextmanager
def _exit_on_signal():
    """Ctrl-C or SIGTERM while the server starts (checkpoints loading, programs compiling,
    uvicorn starting): nothing is served and nothing is kept, so the process ends at once with
    130. A KeyboardInterrupt raised into a compile or into uvicorn's start-up could crash it or
    leave it hanging. Serving (`_serve`) takes the signals over; the handlers found are back if
    the command returns without serving (--dry-run, a refused flag)."""
    if threading.current_thread() is not threading.main_thread():  # handlers: main thread only
        yield
        return

    def interrupted(signum, frame):
        print("\njaxscale serve: interrupted while starting", file=sys.stderr, flush=True)
        os._exit(130)

    previous = {sig: signal.signal(sig, interrupted) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if signal.getsignal(sig) is interrupted:  # not taken over by the server
                signal.signal(sig, handler)


def _listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound and listening; ValueError (one line, exit 2) if it cannot be."""
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise ValueError(f"--host {host}: {e.strerror}") from None
    sock = socket.socket(info[0], socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(info[4])
    except OSError as e:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock
